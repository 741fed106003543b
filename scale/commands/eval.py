"""scale eval knn|linear|logreg|correspondence|finetune|video-segmentation|retrieval|copy-detection RECIPE [overrides]
(--weights FILE | --random-init)"""

import argparse

from scale.commands import process_count

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
        common = _dests(child)
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
        child.set_defaults(func=cmd_eval, eval_kind=kind, parser=child, options=_dests(child) - common)
    _register_protocols(esub)


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    """The names of a parser's arguments (those a kind adds to the common ones are its options)."""
    return {action.dest for action in parser._actions}


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
    from scale.evaluate import evaluate

    options = {dest: getattr(args, dest) for dest in args.options}
    return evaluate(
        args.eval_kind,
        args.recipe,
        args.overrides,
        args.model,
        args.weights,
        args.out,
        args.nproc,
        argv_of(args.parser, args),
        random_init=args.random_init,
        **options,
    )


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
        common = _dests(child)
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
        child.set_defaults(func=cmd_protocol, eval_kind=kind, settings=_dests(child) - common)


def cmd_protocol(args) -> int:
    from scale.evaluate import protocol

    settings = {dest: getattr(args, dest) for dest in args.settings}
    return protocol(
        args.eval_kind, args.recipe, args.overrides, args.model, args.weights, args.out, args.run_dir, settings
    )
