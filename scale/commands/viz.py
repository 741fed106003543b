"""scale viz attention|correspondence RECIPE [overrides] --weights [LABEL=]FILE ... [--random-init]"""

import argparse
from pathlib import Path

HELP = {
    "attention": "last-block self-attention per head of a ViT's class token as PNGs, 60%-mass masks and their "
    "Jaccard against PASCAL VOC12 foreground (DINO Fig. 1/3/4)",
    "correspondence": "the top matched regions between an image and its flipped, jittered view (EsViT Fig. 8)",
}


def register(sub) -> None:
    parser = sub.add_parser("viz", help="pictures: attention maps (DINO Fig. 1/3/4), matched regions (EsViT Fig. 8)")
    vsub = parser.add_subparsers(dest="viz_command", required=True, metavar="VIZ")
    # help strings are %-formatted by argparse (`scale viz --help` crashed on "60%-mass"); descriptions are not
    child = vsub.add_parser("attention", help=HELP["attention"].replace("%", "%%"), description=HELP["attention"])
    _backbones(child)
    child.add_argument("--image", action="append", default=[], metavar="FILE", help="an image to draw; repeatable")
    child.add_argument("--voc", metavar="ROOT", help="VOC2012 root: Jaccard of the masks on its segmentation split")
    child.add_argument("--split", default="val", help="VOC segmentation split (ImageSets/Segmentation/<split>.txt)")
    child.add_argument("--max-images", type=int, help="at most this many VOC images")
    child.add_argument("--threshold", type=float, default=0.6, help="share of the attention mass the masks keep")
    child.add_argument(
        "--image-size", type=int, default=480, help="resize the shorter side to this (DINO: 480); 0 keeps it"
    )
    child.add_argument("--out", help="folder for the PNGs and attention.json (default viz/attention)")
    child.add_argument(
        "--run-dir", help="PNGs to DIR/viz/, attention.json to DIR/eval/, the recipe to DIR/config.yaml (if absent)"
    )
    child.set_defaults(func=cmd_attention)
    child = vsub.add_parser("correspondence", help=HELP["correspondence"], description=HELP["correspondence"])
    _backbones(child)
    child.add_argument("--image", action="append", required=True, metavar="FILE", help="an image; repeatable")
    child.add_argument("--image-size", type=int, default=224, help="resize the shorter side to this; 0 keeps it")
    child.add_argument("--top", type=int, default=10, help="matches drawn (EsViT: the 10 most confident)")
    child.add_argument("--seed", type=int, default=0, help="seed of the second view's jitter")
    child.add_argument("--out", default="viz/correspondence", help="folder for the PNGs")
    child.set_defaults(func=cmd_correspondence)


def _backbones(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe name or YAML path (its model section builds the backbone)")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument(
        "--weights",
        action="append",
        default=[],
        metavar="[LABEL=]FILE",
        help="an exported backbone (`scale ckpt export`); repeatable, e.g. dino=a.safetensors supervised=b.pth",
    )
    parser.add_argument("--random-init", action="store_true", help="also the backbone at random initialisation")
    parser.add_argument("--model", help="backbone name (overrides model.name)")


def load_backbones(args) -> tuple[object, dict]:
    """The recipe and label -> frozen backbone for every --weights (and --random-init)."""
    import torch

    from scale.checkpoint.weights import load_backbone
    from scale.errors import UserError
    from scale.eval.session import build_config

    cfg = build_config(args.recipe, args.overrides, args.model)
    sources = {}
    for entry in args.weights:
        label, _, path = entry.rpartition("=")
        label = label or Path(path).stem
        if label in sources:
            raise UserError(f"--weights: two backbones labelled '{label}'; name them LABEL=FILE")
        sources[label] = path
    if args.random_init:
        sources["random init"] = None
    if not sources:
        raise UserError(f"scale viz {args.viz_command}: give --weights FILE (repeatable) and/or --random-init")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    backbones = {}
    for label, path in sources.items():
        torch.manual_seed(cfg.train.seed)
        backbones[label] = load_backbone(cfg.model, path, device)
    return cfg, backbones


def cmd_attention(args) -> int:
    from scale.errors import UserError
    from scale.eval.images import patch_size, read_rgb, to_input
    from scale.evaluate import result_path
    from scale.loop.rundir import write_json
    from scale.viz import voc
    from scale.viz.attention import check_keep, check_vit
    from scale.viz.figures import attention_picture

    check_keep(args.threshold)
    samples = voc.read_voc(args.voc, args.split, args.max_images) if args.voc else []
    images = [Path(p) for p in args.image] or [s.image for s in samples[:1]]
    if not images:
        raise UserError("scale viz attention: give --image FILE (repeatable) and/or --voc ROOT")
    cfg, backbones = load_backbones(args)
    for backbone in backbones.values():
        check_vit(backbone, cfg.model.name)
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    patch = patch_size(next(iter(backbones.values())))
    out = Path(args.out or (Path(args.run_dir) / "viz" if args.run_dir else "viz/attention"))
    result = {"model": cfg.model.name, "backbones": list(backbones), "pictures": [], "threshold": args.threshold}
    for path in images:
        image = to_input(read_rgb(path), args.image_size or None, patch, mean, std)
        title = f"{cfg.model.name}: last-block self-attention per head ({path.name})"
        png = attention_picture(backbones, image, mean, std, args.threshold, title, out / f"attention_{path.stem}.png")
        result["pictures"].append(str(png))
        print(f"wrote {png}")
    if samples:
        result["voc"] = {"root": args.voc, "split": args.split}
        result["jaccard"] = {
            label: voc.evaluate(backbone, samples, args.threshold, args.image_size or None, mean, std)
            for label, backbone in backbones.items()
        }
        for label, entry in result["jaccard"].items():
            print(
                f"{label}: Jaccard best head {entry['jaccard_best_head']:.1f} (head {entry['best_head']}), "
                f"mean over heads {entry['jaccard_mean_heads']:.1f} ({entry['images']} images)"
            )
    json_path = (
        out / "attention.json" if args.out or not args.run_dir else result_path(None, args.run_dir, cfg, "attention")
    )
    print(f"wrote {write_json(json_path, result)}")
    return 0


def cmd_correspondence(args) -> int:
    from scale.eval.images import patch_size, read_rgb, to_input
    from scale.viz.correspondence_picture import correspondence_picture

    cfg, backbones = load_backbones(args)
    mean, std = list(cfg.data.views.mean), list(cfg.data.views.std)
    multiple = max(patch_size(b) for b in backbones.values())
    for path in map(Path, args.image):
        image = to_input(read_rgb(path), args.image_size or None, multiple, mean, std)
        title = f"{cfg.model.name}: top {args.top} matches, view 1 -> its flipped, jittered view ({path.name})"
        png = correspondence_picture(
            backbones, image, mean, std, args.top, args.seed, title, Path(args.out) / f"correspondence_{path.stem}.png"
        )
        print(f"wrote {png}")
    return 0
