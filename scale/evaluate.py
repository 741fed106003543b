"""The body of `scale eval` (scale/commands/eval.py parses its arguments). The backbone evaluations (k-NN, linear,
logreg, correspondence) start their ranks (`--nproc`, or those of torchrun or srun), open the session
(scale/eval/session.py) and run on every rank; the main rank writes the result (eval/<kind>.json) and prints its
table (scale/eval/tables.py). Fine-tuning is a run of the training loop (scale/loop/finetune.py) whose result is
written the same way. The dense and retrieval protocols of DINO Tables 3-5 run in one process and can write into a
run directory, for `scale report`."""

from pathlib import Path

import torch
from omegaconf import DictConfig

from scale.checkpoint.weights import load_backbone
from scale.engine.dist import init_distributed, shutdown
from scale.errors import UserError
from scale.eval.session import build_config, open_session
from scale.eval.tables import show
from scale.launch.local import already_launched, spawn
from scale.loop.rundir import RunDir, setup_logging, write_json


def evaluate(
    kind: str,
    recipe: str,
    overrides: list[str],
    model: str | None,
    weights: str | None,
    out: str | None,
    nproc: int,
    argv: list[str],
    random_init: bool = False,
    save_features: str | None = None,
    load_features: str | None = None,
    suite: str | None = None,
    dataset: list[str] = (),
    reference: str | None = None,
    run_dir: str | None = None,
) -> int:
    """`scale eval KIND` (knn, linear, logreg, correspondence, finetune); `argv`: the command line the spawned
    ranks run. knn: --save-features / --load-features; logreg: --suite, --dataset, --reference; finetune: the run
    directory. The exit status."""
    cfg = build_config(recipe, overrides, model)  # validate before spawning anything
    if kind == "knn" and not (weights or random_init or load_features):
        raise UserError("scale eval knn: give --weights FILE, --random-init or --load-features FILE")
    if kind == "finetune":
        return run_finetune(cfg, recipe, overrides, model, weights, run_dir, nproc, out)
    datasets = logreg_suite(suite, dataset, reference) if kind == "logreg" else None
    if nproc > 1 and not already_launched():
        return spawn(nproc, argv)
    info, device = init_distributed()
    setup_logging(None, info.rank)
    try:
        session = open_session(cfg, info, device, weights)
        result = _run(kind, session, datasets, reference, save_features, load_features)
        if info.is_main:
            write_result(out or f"eval/{kind}.json", kind, result)
    finally:
        shutdown()
    return 0


def write_result(path: str | Path, kind: str, result: dict) -> None:
    """The result JSON, its table and where it went."""
    path = write_json(path, result)
    show(kind, result)
    print(f"wrote {path}")


def run_finetune(
    cfg: DictConfig,
    recipe: str,
    overrides: list[str],
    model: str | None,
    weights: str | None,
    run_dir: str | None,
    nproc: int,
    out: str | None,
) -> int:
    from scale.loop import finetune  # the training loop's imports, for this evaluation only

    overrides = list(overrides) + ([f"model.name={model}"] if model else [])
    result = finetune.run(cfg, recipe, overrides, weights, run_dir, nproc)
    if isinstance(result, int):
        return result
    write_result(out or "eval/finetune.json", "finetune", result)
    return 0


def logreg_suite(suite: str | None, datasets: list[str], reference: str | None) -> list[dict]:
    """The data sets of `scale eval logreg` (--suite YAML and each --dataset), checked before any feature is
    extracted, with the --reference file."""
    from scale.eval.logreg import parse_dataset_arg, read_reference, read_suite

    entries = (read_suite(suite) if suite else []) + [parse_dataset_arg(d) for d in datasets]
    if not entries:
        raise UserError("scale eval logreg: give --suite YAML or at least one --dataset ROOT")
    names = [entry["name"] for entry in entries]
    if len(set(names)) != len(names):
        raise UserError(f"scale eval logreg: data set names must be unique, got {names}")
    if reference:
        read_reference(reference)  # fail before the features are extracted
    return entries


def _run(kind: str, session, suite, reference, save_features, load_features) -> dict:
    from scale.eval import correspondence, knn, linear, logreg

    if kind == "knn":
        return knn.run(session, save_features, load_features)
    if kind == "linear":
        return linear.run(session)
    if kind == "logreg":
        return logreg.run(session, suite, reference)
    return correspondence.run(session)


def protocol(
    kind: str,
    recipe: str,
    overrides: list[str],
    model: str | None,
    weights: str | None,
    out: str | None,
    run_dir: str | None,
    settings: dict,
) -> int:
    """`scale eval video-segmentation|retrieval|copy-detection`, one process; `settings`: the protocol's own
    options (its data set's root and the official script's settings)."""
    cfg = build_config(recipe, overrides, model)
    run = _protocol_runner(kind, settings)  # reads the data set layout before the backbone is built
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.train.seed)
    backbone = load_backbone(cfg.model, weights, device)
    result = {
        "eval": kind,
        "model": cfg.model.name,
        "weights": weights,
        "random_init": weights is None,
        **run(backbone, list(cfg.data.views.mean), _std(kind, cfg), device),
    }
    stem = kind.replace("-", "_") + (f"_{settings['dataset']}" if kind == "retrieval" else "")
    write_result(result_path(out, run_dir, cfg, stem), kind, result)
    return 0


def _std(kind: str, cfg: DictConfig) -> list[float]:
    """The normalisation std of the protocol's official script: eval.video_std for DAVIS, else the recipe's."""
    return list(cfg.eval.video_std if kind == "video-segmentation" else cfg.data.views.std)


def result_path(out: str | None, run_dir: str | None, cfg: DictConfig, stem: str) -> Path:
    """--out; else <run_dir>/eval/<stem>.json, the run directory getting the recipe so that `scale report` reads
    the paper's numbers next to the result; else eval/<stem>.json."""
    if out:
        return Path(out)
    if run_dir is None:
        return Path("eval") / f"{stem}.json"
    run = RunDir(run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    if not run.config.exists():
        run.write_config(cfg)
    return run.root / "eval" / f"{stem}.json"


def _protocol_runner(kind: str, settings: dict):
    """A function (backbone, mean, std, device) -> result fields, with the data set already checked."""
    if kind == "video-segmentation":
        from scale.eval import video_segmentation as vos

        videos = vos.read_davis(settings["davis"], settings["split"], settings["max_videos"])
        options = {key: settings[key] for key in ("n_last_frames", "neighbourhood", "topk", "short_side")}
        masks = Path(settings["save_masks"]) if settings["save_masks"] else None
        return lambda backbone, mean, std, device: {
            "davis": settings["davis"],
            **vos.evaluate(backbone, videos, options, mean, std, device, masks),
        }
    if kind == "retrieval":
        from scale.eval import retrieval

        data = retrieval.read_revisited(settings["data"], settings["dataset"])
        return lambda backbone, mean, std, device: retrieval.evaluate(
            backbone, data, settings["imsize"], settings["multiscale"], settings["query_crop"], mean, std, device
        )
    if kind == "copy-detection":
        from scale.eval import copy_detection

        data = copy_detection.read_inputs(settings["copydays"], settings["distractors"], settings["whitening"])
        return lambda backbone, mean, std, device: {
            "copydays": settings["copydays"],
            **copy_detection.evaluate(backbone, data, settings["imsize"], settings["top"], mean, std, device),
        }
    raise AssertionError(kind)
