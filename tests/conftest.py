"""Shared test set-up: one thread per process (the machine has 2 cores and tests spawn process pairs), the embedded
data sets, built once per session (once per xdist worker), and how `make test` shares the tests out between its two
workers."""

import os
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
# every Python process a test starts prints its threads' stacks when it dies of a fatal signal
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from tests import fork_server  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def trace_cache(tmp_path_factory) -> Path:
    """The planner's trace cache (scale.bench.trace_cache, under $XDG_CACHE_HOME) in a folder of the session, not the
    user's ~/.cache: the processes a test starts inherit it."""
    folder = tmp_path_factory.mktemp("xdg_cache")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    return folder


@pytest.fixture(scope="session", autouse=True)
def fork_server_stopped():
    """The worker's fork server (tests/fork_server.py: started at its first launch) stopped at the session's end;
    it would also exit with the worker (its parent-death signal)."""
    yield
    fork_server.stop()


@pytest.fixture(scope="session")
def embedded_data(tmp_path_factory) -> Path:
    """SCALE_DATA root with the embedded digits and photos shards (root/embedded/NAME/{train,val}), built once per
    test session and shared: tests read it, and write only beside it (a fixture imported into several modules
    would be one fixture per module, built once per module)."""
    from scale.data.embedded import build

    root = tmp_path_factory.mktemp("data")
    for name in ("digits", "photos"):
        build(name, root / "embedded" / name)
    return root


@pytest.fixture(scope="module")
def group():
    """A single-process group (world size 1, gloo on the CPU) for the module's in-process Trainer and step tests:
    (ParallelContext, device), as the training entry builds them. The GPU modules define their own, which also
    check the device."""
    from scale.engine.dist import shutdown
    from scale.engine.parallel import init_parallel

    info, device = init_parallel()
    yield info, device
    shutdown()


# Modules that share one session fixture run on one worker: the Slurm modules share one local cluster (a second
# worker would start it again while the first uses it). Every other module is its own unit, and its tests stay
# together so that module fixtures are built once; the checkpoint modules' reference run (a session fixture) is
# trained once on each worker that runs one of them, a launch of ~13 CPU s, where keeping their ~60 launches on one
# worker left the other idle at the end.
SHARED_SCOPES = ("tests/slurm/",)
# The modules that load every recipe as it is share one worker and its cache of them (tests/helpers_recipes.py: each
# recipe loaded once, not four times over), as one unit named after the longest of them.
EVERY_RECIPE = (
    "tests/recipes/test_recipes_smoke.py",
    "tests/recipes/test_recipes_check.py",
    "tests/bench/test_plan_submit_agree.py",
)
GPU_TESTS = "tests/gpu/"


def xdist_scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith(GPU_TESTS):
        # one unit per test function and fixture parameter: a GPU module's runs share one device, and its module
        # fixtures (each a batch of runs in one process) are built on as many workers as there are units using them
        return nodeid.split("[", 1)[0] + "".join(p for p in ("[bf16", "[fp16") if p in nodeid)
    if path in EVERY_RECIPE:
        return EVERY_RECIPE[0]
    return next((shared for shared in SHARED_SCOPES if path.startswith(shared)), path)


# The longest units first (each over a minute on an idle 2-core machine; the run_train modules' times as the CI log
# of 2026-11-27 gave them less the ~15 CPU s per launch that forking the launcher saves), so that neither worker
# starts one while the other is finishing; the rest follow in collection order and fill the gaps.
LONGEST_FIRST = (
    "tests/recipes/test_recipes_smoke.py",
    "tests/slurm/",
    "tests/checkpoint/test_steering_runs.py",
    "tests/demo/test_demo.py",
    "tests/tools/test_device_check.py",
    "tests/test_quiet.py",
    "tests/checkpoint/test_disk_full.py",
    "tests/launch/test_launcher_signals.py",
    "tests/engine/test_compile.py",
    "tests/bench/test_bench_measure.py",
    "tests/checkpoint/test_resume.py",
    "tests/checkpoint/test_faults.py",
    "tests/loop/test_step_sync.py",
    "tests/eval/test_dino_beats_random_init.py",
    "tests/checkpoint/test_checksums.py",
    "tests/checkpoint/test_deepspeed_files.py",
    "tests/checkpoint/test_deepspeed_fit.py",
    "tests/checkpoint/test_chaos.py",
    # on a GPU (tools/device-check: 6 workers), the units that took longest on the H100
    "tests/gpu/test_gpu_checkpoint.py::test_checkpoint_moves_between_gpu_and_cpu_bit_exact",
    "tests/gpu/test_gpu_engines.py::test_mixed_precision_is_finite_and_close_to_fp32[bf16",
    "tests/gpu/test_gpu_engines.py::test_mixed_precision_is_finite_and_close_to_fp32[fp16",
    "tests/gpu/test_gpu_engines.py::test_fp32_on_one_gpu_equals_the_cpu",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        scope = xdist_scope(item.nodeid)
        return LONGEST_FIRST.index(scope) if scope in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within a unit, and of the other units, is kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return xdist_scope(nodeid)

    config.option.loadscopereorder = False  # xdist would order the units by their number of tests instead
    return ModuleScheduling(config, log)


# Where the time went, at the end of `make test` (after --durations' slowest tests): each worker's busy time, and
# the units (xdist_scope) that took longest, so that a slow CI run shows which worker and which unit held it up.
_busy: dict[str, float] = {}
_units: dict[str, float] = {}


def pytest_runtest_logreport(report):
    worker = getattr(getattr(report, "node", None), "gateway", None)
    worker = worker.id if worker is not None else "main"
    _busy[worker] = _busy.get(worker, 0.0) + report.duration
    unit = xdist_scope(report.nodeid)
    _units[unit] = _units.get(unit, 0.0) + report.duration


@pytest.hookimpl(trylast=True)  # after --durations' list: the last lines of the log
def pytest_terminal_summary(terminalreporter):
    if not _busy:
        return
    write = terminalreporter.write_line
    terminalreporter.section("time per worker and per unit")
    for worker, seconds in sorted(_busy.items()):
        write(f"{seconds:8.1f} s  worker {worker}")
    for unit, seconds in sorted(_units.items(), key=lambda kv: -kv[1])[:15]:
        write(f"{seconds:8.1f} s  {unit}")
