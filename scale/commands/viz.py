"""scale viz attention|correspondence RECIPE [overrides] --weights [LABEL=]FILE ... [--random-init]
(the pictures are drawn by scale/viz/draw.py)"""

import argparse

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


def _source(args):
    from scale.viz.draw import Backbones

    return Backbones(args.recipe, args.overrides, args.model, args.weights, args.random_init)


def cmd_attention(args) -> int:
    from scale.viz.draw import attention

    attention(
        _source(args),
        args.image,
        args.voc,
        args.split,
        args.max_images,
        args.threshold,
        args.image_size,
        args.out,
        args.run_dir,
    )
    return 0


def cmd_correspondence(args) -> int:
    from scale.viz.draw import correspondence

    correspondence(_source(args), args.image, args.image_size, args.top, args.seed, args.out)
    return 0
