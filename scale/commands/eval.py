"""scale eval knn|linear|logreg|correspondence|finetune|video-segmentation|retrieval|copy-detection RECIPE [overrides]
(--weights FILE | --random-init)"""

from __future__ import annotations

import argparse

from scale.commands import process_count


# rich is imported when a table is printed, not when the parser is built (`scale --help` stays light)
def Table(*columns, **options):  # noqa: N802  (stands for rich.table.Table)
    from rich.table import Table

    return Table(*columns, **options)


def Console(**options):  # noqa: N802  (stands for rich.console.Console)
    from rich.console import Console

    return Console(**options)


HELP = {
    "knn": "weighted k-NN of data.val against data.train (DINO protocol)",
    "linear": "linear probe on a frozen backbone, a grid of learning rates in one run",
    "logreg": "logistic-regression transfer suite (EsViT C.5)",
    "correspondence": "token correspondence between a center crop and its flipped, jittered view (EsViT C.7)",
    "finetune": "end-to-end fine-tuning: `scale train` of a supervised recipe from the backbone, val accuracy",
}


def register(sub) -> None:
    parser = sub.add_parser("eval", help="evaluate a backbone (k-NN, linear, logreg, correspondence, finetune)")
    esub = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL")
    for kind, text in HELP.items():
        child = esub.add_parser(kind, help=text, description=text)
        _common(child, kind)
        if kind == "knn":
            child.add_argument("--save-features", metavar="FILE", help="save the train/val features (rank 0)")
            child.add_argument("--load-features", metavar="FILE", help="use features saved earlier; no backbone run")
        if kind == "logreg":
            child.add_argument("--suite", metavar="YAML", help="datasets: [{name, root, metric}]")
            child.add_argument(
                "--dataset",
                action="append",
                default=[],
                metavar="[NAME=]ROOT[:METRIC]",
                help="a data set root holding train/, test/ (and val/) shard directories; repeatable",
            )
            child.add_argument("--reference", metavar="JSON", help="a reference model's results: average and wins")
        if kind == "finetune":
            child.add_argument(
                "--run-dir",
                help="the training run (default runs/finetune/<recipe>); an existing one continues from its checkpoint",
            )
        child.set_defaults(func=cmd_eval, eval_kind=kind, parser=child)
    _register_protocols(esub)


def _common(parser: argparse.ArgumentParser, kind: str) -> None:
    parser.add_argument("recipe", help="recipe name or YAML path (model, data and eval sections)")
    parser.add_argument("overrides", nargs="*", help="section.key=value, e.g. eval.knn_k=[20] data.val=DIR")
    source = parser.add_mutually_exclusive_group(required=kind != "knn")
    source.add_argument("--weights", metavar="FILE", help="exported backbone (.safetensors or torch state dict)")
    source.add_argument("--random-init", action="store_true", help="evaluate the backbone at random init")
    parser.add_argument("--model", help="backbone name (overrides model.name)")
    parser.add_argument("--out", help=f"result JSON (default eval/{kind}.json)")
    parser.add_argument(
        "--nproc",
        type=process_count,
        default=0,
        help="spawn this many local processes (CPU: gloo); leave unset under torchrun or srun",
    )


def argv_of(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The command line that reproduces `args` (for the spawned ranks)."""
    positional, options = [], []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if isinstance(action, argparse._HelpAction) or value is None or value == action.default:
            continue
        if not action.option_strings:
            positional += value if isinstance(value, list) else [value]
        elif isinstance(action, argparse._StoreTrueAction):
            options.append(action.option_strings[0])
        elif isinstance(action, argparse._AppendAction):
            for item in value:
                options += [action.option_strings[0], str(item)]
        else:
            options += [action.option_strings[0], str(value)]
    return ["eval", args.eval_kind, *positional, *options]


def cmd_eval(args) -> int:
    from scale.engine.dist import init_distributed, shutdown
    from scale.errors import UserError
    from scale.eval.session import build_config, open_session
    from scale.launch.local import already_launched, spawn
    from scale.loop.rundir import setup_logging, write_json

    cfg = build_config(args.recipe, args.overrides, args.model)  # validate before spawning anything
    if args.eval_kind == "knn" and not (args.weights or args.random_init or args.load_features):
        raise UserError("scale eval knn: give --weights FILE, --random-init or --load-features FILE")
    if args.eval_kind == "finetune":
        return _finetune(args, cfg)
    suite = _suite(args) if args.eval_kind == "logreg" else None
    if args.nproc > 1 and not already_launched():
        return spawn(args.nproc, argv_of(args.parser, args))
    info, device = init_distributed()
    setup_logging(None, info.rank)
    try:
        session = open_session(cfg, info, device, args.weights)
        result = _run(args, session, suite)
        if info.is_main:
            path = write_json(args.out or f"eval/{args.eval_kind}.json", result)
            Console().print(TABLES[args.eval_kind](result))
            print(f"wrote {path}")
    finally:
        shutdown()
    return 0


def _finetune(args, cfg) -> int:
    from scale.loop import finetune
    from scale.loop.rundir import write_json

    overrides = list(args.overrides) + ([f"model.name={args.model}"] if args.model else [])
    result = finetune.run(cfg, args.recipe, overrides, args.weights, args.run_dir, args.nproc)
    if isinstance(result, int):
        return result
    path = write_json(args.out or "eval/finetune.json", result)
    Console().print(finetune_table(result))
    print(f"wrote {path}")
    return 0


def _suite(args) -> list[dict]:
    from scale.errors import UserError
    from scale.eval.logreg import parse_dataset_arg, read_reference, read_suite

    suite = (read_suite(args.suite) if args.suite else []) + [parse_dataset_arg(d) for d in args.dataset]
    if not suite:
        raise UserError("scale eval logreg: give --suite YAML or at least one --dataset ROOT")
    names = [entry["name"] for entry in suite]
    if len(set(names)) != len(names):
        raise UserError(f"scale eval logreg: data set names must be unique, got {names}")
    if args.reference:
        read_reference(args.reference)  # fail before the features are extracted
    return suite


def _run(args, session, suite) -> dict:
    from scale.eval import correspondence, knn, linear, logreg

    if args.eval_kind == "knn":
        return knn.run(session, args.save_features, args.load_features)
    if args.eval_kind == "linear":
        return linear.run(session)
    if args.eval_kind == "logreg":
        return logreg.run(session, suite, args.reference)
    return correspondence.run(session)


def _title(result: dict) -> str:
    weights = "random init" if result["random_init"] else result["weights"]
    return f"{result['eval']}: {result['model']} ({weights})"


def knn_table(result: dict) -> Table:
    table = Table("k", "top-1 (%)", "top-5 (%)", title=_title(result))
    for k, acc in result["per_k"].items():
        table.add_row(k, f"{acc['top1']:.2f}", f"{acc['top5']:.2f}")
    return table


def linear_table(result: dict) -> Table:
    table = Table("lr (per 256)", "lr", "val top-1 (%)", "test top-1 (%)", "", title=_title(result))
    for i, (base, lr) in enumerate(zip(result["base_lrs"], result["lrs"])):
        table.add_row(
            f"{base:g}",
            f"{lr:g}",
            f"{result['val_top1'][i]:.2f}",
            f"{result['test_top1_all'][i]:.2f}",
            "chosen" if i == result["best_index"] else "",
        )
    return table


def logreg_table(result: dict) -> Table:
    reference = result.get("reference", {}).get("per_dataset", {})
    table = Table("data set", "metric", "score", "lambda", "reference", title=_title(result))
    for name, entry in result["datasets"].items():
        ref = reference.get(name, {}).get("reference")
        table.add_row(
            name,
            entry["metric"],
            f"{entry['score']:.2f}",
            f"{entry['best_lambda']:.3g}",
            "" if ref is None else f"{ref:.2f}",
        )
    footer = f"{result['average']:.2f}"
    if "reference" in result:
        footer += f" (wins {result['reference']['wins']}/{result['reference']['compared']})"
    table.add_row("average", "", footer, "", "")
    return table


def correspondence_table(result: dict) -> Table:
    table = Table("images", "top", "accuracy (%)", "distance error (px)", "similarity", title=_title(result))
    table.add_row(
        str(result["images"]),
        str(result["top"]),
        f"{result['accuracy']:.2f}",
        f"{result['distance_error_px']:.2f}",
        f"{result['similarity']:.3f}",
    )
    return table


def finetune_table(result: dict) -> Table:
    table = Table("epoch", "step", "val top-1 (%)", "val top-5 (%)", title=_title(result))
    for row in result["history"]:
        table.add_row(f"{row['epoch']:g}", str(row["step"]), f"{row['top1']:.2f}", f"{row['top5']:.2f}")
    return table


TABLES = {
    "knn": knn_table,
    "linear": linear_table,
    "logreg": logreg_table,
    "correspondence": correspondence_table,
    "finetune": finetune_table,
}


# Dense and retrieval protocols of DINO Tables 3-5: one process, data sets in their own published layouts.
RUN_DIR_HELP = "write the result to DIR/eval/ and the recipe to DIR/config.yaml (if absent), for `scale report DIR`"
PROTOCOLS = {
    "video-segmentation": "DAVIS 2017 label propagation through the patch features, J&F mean (DINO Table 5)",
    "retrieval": "revisited Oxford / Paris retrieval with frozen features, mAP Medium and Hard (DINO Table 3)",
    "copy-detection": "Copydays strong subset with distractors and whitening, mAP (DINO Table 4)",
}


def _register_protocols(esub) -> None:
    for kind, text in PROTOCOLS.items():
        child = esub.add_parser(kind, help=text, description=text)
        child.add_argument("recipe", help="recipe name or YAML path (its model section builds the backbone)")
        child.add_argument("overrides", nargs="*", help="section.key=value")
        source = child.add_mutually_exclusive_group(required=True)
        source.add_argument("--weights", metavar="FILE", help="exported backbone (.safetensors or torch state dict)")
        source.add_argument("--random-init", action="store_true", help="evaluate the backbone at random init")
        child.add_argument("--model", help="backbone name (overrides model.name)")
        child.add_argument("--out", help=f"result JSON (default eval/{kind.replace('-', '_')}.json)")
        child.add_argument("--run-dir", help=RUN_DIR_HELP)
        child.set_defaults(func=cmd_protocol, eval_kind=kind)
        if kind == "video-segmentation":
            child.add_argument(
                "--davis", required=True, metavar="ROOT", help="DAVIS 2017 root (see docs/how-to/evaluate.md)"
            )
            child.add_argument("--split", default="val", help="ImageSets/2017/<split>.txt")
            child.add_argument("--max-videos", type=int, help="only the first N videos")
            child.add_argument("--n-last-frames", type=int, default=7, help="previous frames used as context")
            child.add_argument("--neighbourhood", type=int, default=12, help="patch radius of source patches; 0: all")
            child.add_argument("--topk", type=int, default=5, help="source patches kept per target patch")
            child.add_argument("--short-side", type=int, default=480, help="frames resized to this shorter side")
            child.add_argument("--save-masks", metavar="DIR", help="write the predicted palette PNGs per video")
        if kind == "retrieval":
            child.add_argument("--data", required=True, metavar="ROOT", help="folder holding roxford5k/, rparis6k/")
            child.add_argument("--dataset", default="roxford5k", help="roxford5k | rparis6k")
            child.add_argument(
                "--imsize", type=int, default=224, help="longer side at most (DINO: Oxford 224, Paris 512)"
            )
            child.add_argument(
                "--multiscale", action="store_true", help="mean of scales 1, 1/sqrt(2), 1/2 (DINO: Paris)"
            )
            child.add_argument(
                "--query-crop",
                action="store_true",
                help="crop queries to their bbx as the revisited protocol defines (DINO's code does not)",
            )
        if kind == "copy-detection":
            child.add_argument("--copydays", required=True, metavar="ROOT", help="Copydays root: original/, strong/")
            child.add_argument("--distractors", metavar="DIR", help="distractor images (the paper: 10k YFCC100M)")
            child.add_argument(
                "--whitening", metavar="DIR", help="images the whitening is learned on (default: the distractors)"
            )
            child.add_argument("--imsize", type=int, default=224, help="square input side (DINO: 224 /16, 320 /8)")
            child.add_argument("--top", type=int, default=20, help="results per query the AP reads (DINO: 20)")


def cmd_protocol(args) -> int:
    import torch

    from scale.checkpoint.weights import load_backbone
    from scale.eval.session import build_config
    from scale.loop.rundir import write_json

    cfg = build_config(args.recipe, args.overrides, args.model)
    run = _protocol_runner(args)  # reads the data set layout before the backbone is built
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.train.seed)
    backbone = load_backbone(cfg.model, args.weights, device)
    result = {
        "eval": args.eval_kind,
        "model": cfg.model.name,
        "weights": args.weights,
        "random_init": args.weights is None,
        **run(backbone, list(cfg.data.views.mean), _std(args, cfg), device),
    }
    stem = args.eval_kind.replace("-", "_") + (f"_{args.dataset}" if args.eval_kind == "retrieval" else "")
    path = write_json(result_path(args.out, args.run_dir, cfg, stem), result)
    Console().print(PROTOCOL_TABLES[args.eval_kind](result))
    print(f"wrote {path}")
    return 0


def _std(args, cfg) -> list[float]:
    """The normalisation std of the protocol's official script: eval.video_std for DAVIS, else the recipe's."""
    return list(cfg.eval.video_std if args.eval_kind == "video-segmentation" else cfg.data.views.std)


def result_path(out: str | None, run_dir: str | None, cfg, stem: str):
    """--out; else <run_dir>/eval/<stem>.json, the run directory getting the recipe so that `scale report` reads
    the paper's numbers next to the result; else eval/<stem>.json."""
    from pathlib import Path

    from scale.loop.rundir import RunDir

    if out:
        return Path(out)
    if run_dir is None:
        return Path("eval") / f"{stem}.json"
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.config.exists():
        run.write_config(cfg)
    return run.root / "eval" / f"{stem}.json"


def _protocol_runner(args):
    """A function (backbone, mean, std, device) -> result fields, with the data set already checked."""
    from pathlib import Path

    if args.eval_kind == "video-segmentation":
        from scale.eval import video_segmentation as vos

        videos = vos.read_davis(args.davis, args.split, args.max_videos)
        settings = {
            "n_last_frames": args.n_last_frames,
            "neighbourhood": args.neighbourhood,
            "topk": args.topk,
            "short_side": args.short_side,
        }
        masks = Path(args.save_masks) if args.save_masks else None
        return lambda backbone, mean, std, device: {
            "davis": args.davis,
            **vos.evaluate(backbone, videos, settings, mean, std, device, masks),
        }
    if args.eval_kind == "retrieval":
        from scale.eval import retrieval

        data = retrieval.read_revisited(args.data, args.dataset)
        return lambda backbone, mean, std, device: retrieval.evaluate(
            backbone, data, args.imsize, args.multiscale, args.query_crop, mean, std, device
        )
    if args.eval_kind == "copy-detection":
        from scale.eval import copy_detection

        data = copy_detection.read_inputs(args.copydays, args.distractors, args.whitening)
        return lambda backbone, mean, std, device: {
            "copydays": args.copydays,
            **copy_detection.evaluate(backbone, data, args.imsize, args.top, mean, std, device),
        }
    raise AssertionError(args.eval_kind)


def video_segmentation_table(result: dict) -> Table:
    table = Table("videos", "objects", "J&F mean", "J mean", "F mean", title=_title(result))
    table.add_row(
        str(len(result["videos"])),
        str(result["objects"]),
        f"{result['jf_mean']:.1f}",
        f"{result['j_mean']:.1f}",
        f"{result['f_mean']:.1f}",
    )
    return table


def retrieval_table(result: dict) -> Table:
    table = Table("data set", "images", "queries", "mAP Medium", "mAP Hard", title=_title(result))
    table.add_row(
        result["dataset"],
        str(result["images"]),
        str(result["queries"]),
        f"{result['medium_map']:.1f}",
        f"{result['hard_map']:.1f}",
    )
    return table


def copy_detection_table(result: dict) -> Table:
    table = Table("queries", "originals", "distractors", "whitening images", "mAP strong", title=_title(result))
    table.add_row(
        str(result["queries"]),
        str(result["originals"]),
        str(result["distractors"]),
        str(result["whitening_images"]),
        f"{result['strong_map']:.1f}",
    )
    return table


PROTOCOL_TABLES = {
    "video-segmentation": video_segmentation_table,
    "retrieval": retrieval_table,
    "copy-detection": copy_detection_table,
}
