"""The tables `scale eval` prints (scale/eval/tables.py): one for every kind of the command, each showing the
result's numbers as the JSON holds them."""

import pytest
from rich.console import Console

from scale.commands.eval import HELP, PROTOCOLS
from scale.eval.tables import TABLES, show

HEAD = {"model": "vit_tiny", "weights": "w.safetensors", "random_init": False}
RESULTS = {
    "knn": {"per_k": {"20": {"top1": 71.25, "top5": 90.5}}},
    "linear": {
        "base_lrs": [0.1, 1.0],
        "lrs": [0.05, 0.5],
        "val_top1": [60.0, 65.5],
        "test_top1_all": [59.0, 64.25],
        "best_index": 1,
    },
    "logreg": {
        "datasets": {"flowers": {"metric": "accuracy", "score": 88.5, "best_lambda": 0.001}},
        "average": 88.5,
        "reference": {"per_dataset": {"flowers": {"reference": 87.0}}, "wins": 1, "compared": 1},
    },
    "correspondence": {"images": 8, "top": 10, "accuracy": 42.5, "distance_error_px": 3.25, "similarity": 0.875},
    "finetune": {"history": [{"epoch": 1.0, "step": 10, "top1": 55.5, "top5": 80.25}]},
    "video-segmentation": {"videos": ["a", "b"], "objects": 3, "jf_mean": 61.8, "j_mean": 60.2, "f_mean": 63.4},
    "retrieval": {"dataset": "roxford5k", "images": 50, "queries": 7, "medium_map": 51.3, "hard_map": 22.7},
    "copy-detection": {"queries": 9, "originals": 4, "distractors": 100, "whitening_images": 20, "strong_map": 85.1},
}
SHOWN = {
    "knn": ["71.25", "90.50"],
    "linear": ["0.5", "64.25", "chosen"],
    "logreg": ["flowers", "88.50", "0.001", "87.00", "wins 1/1"],
    "correspondence": ["42.50", "3.25", "0.875"],
    "finetune": ["55.50", "80.25"],
    "video-segmentation": ["61.8", "60.2", "63.4"],
    "retrieval": ["roxford5k", "51.3", "22.7"],
    "copy-detection": ["100", "85.1"],
}


def test_every_kind_of_the_command_has_a_table():
    assert set(TABLES) == set(HELP) | set(PROTOCOLS) == set(RESULTS)


@pytest.mark.parametrize("kind", RESULTS)
def test_each_table_shows_the_results_numbers_and_title(kind, monkeypatch):
    console = Console(record=True, width=200)
    monkeypatch.setattr("scale.eval.tables.Console", lambda: console)
    show(kind, {"eval": kind, **HEAD, **RESULTS[kind]})
    text = console.export_text()
    assert f"{kind}: vit_tiny (w.safetensors)" in text
    assert all(value in text for value in SHOWN[kind]), text


def test_a_random_init_result_says_so_in_the_title():
    text = Console(record=True, width=200)
    text.print(TABLES["knn"]({"eval": "knn", **HEAD, "random_init": True, **RESULTS["knn"]}))
    assert "knn: vit_tiny (random init)" in text.export_text()
