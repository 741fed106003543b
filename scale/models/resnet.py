"""ResNet backbones (timm) exposing the layer4 grid for EsViT's region loss and DRLoc."""

import torch
from timm.models.resnet import BasicBlock, Bottleneck, ResNet
from torch import nn

from scale.errors import UserError
from scale.models.registry import register


class ResNetBackbone(ResNet):
    def __init__(self, *, block, layers, drop_path: float, channels=(64, 128, 256, 512), stem_width: int = 64):
        # zero_init_last: the last BN of every residual branch starts at zero (timm's default, as MoCo v3's R50)
        super().__init__(
            block=block,
            layers=layers,
            channels=channels,
            stem_width=stem_width,
            num_classes=0,
            global_pool="",
            drop_path_rate=drop_path,
        )
        self.embed_dim = self.token_dim = self.num_features

    def init_weights(self, zero_init_last: bool = True) -> None:
        """Reset every parameter and BN statistic, then timm's ResNet init; valid after `to_empty` from meta."""
        for module in self.modules():
            if module is not self and hasattr(module, "reset_parameters"):
                module.reset_parameters()
        super().init_weights(zero_init_last=zero_init_last)

    def _stages(self) -> list[nn.Sequential]:
        return [self.layer1, self.layer2, self.layer3, self.layer4]

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return self.maxpool(self.act1(self.bn1(self.conv1(x))))

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        x = self.forward_features(x)
        batch, channels, height, width = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        return {"pooled": tokens.mean(dim=1), "tokens": tokens, "grid": (int(height), int(width))}

    def block_modules(self) -> list[nn.Module]:
        return [block for stage in self._stages() for block in stage]

    def forward_last_blocks(self, x: torch.Tensor, n: int) -> list[torch.Tensor]:
        """Average-pooled outputs of the last n residual blocks."""
        total = len(self.block_modules())
        if not 1 <= n <= total:
            raise UserError(f"linear probe: n_last_blocks {n} must be between 1 and the model's {total} blocks")
        x = self._stem(x)
        outputs = []
        for stage in self._stages():
            for block in stage:
                x = block(x)
                outputs.append(x)
        return [out.mean(dim=(2, 3)) for out in outputs[-n:]]


@register("resnet50")
def resnet50(cfg, drop_path: float) -> ResNetBackbone:
    return ResNetBackbone(block=Bottleneck, layers=(3, 4, 6, 3), drop_path=drop_path)


@register("resnet_nano")
def resnet_nano(cfg, drop_path: float) -> ResNetBackbone:
    """A 4-stage BasicBlock ResNet with 16-128 channels: tests and the CPU demo."""
    return ResNetBackbone(
        block=BasicBlock, layers=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16, drop_path=drop_path
    )
