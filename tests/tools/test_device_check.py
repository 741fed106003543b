"""tools/device-check: its parsers and summaries on fixtures (JUnit XML, a chrome trace, measured rows, the fp32
experiment's file), in process; and --dry-run: every stage of the GPU machine's check (environment, preflight, the
fp32 experiment's CPU runs, the GPU tests' CPU self-check, benchmarks of an eager and a compiled setting with the
official DINO step beside the first, a profiled step) runs on the CPU with tiny shapes, its summaries hold what each
stage measured, and no more files come back than the device tool returns. The real mode differs only in its device,
shapes and selection, and in starting a process per stage where the dry run calls the same entry points in its own
interpreter (pytest's stage stays a process in both)."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

TOOL = Path(__file__).resolve().parents[2] / "tools" / "device-check"
sys.path.insert(0, str(TOOL.parent))  # tools/devicecheck
sys.path.insert(0, str(TOOL.parents[1] / "tests" / "gpu"))  # the GPU tests' helpers
from devicecheck import fp32, rows, trace  # noqa: E402
from gpu_compared import record_compared  # noqa: E402

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
    result = tool.junit_counts(tmp_path / "t.xml") | {"not_reached": [], "deselected_multigpu": 2}
    assert (result["passed"], result["failed"], result["skipped"]) == (1, 3, 1)
    assert result["skip_reasons"] == {"needs 2 CUDA devices": 1}
    lines = tool.test_lines(result)
    assert lines[0] == "tests: 1 passed, 3 failed, 1 skipped, 0 not reached (2 need 2 GPUs: not selected)"
    assert lines[1] == "  FAILED 2: RuntimeError: output with shape [] doesn't match"  # the rank's error, not spawn's
    assert lines[2:4] == ["    tests.gpu.m::test_a[fp16-x]", "    tests.gpu.m::test_a[fp16-y]"]
    assert lines[4] == "  FAILED 1: AssertionError: w"
    assert result["failures"][0]["first_lines"][0].startswith("torch.multiprocessing.spawn.ProcessRaisedException")


def test_every_collected_test_that_did_not_report_is_listed_as_not_reached(tmp_path):
    tool = load_tool()
    (tmp_path / "t.xml").write_text(JUNIT)
    reported = tool.junit_counts(tmp_path / "t.xml")["reported"]
    selected = ["tests/gpu/m.py::test_a[fp16-x]", "tests/gpu/m.py::test_d", "tests/gpu/m.py::test_e[bf16]"]
    missing = tool.not_reached(selected, reported, {"status": "timeout", "exit": None})
    assert [entry["test"] for entry in missing] == ["tests/gpu/m.py::test_e[bf16]"]
    assert "time limit" in missing[0]["why"]
    (tmp_path / "c").mkdir()
    for worker in ("gw0", "gw1"):  # every xdist worker collects the whole selection
        (tmp_path / "c" / f"{worker}.json").write_text(json.dumps({"selected": selected, "deselected": ["x"]}))
    assert tool.read_collected(tmp_path / "c") == (selected, ["x"])


def test_the_gpu_tests_comparisons_come_back_worst_first(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALE_GPU_TESTS_COMPARED", str(tmp_path / "compared.jsonl"))
    ref = {"losses": [1.0, 2.0], "student": {"w": torch.zeros(3), "step": torch.tensor(4)}, "teacher": {}}
    for label, off in (("close", 1e-6), ("far", 6e-4)):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", f"tests/gpu/m.py::test_{label} (call)")
        run = {"losses": [1.0, 2.0 + off], "student": {"w": torch.tensor([0.0, off, 0.0]), "step": torch.tensor(4)}}
        record_compared(run | {"teacher": {}}, ref, tol=1e-4)
    got = load_tool().read_compared(tmp_path / "compared.jsonl")["runs"]
    assert [entry["test"] for entry in got] == ["tests/gpu/m.py::test_far", "tests/gpu/m.py::test_close"]
    (far,) = got[0]["tensors"]  # the integer step counter is not a compared float
    assert far["tensor"] == "student w" and far["max_abs"] == pytest.approx(6e-4)
    assert far["over_tol"] == pytest.approx(1 / 3) and far["got"][1] == pytest.approx(6e-4)
    assert got[0]["loss_max_abs"] == pytest.approx(6e-4)


# a chrome trace as torch.profiler exports it: two kernels overlapping on two streams, a copy, a CPU op (not device
# time) and a kernel after a 35 us gap; durations in us
TRACE = {
    "traceEvents": [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 100},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 10},
        {"ph": "X", "cat": "kernel", "name": "softmax", "ts": 5, "dur": 10},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20, "dur": 5},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 60, "dur": 10},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 80},
    ]
}


def test_device_busy_is_the_union_of_kernel_intervals_not_their_sum(tmp_path):
    (tmp_path / "trace.json").write_text(json.dumps(TRACE))
    got = trace.summarise(trace.read(tmp_path / "trace.json"), window_us=100.0, steps=2)
    assert got["busy_us"] == 30.0 and got["device_busy"] == 0.3  # the overlap counted once (a sum gives 35)
    assert (got["kernels"], got["kernels_per_step"]) == (4, 2.0)
    assert got["largest_gaps_us"] == [35.0, 5.0] and got["gaps_over_20us"] == 1
    assert got["idle_in_gaps_over_20us"] == 35.0
    assert got["top_kernels"][0] == {"name": "gemm", "us": 20.0, "share": round(20 / 30, 4), "calls": 2}
    assert trace.summarise({"traceEvents": []}) == {"kernels": 0}


ROW = {"images_per_s": 282.0, "step_s": 0.227, "flops_per_step": 64 * 123.8e9, "global_batch": 64, "world": 1}
ROW |= {"peak_flops_per_device": 989e12, "peak_bytes": 9.4 * 2**30}
SETTING = {"recipe": "dino/table2/vit_s16", "engine": "ddp", "batch_per_gpu": 64, "precision": "bf16"}
SETTING |= {"compile": False, "activation_checkpointing": "none", "crops": "2x224+10x96"}
CONTRACT_KEYS = ["date", "card", "torch", "commit", "setting", "images_per_s", "step_s", "flops_per_image"]
CONTRACT_KEYS += ["mfu_datasheet", "mfu_measured_peak", "peak_memory_gib", "source"]


def test_measured_rows_have_the_planners_shape_and_fold_into_the_table_once(tmp_path):
    row = rows.measured_row(ROW, SETTING, "NVIDIA H100 80GB HBM3", "2.11.0+cu130", None, 790.0)
    assert list(row) == CONTRACT_KEYS
    assert row["flops_per_image"] == 123.8e9 and row["peak_memory_gib"] == 9.4
    assert (row["mfu_datasheet"], row["mfu_measured_peak"]) == (0.0353, 0.0442)  # issue 44's table: 3.5% / 4.4%
    (tmp_path / "measured_rows.yaml").write_text(rows.dump([row]))
    table = tmp_path / "measured.yaml"
    table.write_text("# the planner's table\n- {card: A100, setting: {recipe: x}}\n")
    assert rows.fold(tmp_path / "measured_rows.yaml", table) == 1
    assert rows.fold(tmp_path / "measured_rows.yaml", table) == 0  # already there
    text = table.read_text()
    assert text.startswith("# the planner's table\n") and yaml.safe_load(text)[1] == row


def test_fold_rows_of_a_file_that_is_no_rows_exits_2_naming_it(tmp_path, capsys):
    bad = tmp_path / "rows.yaml"
    bad.write_text("just: a mapping\n")
    assert load_tool().main(["--fold-rows", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "not a list of measured rows" in err and "Traceback" not in err


def fp32_file(path: Path, off_rows: int) -> None:
    """An fp32 experiment's file: the CPU run and a GPU variant whose weights differ by 1e-3 in the first
    `off_rows` rows of every recorded tensor at every step, where the gradients are the smallest."""
    from safetensors.torch import save_file

    tensors, losses = {}, {}
    for label, (_, _, targets) in fp32.MODELS.items():
        for variant in ("cpu", "gpu_default"):
            losses[f"{variant}/{label}"] = {"losses": [1.0] * fp32.STEPS, "grad_norms": [1.0] * fp32.STEPS}
            for step in range(fp32.STEPS):
                for target in targets:
                    grad = torch.ones(8, 4)
                    grad[:off_rows] = 1e-8
                    weight = torch.zeros(8, 4)
                    if variant != "cpu":
                        weight[:off_rows] += 1e-3
                    tensors[f"{variant}/{label}/{step}/grad/{target}"] = grad
                    tensors[f"{variant}/{label}/{step}/weight/{target}"] = weight
    save_file(tensors, str(path), metadata={"losses": json.dumps(losses)})


def test_the_fp32_report_names_how_far_each_variant_is_and_where(tmp_path):
    fp32_file(tmp_path / "fp32.safetensors", off_rows=2)
    got = fp32.analyse(tmp_path / "fp32.safetensors")
    last = got["drloc"]["targets"]["pos_embed"]["gpu_default"][-1]
    assert last["weight_off_fraction"] == 0.25 and last["weight_max_abs"] == pytest.approx(1e-3)
    assert (last["median_abs_grad_off"], last["median_abs_grad_rest"]) == (pytest.approx(1e-8), 1.0)
    lines = fp32.report(tmp_path / "fp32.safetensors")
    assert any(line.strip().startswith("gpu_default") and "(25%)" in line for line in lines), lines
    assert fp32.main([str(tmp_path / "missing")]) == 2


def test_a_dry_run_stage_in_this_interpreter_reports_as_its_process_would(tmp_path, capsys, monkeypatch):
    """The dry run runs its bodies and scale's CLI in the check's interpreter (in_process): the exit code, output,
    limit, working directory and environment as the stage's own process would have them; pytest keeps its process."""
    tool = load_tool()
    body = [sys.executable, str(TOOL), "--body", "env", "x.json", "--dry-run"]
    assert tool.in_process(body) and tool.in_process([sys.executable, "-m", "scale.cli", "bench", "r"])
    assert tool.in_process([sys.executable, "-m", "pytest", "tests/gpu"]) is None

    def printed():
        print("to the log", os.getcwd() == str(tool.REPO), os.environ["STAGE_ONLY"])
        return 3

    def exits():
        raise SystemExit("a body's own message")

    def hangs():
        import time

        time.sleep(30)

    monkeypatch.chdir(tmp_path)  # the stage runs in the checkout, as `tee`'s process does
    cwd, environ, path = os.getcwd(), dict(os.environ), tmp_path / "check.log"
    with open(path, "w") as log:
        codes = [tool.run_in_process(entry, ["x"], {"STAGE_ONLY": "1"}, log, 1) for entry in (printed, exits, hangs)]
        codes.append(tool.run_in_process(lambda: 1 / 0, ["x"], {}, log, 10))
    assert codes == [3, 1, None, 1]  # None: `Run.command` records a timeout
    text = path.read_text()
    assert "to the log True 1" in text and "a body's own message" in text and "ZeroDivisionError" in text
    assert "x: stopped at its limit of 1 s" in text and text in capsys.readouterr().out  # tee'd to the console
    assert os.getcwd() == cwd and dict(os.environ) == environ


ALL_STAGES = "env,preflight,fp32,tests,profile,bench,host,data"  # the default ones and data


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    out = tmp_path_factory.mktemp("device-check")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--dry-run", "--out", str(out), "--stages", ALL_STAGES],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    return proc, out


@pytest.mark.slow
def test_every_stage_passes_and_the_summary_is_printed_last(checked):
    proc, out = checked
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = (out / "summary.txt").read_text()
    assert proc.stdout.rstrip().endswith(summary.rstrip())  # the console's tail is the summary
    for stage in ALL_STAGES.split(","):
        assert f"  {stage}" in summary and f"==== {stage}/" in (out / "check.log").read_text() or stage == "host"
    assert "card: no GPU (CPU)" in summary and "not run on one GPU (covered instead by):" in summary
    # what comes back from the device: at most 8 files, each one the check names
    files = sorted(path.name for path in out.iterdir())
    assert len(files) <= 8 and set(files) <= set(load_tool().FILES), files


@pytest.mark.slow
def test_the_summary_holds_each_stages_numbers(checked):
    _, out = checked
    summary = json.loads((out / "summary.json").read_text())
    stages = summary["stages"]
    assert {name: record["status"] for name, record in stages.items()} == {
        "wheels": "skipped",
        "env": "ok",
        "preflight": "ok",
        "fp32": "ok",
        "tests": "ok",
        "profile": "ok",
        "bench": "ok",
        "host": stages["host"]["status"],  # skipped where this checkout has no `scale bench host`
        "data": "ok",
    }
    assert stages["host"]["status"] in ("ok", "skipped")
    env = stages["env"]["result"]
    assert env["packages"]["torch"] and env["import_failures"] == {}
    preflight = stages["preflight"]["result"]
    assert preflight["all_reduce"] == "gloo ok" and preflight["bf16_matmul_tflops"] > 0
    assert stages["fp32"]["result"]["variants"] == 2 and (out / "fp32.safetensors").is_file()
    assert fp32.analyse(out / "fp32.safetensors")["drloc"]["targets"]["pos_embed"]["cpu_all_threads"]
    tests = stages["tests"]["result"]
    assert tests["passed"] >= 1 and tests["failed"] == 0 and tests["not_reached"] == []
    assert (out / "tests.xml").is_file()
    bench = stages["bench"]
    assert [row["name"] for row in bench["rows"]] == ["dino_tiny_eager", "mocov3_bn_tiny_compile"]
    assert all(row["images_per_s"] > 0 and row["flops_per_step"] > 0 for row in bench["rows"])
    assert bench["rows"][1]["compile_s"] > 0 and bench["rows"][0]["compile_s"] == 0
    official = bench["settings"]["official_dino"]
    if (TOOL.parents[1] / ".official" / "dino").is_dir():  # make device-wheels exports it
        assert official["status"] == "ok" and official["result"]["images_per_s"] > 0
        assert official["result"]["beside"] == "dino_tiny_eager" and official["result"]["batch"] == 8
    else:
        assert official["status"] == "skipped"
    measured = yaml.safe_load((out / "measured_rows.yaml").read_text())
    assert [list(row) for row in measured] == [CONTRACT_KEYS] * 2 and measured[0]["card"] == "cpu"
    assert measured[0]["setting"]["crops"] == "2x64+4x32" and len(summary["measured_rows"]) == 2
    # the engine that ran: the tiny recipes' fsdp2 runs as DDP on one rank (scale.engine.kinds.runs_as)
    assert [row["setting"]["engine"] for row in measured] == ["ddp", "ddp"]
    profile = stages["profile"]["result"]
    assert profile["step_ms"] > 0 and profile["trace"].startswith("trace.json.gz")
    data = stages["data"]["result"]
    assert data["images"] == 480 and data["workers"] == 2
    assert data["real"] > 0 and data["synthetic"] > 0 and data["ratio"] == round(data["real"] / data["synthetic"], 3)


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


def test_the_bench_summary_puts_every_setting_of_the_official_steps_batch_beside_it():
    """The official step runs beside the first setting; the compiled and CUDA-graph settings of the same model and
    batch get their ratio to it too (issue 44's 3x is at the same batch, crops and precision), other batches none."""
    tool = load_tool()
    base = {"step_s": 0.1, "world": 1, "flops_per_step": 1e12, "mfu": 0.1, "compile_s": 0.0, "peak_source": "x"}
    rows_in = [
        {**base, "name": "dino_vit_s16_ddp_b64", "images_per_s": 880.0},
        {**base, "name": "dino_vit_s16_ddp_b256", "images_per_s": 1250.0},
        {**base, "name": "dino_vit_s16_ddp_b64_compiled_reduce-overhead", "images_per_s": 1232.0},
    ]
    result = {"model": {"arch": "vit_small"}, "batch": 64, "crops": [(2, 224), (10, 96)], "precision": "bf16"}
    result |= {"beside": "dino_vit_s16_ddp_b64", "images_per_s": 440.0}
    lines = tool.bench_lines(rows_in, {"status": "ok", "result": result}, {}, "NVIDIA H200")
    assert lines[0] == "bench on NVIDIA H200 (synthetic data, 1 device):"
    assert "scale / official = 2.00x (goal >= 3x)" in lines[-2]
    assert lines[-1] == "  scale / official at the same batch: dino_vit_s16_ddp_b64_compiled_reduce-overhead 2.80x"


def test_tests_deselected_by_pytest_args_are_not_called_two_gpu_tests():
    tool = load_tool()
    result = {"passed": 4, "failed": 0, "skipped": 1, "not_reached": [], "deselected_multigpu": 122, "failures": []}
    result |= {"skip_reasons": {}, "slowest": []}
    assert tool.test_lines(result)[0].endswith("(122 need 2 GPUs: not selected)")
    assert tool.test_lines({**result, "selected_by_args": True})[0].endswith(
        "(122 not selected: 2 GPUs or --pytest-args)"
    )
