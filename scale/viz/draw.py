"""What `scale viz` draws: the backbones a recipe builds from labelled weights, their attention pictures with the
masks' Jaccard on PASCAL VOC12 (DINO Fig. 1/3/4), and their matched regions (EsViT Fig. 8). scale/commands/viz.py
parses the command line and calls these."""

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Backbones:
    """The backbones a `scale viz` command draws: the recipe's model section builds each, from an exported backbone
    per --weights [LABEL=]FILE and, with `random_init`, at the recipe's seeded random initialisation."""

    recipe: str
    overrides: list
    model: str | None
    weights: list
    random_init: bool

    def load(self, command: str) -> tuple[object, dict]:
        """The recipe and label -> frozen backbone for every --weights (and --random-init)."""
        import torch

        from scale.checkpoint.weights import load_backbone
        from scale.errors import UserError
        from scale.eval.session import build_config

        cfg = build_config(self.recipe, self.overrides, self.model)
        sources = {}
        for entry in self.weights:
            label, _, path = entry.rpartition("=")
            label = label or Path(path).stem
            if label in sources:
                raise UserError(f"--weights: two backbones labelled '{label}'; name them LABEL=FILE")
            sources[label] = path
        if self.random_init:
            sources["random init"] = None
        if not sources:
            raise UserError(f"scale viz {command}: give --weights FILE (repeatable) and/or --random-init")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        backbones = {}
        for label, path in sources.items():
            torch.manual_seed(cfg.train.seed)
            backbones[label] = load_backbone(cfg.model, path, device)
        return cfg, backbones


def attention(
    source: Backbones,
    images: list[str],
    voc_root: str | None,
    split: str,
    max_images: int | None,
    threshold: float,
    image_size: int,
    out: str | None,
    run_dir: str | None,
) -> None:
    """The attention picture of each image (else of the first VOC image) as PNGs, with the VOC Jaccard of every
    backbone's masks when `voc_root` is given; the result JSON to `out`/attention.json, else to `run_dir`/eval/."""
    from scale.errors import UserError
    from scale.eval.images import patch_size, read_rgb, to_input
    from scale.evaluate import result_path
    from scale.loop.rundir import write_json
    from scale.viz import voc
    from scale.viz.attention import check_keep, check_vit
    from scale.viz.figures import attention_picture

    check_keep(threshold)
    samples = voc.read_voc(voc_root, split, max_images) if voc_root else []
    images = [Path(p) for p in images] or [s.image for s in samples[:1]]
    if not images:
        raise UserError("scale viz attention: give --image FILE (repeatable) and/or --voc ROOT")
    cfg, backbones = source.load("attention")
    for backbone in backbones.values():
        check_vit(backbone, cfg.model.name)
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    patch = patch_size(next(iter(backbones.values())))
    folder = Path(out or (Path(run_dir) / "viz" if run_dir else "viz/attention"))
    result = {"model": cfg.model.name, "backbones": list(backbones), "pictures": [], "threshold": threshold}
    for path in images:
        image = to_input(read_rgb(path), image_size or None, patch, mean, std)
        title = f"{cfg.model.name}: last-block self-attention per head ({path.name})"
        png = attention_picture(backbones, image, mean, std, threshold, title, folder / f"attention_{path.stem}.png")
        result["pictures"].append(str(png))
        print(f"wrote {png}")
    if samples:
        result["voc"] = {"root": voc_root, "split": split}
        result["jaccard"] = {
            label: voc.evaluate(backbone, samples, threshold, image_size or None, mean, std)
            for label, backbone in backbones.items()
        }
        for label, entry in result["jaccard"].items():
            print(
                f"{label}: Jaccard best head {entry['jaccard_best_head']:.1f} (head {entry['best_head']}), "
                f"mean over heads {entry['jaccard_mean_heads']:.1f} ({entry['images']} images)"
            )
    json_path = folder / "attention.json" if out or not run_dir else result_path(None, run_dir, cfg, "attention")
    print(f"wrote {write_json(json_path, result)}")


def correspondence(source: Backbones, images: list[str], image_size: int, top: int, seed: int, out: str) -> None:
    """The `top` matched regions between each image and its flipped, jittered view, one PNG per image in `out`."""
    from scale.eval.images import patch_size, read_rgb, to_input
    from scale.viz.correspondence_picture import correspondence_picture

    cfg, backbones = source.load("correspondence")
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    multiple = max(patch_size(b) for b in backbones.values())
    for path in map(Path, images):
        image = to_input(read_rgb(path), image_size or None, multiple, mean, std)
        title = f"{cfg.model.name}: top {top} matches, view 1 -> its flipped, jittered view ({path.name})"
        png = correspondence_picture(
            backbones, image, mean, std, top, seed, title, Path(out) / f"correspondence_{path.stem}.png"
        )
        print(f"wrote {png}")
