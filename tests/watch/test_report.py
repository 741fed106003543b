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
    assert text.count(IMAGES_PER_S) == 1 and "| images/s (last logged step) |" in text
    assert set(figures) == {"loss.png", "probe.png", "throughput.png"}
    assert all(title for title, _ in figures.values())
    assert figures["loss.png"] == ("Training loss", ["demo/dino_tiny", "resumed from the step 3 checkpoint"])
    assert figures["throughput.png"][1] == ["demo/dino_tiny"]  # the resume is marked on the loss plot only
    assert "![Training loss](loss.png)" in text
