"""scale ckpt info|export"""

import json


def register(sub) -> None:
    parser = sub.add_parser("ckpt", help="inspect and export checkpoints")
    csub = parser.add_subparsers(dest="ckpt_command", required=True, metavar="ACTION")
    show = csub.add_parser("info", help="what a checkpoint holds, and every checkpoint of its run")
    show.add_argument("path", help="run directory, its checkpoints/ folder, or a step directory")
    show.add_argument("--json", action="store_true", help="print the listing as JSON")
    show.add_argument("--verify", action="store_true", help="match every file with its checksum (reads every byte)")
    show.set_defaults(func=cmd_info)
    exp = csub.add_parser("export", help="write a consolidated backbone state dict, or a timm / Hub folder")
    exp.add_argument("path", help="run directory or step directory")
    exp.add_argument(
        "--what",
        default="teacher-backbone",
        help="teacher-backbone | student-backbone | student (the whole student net)",
    )
    exp.add_argument(
        "--format",
        default="safetensors",
        help="safetensors | torch (a file) | timm | hf (a folder timm loads: config.json, model.safetensors, model card)",
    )
    exp.add_argument("--out", required=True, help="the file to write (a folder for --format timm|hf)")
    exp.add_argument(
        "--license",
        default="other",
        help="timm / hf: the weights' license in config.json and the card, e.g. apache-2.0, cc-by-nc-4.0 "
        "(default: %(default)s)",
    )
    exp.set_defaults(func=cmd_export)


def cmd_info(args) -> int:
    from scale.checkpoint.store import checkpoints_root

    checkpoints_root(args.path)  # a path that is no run fails here, before torch is imported (exit 2)
    from scale.checkpoint.export import info  # torch: it reads the checkpoint's tensors (the model checksum)

    result = info(args.path, args.verify)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        rows = result.pop("checkpoints")
        width = max(map(len, result))
        for key, value in result.items():
            print(f"{key:<{width}}  {value}")
        print(f"\n{'step':>10}  {'saved':<19}  {'loadable':<8}  path")
        for row in rows:
            print(f"{row['step']:>10}  {row['saved'] or '-':<19}  {row['loadable']:<8}  {row['path']}")
        if not rows:
            print(f"{'-':>10}  no checkpoint saved yet")
    return 0


def cmd_export(args) -> int:
    from scale.checkpoint.export import export

    print(export(args.path, args.what, args.format, args.out, license=args.license))
    return 0
