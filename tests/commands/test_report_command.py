"""`scale report RUN_DIR... --out DIR`: the paper's numbers next to the measured ones, and the plots."""

import json

from omegaconf import OmegaConf

from scale.cli import main
from scale.config import load_recipe


def test_report_puts_paper_numbers_next_to_measured(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    OmegaConf.save(load_recipe("dino/table2/vit_s16"), run / "config.yaml")
    metrics = [{"step": s, "loss": 10.0 - s, "images_per_s": 50.0 + s} for s in range(1, 4)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    report = (tmp_path / "out" / "report.md").read_text()
    assert str(tmp_path / "out" / "report.md") in capsys.readouterr().out
    row = next(line for line in report.splitlines() if line.startswith("| dino/table2/vit_s16"))
    assert "knn 74.5, linear 77.0" in row and "| 7 |" in row and "| 52 |" in row  # images/s: the median
    assert (tmp_path / "out" / "loss.png").is_file()


def test_report_of_a_non_run_directory_is_a_user_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
