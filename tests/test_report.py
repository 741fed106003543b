"""The report: images/s defined once (the other figures say how they differ), a title on every plot, the resume
point marked on the loss plot."""

import json

import matplotlib.figure
import pytest

from scale.config import load_recipe, to_yaml
from scale.report import IMAGES_PER_S, write_report


@pytest.fixture
def figures(monkeypatch) -> dict:
    """{file name: (title, line labels)} of every figure the report saves."""
    seen, save = {}, matplotlib.figure.Figure.savefig

    def record(fig, path, *args, **kwargs):
        ax = fig.axes[0]
        seen[path.name] = (ax.get_title(), [line.get_label() for line in ax.get_lines()])
        seen[path.name + " panels"] = [(a.get_ylabel(), [line.get_label() for line in a.get_lines()]) for a in fig.axes]
        return save(fig, path, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    return seen


def test_the_report_defines_images_per_s_once_titles_plots_and_marks_the_resume(tmp_path, figures):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_recipe("demo/dino_tiny")))
    rows = [{"step": s, "time": s, "loss": 5.0 - s / 10, "images_per_s": 100.0, "probe_top1": 10.0} for s in (1, 2, 3)]
    rows += [{"step": 4, "time": 99, "loss": 4.6, "images_per_s": 90.0, "probe_top1": 20.0, "resumed_at": 3}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report([run], tmp_path / "report").read_text()
    assert text.count(IMAGES_PER_S) == 1 and "| images/s (median over the run) |" in text
    assert {f for f in figures if f.endswith(".png")} == {"loss.png", "probe.png", "throughput.png"}
    assert all(figures[name][0] for name in figures if name.endswith(".png"))
    assert figures["loss.png"] == ("Training loss", ["demo/dino_tiny", "resumed from the step 3 checkpoint"])
    assert figures["throughput.png"][1] == ["demo/dino_tiny"]  # the resume is marked on the loss plot only
    assert "![Training loss](loss.png)" in text


def test_median_throughput_loss_entropy_kl_side_by_side_and_a_smoothed_probe(tmp_path, figures):
    """The report's images/s was the last logged step (174.6 for a run that went 30-80); the loss plot stood alone
    (DINO reads collapse and the teacher temperature warm-up from entropy and KL); the probe was one batch a point."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(load_recipe("demo/dino_tiny")))
    speeds = [30.0, 50.0, 60.0, 70.0, 80.0, 174.6]
    rows = [
        {
            "step": s,
            "loss": 5.0,
            "teacher_entropy": 4.0,
            "teacher_student_kl": 0.5,
            "images_per_s": v,
            "probe_top1": float(s % 2 * 10),
        }
        for s, v in enumerate(speeds, 1)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report([run], tmp_path / "report").read_text()
    assert "| 65 |" in text or "| 65.0 |" in text  # the median of the six, not the last
    panels = [label for label, _ in figures["loss.png panels"]]
    assert panels == ["training loss", "teacher entropy", "student/teacher KL"]
    ((_, probe_lines),) = figures["probe.png panels"]
    assert probe_lines == ["demo/dino_tiny (each batch)", "demo/dino_tiny (mean of 10 points)"]
