"""tools/device-check --dry-run: every stage of the GPU machine's check (environment, preflight, the GPU tests'
CPU self-check, benchmarks of an eager and a compiled setting, real JPEG shards against synthetic data, a profiled
step) runs on the CPU with tiny shapes,
and its summaries hold what each stage measured. The real mode differs only in its device, shapes and selection."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "device-check"
JUNIT = """<testsuites><testsuite>
<testcase classname="tests.gpu.m" name="test_a[fp16-x]"><error message="failed on setup with spawn">
E   torch.multiprocessing.spawn.ProcessRaisedException:
E     File "x.py", line 1
E   RuntimeError: output with shape [] doesn't match</error></testcase>
<testcase classname="tests.gpu.m" name="test_a[fp16-y]"><error message="failed on setup">
E   RuntimeError: output with shape [] doesn't match</error></testcase>
<testcase classname="tests.gpu.m" name="test_b"><failure message="AssertionError: w">E   AssertionError: w</failure></testcase>
<testcase classname="tests.gpu.m" name="test_c"><skipped message="tests/gpu/c.py:3: needs 2 CUDA devices"/></testcase>
<testcase classname="tests.gpu.m" name="test_d"/>
</testsuite></testsuites>"""


def load_tool():
    loader = importlib.machinery.SourceFileLoader("device_check", str(TOOL))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("device_check", loader))
    loader.exec_module(module)
    return module


def test_failures_are_grouped_by_their_cause(tmp_path):
    tool = load_tool()
    (tmp_path / "t.xml").write_text(JUNIT)
    result = tool.junit_counts(tmp_path / "t.xml")
    assert (result["passed"], result["failed"], result["skipped"]) == (1, 3, 1)
    assert result["skip_reasons"] == {"needs 2 CUDA devices": 1}
    lines = tool.test_lines(result)
    assert lines[1] == "  FAILED 2: RuntimeError: output with shape [] doesn't match"  # the rank's error, not spawn's
    assert lines[2:4] == ["    tests.gpu.m::test_a[fp16-x]", "    tests.gpu.m::test_a[fp16-y]"]
    assert lines[4] == "  FAILED 1: AssertionError: w"


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, out


@pytest.mark.slow
def test_every_stage_passes_and_the_summary_is_printed_last(checked):
    proc, out = checked
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert proc.stdout.rstrip().endswith(summary.rstrip())  # the console's tail is the summary
    for stage in ("env", "preflight", "tests", "bench", "data", "profile"):
        assert f"  {stage}" in summary and (out / f"{stage}.log").is_file()


@pytest.mark.slow
def test_the_summary_holds_each_stages_numbers(checked):
    _, out = checked
    stages = json.loads((out / "summary.json").read_text())["stages"]
    assert {name: record["status"] for name, record in stages.items()} == {
        "wheels": "skipped",
        "env": "ok",
        "preflight": "ok",
        "tests": "ok",
        "bench": "ok",
        "data": "ok",
        "profile": "ok",
    }
    env = stages["env"]["result"]
    assert env["packages"]["torch"] and env["import_failures"] == {}
    preflight = stages["preflight"]["result"]
    assert preflight["all_reduce"] == "gloo ok" and preflight["bf16_matmul_tflops"] > 0
    tests = stages["tests"]["result"]
    assert tests["passed"] >= 1 and tests["failed"] == 0
    rows = stages["bench"]["rows"]
    assert [row["name"] for row in rows] == ["dino_tiny_eager", "mocov3_bn_tiny_compile"]
    assert all(row["images_per_s"] > 0 and row["flops_per_step"] > 0 for row in rows)
    assert rows[1]["compile_s"] > 0 and rows[0]["compile_s"] == 0
    data = stages["data"]["result"]
    assert data["images"] == 480 and data["workers"] == 2
    assert data["real"] > 0 and data["synthetic"] > 0 and data["ratio"] == round(data["real"] / data["synthetic"], 3)
    assert stages["profile"]["result"]["step_ms"] > 0


@pytest.mark.slow
def test_a_stage_past_the_deadline_is_skipped_not_run(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--dry-run", "--out", str(tmp_path), "--deadline", "5", "--stages", "env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    record = json.loads((tmp_path / "summary.json").read_text())["stages"]["env"]
    assert record == {"status": "skipped", "reason": "no time left before the deadline", "seconds": 0.0}
