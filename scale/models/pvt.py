"""PvT [Wang et al. 2021] as EsViT Table 4 uses it: 4 stages of patch embedding (conv, kernel = stride 4-2-2-2,
LayerNorm) and blocks with spatial-reduction attention (keys and values from the map reduced by a stride-R_i
convolution + LayerNorm, R = 8-4-2-1), MLP ratios 8-8-4-4; EsViT's changes (Appendix A.2): relative position bias
instead of the absolute position embeddings, no class token (the pooled feature is the mean of the last grid).

Depths: PvT-Small's 3-4-6-3 (not 2-2-6-2). EsViT says every architecture of Table 4 is made 2-2-6-2, but no PvT
config was released and PvT-Small's widths at 2-2-6-2 give 18.9M parameters, whereas Table 4 lists 24M: exactly
PvT-Small (23.6M here; 24.5M in the PvT paper with its position embeddings and classifier). `SIZES["tiny_2262"]`
(`pvt_tiny_2262`) is the literal 2-2-6-2 reading, for comparison.
"""

from scale.models.registry import register
from scale.models.staged import Block, ConvEmbed, MapAttention, Stage, StagedBackbone, check_fixed_options, plan_stages

PATCHES = (4, 2, 2, 2)
# name: dims, depths, heads, MLP ratios, spatial-reduction ratios
SIZES = {
    "tiny": ((64, 128, 320, 512), (3, 4, 6, 3), (1, 2, 5, 8), (8, 8, 4, 4), (8, 4, 2, 1)),
    "tiny_2262": ((64, 128, 320, 512), (2, 2, 6, 2), (1, 2, 5, 8), (8, 8, 4, 4), (8, 4, 2, 1)),
    "nano": ((16, 32, 64), (1, 1, 1), (1, 2, 4), (4, 4, 4), (4, 2, 1)),  # tests and smoke runs (3 stages)
}


class PvT(StagedBackbone):
    def __init__(self, *, dims, depths, heads, mlp_ratios, sr_ratios, img_size: int, drop_path: float):
        stages = []
        plans = plan_stages(img_size, dims, depths, PATCHES, drop_path, "PvT")
        for (in_dim, dim, patch, table, rates), num_heads, mlp, sr in zip(plans, heads, mlp_ratios, sr_ratios):
            blocks = [Block(dim, MapAttention(dim, num_heads, table, sr=sr), mlp, rate, eps=1e-6) for rate in rates]
            stages.append(Stage(ConvEmbed(in_dim, dim, patch, patch), blocks))
        super().__init__(stages, eps=1e-6)
        self.init_weights()


def _pvt_factory(size: str):
    dims, depths, heads, mlp_ratios, sr_ratios = SIZES[size]

    def build(cfg, drop_path: float) -> PvT:
        check_fixed_options(cfg, "PvT", PATCHES[0])
        return PvT(
            dims=dims,
            depths=depths,
            heads=heads,
            mlp_ratios=mlp_ratios,
            sr_ratios=sr_ratios,
            img_size=cfg.img_size,
            drop_path=drop_path,
        )

    return build


for _size in SIZES:
    register(f"pvt_{_size}")(_pvt_factory(_size))
