"""A GPU->GPU resume is bit-exact: the toy method of tests/engine/engine_toy.py (DINO-shaped: EMA teacher, BatchNorm,
frozen last layer in the first 2 steps) trained 5 steps straight on CUDA, and trained 2 steps, checkpointed (DCP),
then loaded by a fresh method and engine that train the 3 others, give identical losses and weights (student and
teacher, `torch.equal`): DDP and FSDP2 on 1 GPU, and on 2 GPUs over NCCL (there the parameters: each rank keeps
its own BatchNorm statistics, no SyncBN in the toy, and the checkpoint holds one rank's copy of a replicated buffer,
as in tests/engine/test_engine_mesh_resume.py).

Deterministic settings (gpu_jobs.deterministic): `torch.use_deterministic_algorithms(True, warn_only=True)`,
`CUBLAS_WORKSPACE_CONFIG=:4096:8` and TF32 off; the toy has no dropout or other random op. Both runs do the same
work in the same order on the same device, so anything short of equality is state the checkpoint lost (optimizer
moments and step counts, the teacher, BatchNorm statistics)."""

import pytest
import torch
from engine_toy import STEPS, ToyMethod, engine_run, many, resume_job, spawn
from gpu_env import DEVICE
from gpu_jobs import deterministic

pytestmark = pytest.mark.gpu

ENGINES = {"ddp": {"kind": "ddp"}, "fsdp2": {"kind": "fsdp2"}}
SPLIT = 2  # steps before the checkpoint: the last layer is still frozen then, and trains after the resume
PARAMS = {part: {n for n, _ in getattr(ToyMethod(), part).named_parameters()} for part in ("student", "teacher")}


def runs(world: int, tmp) -> dict:
    calls = []
    for engine, kw in ENGINES.items():
        calls += [(engine_run, kw, {}, STEPS), (resume_job, kw, str(tmp / f"ckpt_{engine}"), SPLIT)]
    results = spawn(deterministic, many, calls, world=world, tmp_path=tmp, device=DEVICE)
    return {engine: (results[2 * i], results[2 * i + 1]) for i, engine in enumerate(ENGINES)}


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    return runs(1, tmp_path_factory.mktemp("resume1"))


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory):
    return runs(2, tmp_path_factory.mktemp("resume2"))


def assert_identical(straight: dict, resumed: dict, params_only: bool = False) -> None:
    assert len(resumed["losses"]) == STEPS
    assert resumed["losses"] == straight["losses"]  # floats, compared exactly
    for part in ("student", "teacher"):
        assert resumed[part].keys() == straight[part].keys()
        names = PARAMS[part] if params_only else straight[part].keys()
        different = [k for k in names if not torch.equal(resumed[part][k], straight[part][k])]
        assert not different, f"{part} differs after resume: {different}"


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_on_one_gpu_is_bit_exact(one_gpu, engine):
    assert_identical(*one_gpu[engine])


@pytest.mark.multigpu
@pytest.mark.parametrize("engine", ENGINES)
def test_resume_on_two_gpus_is_bit_exact(two_gpus, engine):
    assert_identical(*two_gpus[engine], params_only=True)
