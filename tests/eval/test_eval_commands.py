"""`scale eval ...` on the embedded data with tiny random-init models, checked against direct computations."""

import json
import os
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from scale.cli import main as cli
from scale.config import load_recipe
from scale.data.evaluation import ShardSamples, eval_views_cfg
from scale.eval.features import load as load_features
from scale.eval.knn import knn_eval
from scale.eval.linear import in_val_split
from scale.eval.logreg import evaluate_dataset
from scale.models import build_backbone
from tests import fork_server
from tests.helpers_run import FORKED_RANKS

RECIPE = """
base: _base/dino
model: {{name: vit_nano, img_size: 32, patch_size: 8}}
data:
  train: {root}/digits/train
  val: {root}/digits/val
  workers: 0
  views: {{eval_resize: 32, eval_crop: 32}}
eval: {{batch_size: 128, knn_k: [10, 20], logreg_max_iter: 100}}
"""


@pytest.fixture(scope="module")
def data(embedded_data, tmp_path_factory):
    root = embedded_data / "embedded"
    recipe = tmp_path_factory.mktemp("eval_data") / "tiny.yaml"
    recipe.write_text(RECIPE.format(root=root))
    return root, str(recipe)


@pytest.fixture(autouse=True)
def restore_environment():
    """init_distributed exports RANK/WORLD_SIZE/...; later commands in this process must not see them."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def run(*argv) -> dict:
    out = argv[argv.index("--out") + 1]
    assert cli(list(argv)) == 0
    return json.loads(open(out).read())


def direct_features(recipe: str, shard_dir: str, seed: int = 0) -> tuple:
    """Features computed without scale.eval: the recipe's backbone at random init (seeded as the session does),
    one image at a time in stored order."""
    cfg = load_recipe(recipe)
    torch.manual_seed(seed)
    backbone = build_backbone(cfg.model, drop_path=0.0).eval()
    samples = ShardSamples(shard_dir, eval_views_cfg(cfg.data.views))
    feats, labels = [], []
    with torch.no_grad():
        for i in range(len(samples)):
            batch = samples.collate([samples[i]])
            feats.append(backbone(batch.crops[0])["pooled"])
            labels.append(batch.labels)
    return torch.cat(feats), torch.cat(labels)


def test_knn_matches_direct_computation_and_features_reload(data, tmp_path):
    root, recipe = data
    saved = tmp_path / "feats.pt"
    result = run(
        "eval", "knn", recipe, "--random-init", "--out", str(tmp_path / "knn.json"), "--save-features", str(saved)
    )
    train_x, train_y = direct_features(recipe, f"{root}/digits/train")
    test_x, test_y = direct_features(recipe, f"{root}/digits/val")
    expected = knn_eval(train_x, train_y, test_x, test_y, [10, 20], 0.07, 10)
    assert result["train_samples"] == 1437 and result["test_samples"] == 360
    for k in ("10", "20"):
        assert result["per_k"][k]["top1"] == pytest.approx(expected[int(k)]["top1"], abs=0.3)  # 1 of 360
    assert result["top1"] == result["per_k"]["20"]["top1"] and result["random_init"]
    assert result["top1"] > 30.0  # chance is 10%: random ViT features already separate digits

    splits, meta = load_features(saved)
    assert torch.allclose(splits["train"].features, train_x, atol=1e-4)
    assert torch.equal(splits["test"].labels, test_y)
    # another seed: a backbone built again (the features not read back) would be another random network
    again = str(tmp_path / "again.json")
    reloaded = run("eval", "knn", recipe, "train.seed=1", "--load-features", str(saved), "--out", again)
    assert reloaded["per_k"] == result["per_k"] and reloaded["random_init"] and meta["num_classes"] == 10


@pytest.mark.slow  # spawns ranks
def test_knn_on_two_ranks_equals_one_rank(data, tmp_path):
    root, recipe = data
    small = [f"data.train={root}/digits/val", f"data.val={root}/photos/val", "model.name=vit_nano"]
    one = run("eval", "knn", recipe, *small, "--random-init", "--out", str(tmp_path / "one.json"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SCALE_LOCAL_LAUNCH")}
    proc = fork_server.run(
        [
            sys.executable,
            str(FORKED_RANKS),  # forked by the fork server, its ranks from it (tests/fork_server.py)
            "eval",
            "knn",
            recipe,
            *small,
            "--random-init",
            "--nproc",
            "2",
            "--out",
            str(tmp_path / "two.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["world_size"] == 2 and two["train_samples"] == one["train_samples"] == 360
    assert two["per_k"] == one["per_k"]


def test_weights_file_round_trip_and_mismatch(data, tmp_path, capsys):
    from safetensors.torch import save_file

    root, recipe = data
    cfg = load_recipe(recipe)
    torch.manual_seed(123)  # not the session's seed: the numbers must come from the file
    trained = build_backbone(cfg.model, drop_path=0.0)
    weights = tmp_path / "backbone.safetensors"
    save_file({k: v.contiguous() for k, v in trained.state_dict().items()}, str(weights))
    torch_weights = tmp_path / "backbone.pth"
    torch.save(trained.state_dict(), torch_weights)
    small = [f"data.train={root}/digits/val", f"data.val={root}/digits/val"]
    a = run("eval", "knn", recipe, *small, "--weights", str(weights), "--out", str(tmp_path / "a.json"))
    b = run("eval", "knn", recipe, *small, "--weights", str(torch_weights), "--out", str(tmp_path / "b.json"))
    base = run("eval", "knn", recipe, *small, "--random-init", "--out", str(tmp_path / "c.json"))
    assert a["per_k"] == b["per_k"] and a["weights"] == str(weights) and not a["random_init"]
    assert a["per_k"] != base["per_k"]  # the file's weights, not the seeded random init
    assert (
        cli(
            [
                "eval",
                "knn",
                recipe,
                "model.patch_size=4",
                "--model",
                "swin_nano",
                "--weights",
                str(weights),
                "--out",
                str(tmp_path / "d.json"),
            ]
        )
        == 2
    )
    assert "does not match model 'swin_nano'" in capsys.readouterr().err


@pytest.mark.slow  # the probe command end to end: a grid of classifiers trained on features
def test_linear_grid_on_digits(data, tmp_path):
    root, recipe = data
    result = run(
        "eval",
        "linear",
        recipe,
        "eval.linear_epochs=2",
        "eval.batch_size=64",
        "eval.linear_batch=0",  # batch_size on every rank (the DINO base's protocol says 1024 in all)
        "eval.linear_lrs=[0.01,0.3]",
        "eval.linear_val_fraction=0.2",
        "eval.linear_n_last_blocks=2",
        "--random-init",
        "--out",
        str(tmp_path / "linear.json"),
    )
    assert result["feature_dim"] == 2 * 64  # class tokens of the last 2 blocks of vit_nano
    assert result["lrs"] == pytest.approx([0.01 * 64 / 256, 0.3 * 64 / 256])
    keys = ShardSamples(f"{root}/digits/train", eval_views_cfg(load_recipe(recipe).data.views))
    expected_val = sum(in_val_split(f"{i:09d}", 0.2, 0) for i in range(len(keys)))
    assert result["val_samples"] == expected_val and result["test_samples"] == 360
    best = int(np.argmax(result["val_top1"]))
    assert result["best_index"] == best and result["top1"] == result["test_top1_all"][best]
    # random-init class tokens differ little between images: 2 short epochs only begin to fit them (the grid's
    # arithmetic is checked against separate runs in test_linear_grid.py)
    assert len(result["train_loss"]) == 2 and result["train_loss"][1] < result["train_loss"][0]


def test_logreg_suite_matches_direct_fit(data, tmp_path):
    root, recipe = data
    saved = tmp_path / "feats.pt"
    run("eval", "knn", recipe, "--random-init", "--save-features", str(saved), "--out", str(tmp_path / "k.json"))
    (tmp_path / "ref.json").write_text(json.dumps({"digits": 101.0}))
    result = run(
        "eval",
        "logreg",
        recipe,
        "--random-init",
        "--dataset",
        f"digits={root}/digits:mean_per_class",
        "--reference",
        str(tmp_path / "ref.json"),
        "--out",
        str(tmp_path / "logreg.json"),
    )
    entry = result["datasets"]["digits"]
    assert entry["validation"].startswith("carved from train") and entry["samples"]["test"] == 360
    # the same protocol by hand on the features the k-NN run saved (same backbone, same data)
    splits, _ = load_features(saved)
    train = splits["train"]
    held = np.array([in_val_split(k, 0.2, 0) for k in train.keys])
    x, y = train.features.numpy(), train.labels.numpy()
    direct = evaluate_dataset(
        (x[~held], y[~held]),
        (x[held], y[held]),
        (splits["test"].features.numpy(), splits["test"].labels.numpy()),
        "mean_per_class",
        10,
        max_iter=100,
    )
    assert entry["best_log10_lambda"] == direct["best_log10_lambda"]
    assert entry["score"] == pytest.approx(direct["score"], abs=0.5)
    assert result["average"] == entry["score"]
    assert result["reference"]["wins"] == 0 and result["reference"]["compared"] == 1


@pytest.mark.parametrize("model", ["vit_nano", "swin_nano"])
def test_correspondence_command(data, tmp_path, model):
    root, recipe = data
    extra = ["model.patch_size=4", "model.img_size=64"] if model == "swin_nano" else []
    result = run(
        "eval",
        "correspondence",
        recipe,
        f"data.val={root}/photos/val",
        "data.views.eval_resize=64",
        "data.views.eval_crop=64",
        "eval.correspondence_images=20",
        f"model.name={model}",
        *extra,
        "--random-init",
        "--out",
        str(tmp_path / "corr.json"),
    )
    assert result["images"] == 20 and result["top"] == 10
    assert 0.0 <= result["accuracy"] <= 100.0 and result["distance_error_px"] >= 0.0
    assert -1.0 <= result["similarity"] <= 1.0


def test_bad_input_is_a_user_error(data, tmp_path, capsys):
    root, recipe = data
    assert cli(["eval", "knn", recipe, "--out", str(tmp_path / "x.json")]) == 2
    assert "--weights FILE, --random-init or --load-features" in capsys.readouterr().err
    assert cli(["eval", "knn", recipe, "--weights", str(tmp_path / "none.safetensors")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert cli(["eval", "logreg", recipe, "--random-init"]) == 2
    assert "--suite YAML or at least one --dataset" in capsys.readouterr().err
    assert cli(["eval", "knn", recipe, "--load-features", str(tmp_path / "none.pt")]) == 2
    assert "features file not found" in capsys.readouterr().err
    assert OmegaConf.is_config(load_recipe(recipe))
