"""T2T-ViT [Yuan et al. 2021] (DRLoc Tables 2-4): the Tokens-to-Token module, then a ViT backbone.

T2T module (T2T-ViT-14: `tokens_type='performer'`, token dim 64): soft split (unfold 7x7, stride 4, padding 2) ->
Performer token layer (147 -> 64) -> re-structurization to a map -> soft split (3x3, stride 2) -> Performer layer
(576 -> 64) -> soft split (3x3, stride 2) -> linear to the embedding: 224 px give 14x14 tokens (stride 16).
Performer token layer: x = v + proj(linear attention of phi(q), phi(k) with m = emb/2 positive random features
w, orthogonal rows scaled by sqrt(m), not learned); then x + MLP(LN(x)) (width emb, ratio 1). `w` is a buffer,
drawn in `init_weights` (so teacher and student copy it with the state dict).
Backbone (T2T-ViT-14): class token, fixed sinusoid position table (1-D over the tokens, the grid part resized
bicubically for other input sizes, as DINO does for learned ones), 14 blocks of dim 384, 6 heads, MLP ratio 3,
no qkv bias, final LayerNorm. "pooled" is the class token, "tokens" the 14x14 patch tokens (DRLoc pools them to 7x7).
"""

import math

import torch
from timm.models.vision_transformer import Block
from torch import nn

from scale.errors import UserError
from scale.models.pos_embed import resize_grid_embed
from scale.models.registry import register
from scale.models.staged import check_fixed_options, init_transformer

SPLITS = ((7, 4, 2), (3, 2, 1), (3, 2, 1))  # soft splits: kernel, stride, padding
STRIDE = 16


class TokenPerformer(nn.Module):
    def __init__(self, dim: int, emb: int, kernel_ratio: float = 0.5, eps: float = 1e-8):
        super().__init__()
        self.emb, self.features, self.eps = emb, int(emb * kernel_ratio), eps
        self.kqv = nn.Linear(dim, 3 * emb)
        self.proj = nn.Linear(emb, emb)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(emb)
        self.mlp = nn.Sequential(nn.Linear(emb, emb), nn.GELU(), nn.Linear(emb, emb))
        self.register_buffer("w", torch.empty(self.features, emb))

    def draw_features(self) -> None:
        nn.init.orthogonal_(self.w)
        self.w.mul_(math.sqrt(self.features))

    def _phi(self, x: torch.Tensor) -> torch.Tensor:
        """Positive random features exp(w^T x - |x|^2 / 2) / sqrt(m), [B, T, m]."""
        return torch.exp(x.float() @ self.w.t() - x.float().square().sum(-1, keepdim=True) / 2) / math.sqrt(
            self.features
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k, q, v = self.kqv(self.norm1(x)).split(self.emb, dim=-1)
        kp, qp = self._phi(k), self._phi(q)
        normaliser = qp @ kp.sum(dim=1, keepdim=True).transpose(1, 2)  # [B, T, 1]
        y = (qp @ (kp.transpose(1, 2) @ v.float())) / (normaliser + self.eps)
        x = v + self.proj(y.to(v.dtype))
        return x + self.mlp(self.norm2(x))


def sinusoid_table(positions: int, dim: int, device=None) -> torch.Tensor:
    """T2T-ViT's (Transformer's) 1-D table [1, positions, dim]: sin on even, cos on odd channels."""
    pos = torch.arange(positions, dtype=torch.float32, device=device)[:, None]
    rate = 10000.0 ** (2 * (torch.arange(dim, device=device) // 2) / dim)
    angles = pos / rate
    return torch.where(torch.arange(dim, device=device) % 2 == 0, angles.sin(), angles.cos())[None]


class T2TViT(nn.Module):
    def __init__(
        self,
        *,
        embed_dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        token_dim: int,
        img_size: int,
        drop_path: float,
    ):
        super().__init__()
        if img_size % STRIDE:
            raise UserError(f"model.img_size {img_size} must be a multiple of {STRIDE} for T2T-ViT")
        self.splits = nn.ModuleList(nn.Unfold(kernel_size=k, stride=s, padding=p) for k, s, p in SPLITS)
        self.token_layers = nn.ModuleList(
            [TokenPerformer(3 * 7 * 7, token_dim), TokenPerformer(token_dim * 3 * 3, token_dim)]
        )
        self.project = nn.Linear(token_dim * 3 * 3, embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim))
        self.grid_size = (img_size // STRIDE, img_size // STRIDE)
        rates = torch.linspace(0, drop_path, depth, device="cpu").tolist()
        self.blocks = nn.ModuleList(
            Block(embed_dim, num_heads, mlp_ratio, qkv_bias=False, drop_path=rate) for rate in rates
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.embed_dim = self.token_dim = embed_dim
        self.num_prefix_tokens = 1
        self.init_weights()

    def init_weights(self) -> None:
        """T2T-ViT's init (trunc-normal 0.02 Linear and class token, unit LayerNorms) and fresh random features;
        valid after `to_empty`."""
        init_transformer(self)
        for layer in self.token_layers:
            layer.draw_features()

    def _tokens_to_token(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        size = (int(x.shape[-2]), int(x.shape[-1]))
        for index, split in enumerate(self.splits):
            kernel, stride, padding = SPLITS[index]
            size = tuple((s + 2 * padding - kernel) // stride + 1 for s in size)
            x = split(x).transpose(1, 2)  # soft split: [B, tokens, C * k * k]
            if index < len(self.token_layers):
                x = self.token_layers[index](x)
                x = x.transpose(1, 2).reshape(x.shape[0], x.shape[2], *size)  # re-structurization
        return self.project(x), size

    def _embed(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x, grid = self._tokens_to_token(x)
        table = sinusoid_table(1 + self.grid_size[0] * self.grid_size[1], x.shape[-1], x.device).to(x.dtype)
        patches = x + resize_grid_embed(table[:, 1:], self.grid_size, grid)
        cls = self.cls_token.expand(x.shape[0], -1, -1) + table[:, :1]
        return torch.cat([cls, patches], dim=1), grid

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x, grid = self._embed(x)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return {"pooled": x[:, 0], "tokens": x[:, 1:], "grid": grid}

    def block_modules(self) -> list[nn.Module]:
        return list(self.blocks)

    def forward_last_blocks(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Normed class tokens of the last n blocks (DINO's linear probe on ViTs)."""
        if not 1 <= n <= len(self.blocks):
            raise UserError(
                f"linear probe: n_last_blocks {n} must be between 1 and the model's {len(self.blocks)} blocks"
            )
        x, _ = self._embed(x)
        outputs = []
        for index, block in enumerate(self.blocks):
            x = block(x)
            if index >= len(self.blocks) - n:
                outputs.append(self.norm(x)[:, 0])
        return outputs


# name: embed dim, depth, heads, MLP ratio, token dim
SIZES = {
    "14": (384, 14, 6, 3.0, 64),
    "nano": (64, 2, 2, 3.0, 16),  # tests
}


def _t2t_factory(size: str):
    embed_dim, depth, heads, mlp_ratio, token_dim = SIZES[size]

    def build(cfg, drop_path: float) -> T2TViT:
        check_fixed_options(cfg, "T2T-ViT", STRIDE)
        return T2TViT(
            embed_dim=embed_dim,
            depth=depth,
            num_heads=heads,
            mlp_ratio=mlp_ratio,
            token_dim=token_dim,
            img_size=cfg.img_size,
            drop_path=drop_path,
        )

    return build


for _size in SIZES:
    register(f"t2t_vit_{_size}")(_t2t_factory(_size))
