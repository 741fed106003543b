"""The demo story on a reduced budget: shards, k-NN before, training interrupted once and resumed, k-NN after, a
report with plots."""

import json
import subprocess
import types
from pathlib import Path

import pytest

import scale.demo
from scale.demo import run_demo
from scale.readback import read_metrics
from tests import fork_server
from tests.helpers_run import FORKED_RANKS
from tests.trackers.offline_stores import mlflow_runs

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


@pytest.fixture(autouse=True)
def forked_ranks(monkeypatch):
    """The demo's launches (`scale train`, `scale bench`) forked by the fork server and their ranks from the
    launcher (tests/fork_server.py): these tests test the story; the demo's exec'd launches are tested by
    tests/demo/test_demo_signals.py and `make test-wheel`'s `scale demo`."""

    def popen(command, *args, **kwargs):
        if command[1:3] == ["-m", "scale.cli"]:
            return fork_server.popen([command[0], str(FORKED_RANKS), *command[3:]], *args, **kwargs)
        return subprocess.Popen(command, *args, **kwargs)

    monkeypatch.setattr(scale.demo, "subprocess", types.SimpleNamespace(Popen=popen, PIPE=subprocess.PIPE))


def test_demo_story_end_to_end(tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = run_demo("dino", tmp_path, steps=12, nproc=2)
    out = capfd.readouterr().out
    run = tmp_path / "dino"
    assert report == run / "report" / "report.md" and report.is_file()
    text = report.read_text()
    assert "random init" in text and "trained" in text and "| recipe |" in text
    assert "## Benchmark" in text and "engine=ddp" in text and "engine=fsdp2" in text
    assert (run / "bench" / "bench.json").is_file()
    for png in ("loss.png", "throughput.png"):
        assert (run / "report" / png).stat().st_size > 1000
    # DINO Fig. 1 for the demo: the trained ViT's attention next to random init's, shown in the report
    assert "## Attention maps" in text and "![attention_digit0_label0](dino_attention_digit0_label0.png)" in text
    assert (run / "report" / "dino_attention_digit0_label0.png").stat().st_size > 5000
    # interrupted once (preemption signal), resumed, and finished every step exactly once
    assert "interrupted at step" in out and "resuming from its latest checkpoint" in out
    steps = [m["step"] for m in read_metrics(run / "metrics.jsonl")]
    assert max(steps) == 12 and len(set(steps)) == len(steps)
    for rank in (0, 1):  # the signal reached every rank after step 4, a third of the run
        log = (run / "logs" / f"rank{rank}.log").read_text()
        assert "received SIGUSR1" in log and "steps 4..12" in log
    assert (run / "checkpoints" / "step_000000012" / "meta.json").is_file()
    before = json.loads((run / "eval" / "knn_before.json").read_text())
    after = json.loads((run / "eval" / "knn_after.json").read_text())
    assert before["random_init"] and not after["random_init"]
    _assert_knn_reported(before, after, text)
    assert f"random init {before['top1']:.1f}% -> trained {after['top1']:.1f}%" in out


@pytest.mark.parametrize("method", ["mocov3", "esvit", "drloc"])
def test_demo_story_for_the_other_methods(method, tmp_path, capfd, monkeypatch):
    """Without the engine benchmark (the DINO story runs it; it is the same `scale bench` for every method); with
    MLflow (its file store in the run directory), which gets the report and the exported weights at the end."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = run_demo(method, tmp_path, steps=4, nproc=2, bench=False, trackers=["mlflow"])
    out = capfd.readouterr().out
    run = tmp_path / method
    assert report == run / "report" / "report.md" and f"scale demo: {method}" in report.read_text()
    assert "benchmark: skipped" in out and "## Benchmark" not in report.read_text()
    assert not (run / "bench").exists()
    assert "interrupted at step" in out and "resuming from its latest checkpoint" in out
    steps = [m["step"] for m in read_metrics(run / "metrics.jsonl")]
    assert max(steps) == 4 and len(set(steps)) == len(steps)
    before = json.loads((run / "eval" / "knn_before.json").read_text())
    after = json.loads((run / "eval" / "knn_after.json").read_text())
    # four steps inside the first warm-up epoch barely move a momentum teacher: its k-NN numbers may not change
    _assert_knn_reported(before, after, report.read_text(), moved=False)
    client, runs = mlflow_runs(run)
    assert len(runs) == 1
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "loss")] == steps
    artifacts = {a.path for a in client.list_artifacts(runs[0].info.run_id)}
    assert {"report", Path(after["weights"]).name} <= artifacts


def _assert_knn_reported(before: dict, after: dict, report: str, moved: bool = True) -> None:
    """Both k-NN runs measured the same split with the same k, the second one the trained weights (DINO's twelve
    steps move every k's accuracy; a gain is not asserted: tests/eval/test_dino_beats_random_init.py trains long
    enough for one), and the report shows the measured numbers."""
    assert before["random_init"] and not after["random_init"] and after["weights"].endswith(".safetensors")
    assert before["k"] == after["k"] and before["test_samples"] == after["test_samples"] > 0
    if moved:
        assert before["per_k"] != after["per_k"]
    assert f"| random init | {before['top1']:.2f} | {before['top5']:.2f} |" in report
    assert f"| trained | {after['top1']:.2f} | {after['top5']:.2f} |" in report
