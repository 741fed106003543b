"""Position embeddings of the ViT family: bicubic resizing of learned ones (DINO) and fixed 2-D sin-cos (MoCo v3)."""

import torch
import torch.nn.functional as F


def resize_grid_embed(grid_embed: torch.Tensor, old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """[1, old_h*old_w, D] patch embeddings resized bicubically to [1, new_h*new_w, D].

    DINO's `interpolate_pos_encoding` (bicubic, align_corners=False, no antialias), with the target size given
    explicitly rather than as a scale factor (DINO's +0.1 work-around, later replaced the same way in DINOv2).
    """
    if tuple(old) == tuple(new):
        return grid_embed
    dim = grid_embed.shape[-1]
    grid = grid_embed.reshape(1, old[0], old[1], dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.float(), size=tuple(new), mode="bicubic", align_corners=False)
    return grid.to(grid_embed.dtype).permute(0, 2, 3, 1).reshape(1, new[0] * new[1], dim)


def sincos_2d(h: int, w: int, dim: int, temperature: float = 10000.0, device=None) -> torch.Tensor:
    """MoCo v3's fixed 2-D sin-cos embedding for an h x w grid, [1, h*w, dim] in row-major token order.

    Token (r, c) gets [sin(r*omega), cos(r*omega), sin(c*omega), cos(c*omega)] with omega_i = T^(-i/(dim/4)).
    MoCo v3 builds it with meshgrid(grid_w, grid_h) in 'ij' order, which puts the row index in the first half;
    on its square grids this is exactly the layout above. Other grid sizes (local crops) get the formula on their
    own integer grid: nothing is learned, so there is nothing to interpolate.
    """
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a dim divisible by 4, got {dim}")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32, device=device) / quarter)
    rows, cols = torch.meshgrid(
        torch.arange(h, dtype=torch.float32, device=device),
        torch.arange(w, dtype=torch.float32, device=device),
        indexing="ij",
    )
    out_r = rows.flatten()[:, None] * omega[None]
    out_c = cols.flatten()[:, None] * omega[None]
    return torch.cat([out_r.sin(), out_r.cos(), out_c.sin(), out_c.cos()], dim=1)[None]
