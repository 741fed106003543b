"""Issue 46 item 2: why fp32 on the GPU differs from the CPU beyond 1e-4 in DRLoc's `pos_embed` and EsViT-Swin's
`layers.3.blocks.1.mlp.fc2.weight` while the losses agree within 1e-6.

The experiment reruns the GPU tests' own runs (tests/engine/engine_real.py: 4 steps, tiny ViT / tiny Swin, DDP, the
fixed DRLoc pairs, torch.randint drawing from the CPU's generator as test_gpu_engines does) under several precision settings and records, per step, the gradient (before clipping) and the
weight (after the optimizer step) of the named tensors, with the losses and gradient norms. One file,
safetensors (no code runs when it is read): tensors `<variant>/<model>/<step>/<grad|weight>/<tensor>`, the losses in
its metadata. `report()` reads it on the CPU and compares every variant with the CPU's default run.

Variants: the CPU with 1 thread and with all cores (the CPU's own summation-order noise, the yardstick), and
on the GPU: torch's defaults (cuDNN TF32 on, matmul TF32 off), TF32 off everywhere (what the tests set), TF32 off
with SDPA's math kernel only (the CPU's attention algorithm), TF32 off with deterministic kernels, TF32 on
everywhere. A variant that matches the CPU where the others do not names the cause; if every GPU variant is as far
as the CPU's 1-thread run is from its default, the difference is summation order amplified by the optimizer (Adam
divides by sqrt(v): a near-zero gradient's rounding moves its weight by about the learning rate).

What it found on an H200 (2026-11-28, torch 2.11): DRLoc's difference was torch's CUDA avg_pool2d backward of a
channels-last input with padding (pytorch#188344; scale.methods.drloc.pool_grid now pools NCHW memory); Swin's was
one fc2 element whose gradient is 0 up to rounding, moved by Adam's eps 1e-8 (the parity runs now use 1e-6). The
experiment stays a stage: a new difference shows here first, with the variants that name its cause."""

import contextlib
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
SWIN = {"name": "swin_nano", "patch_size": 2, "img_size": 32, "window_size": 4}  # tests/gpu/test_gpu_swin.py
# model label: (method, model settings, the tensors recorded, matched as a suffix of the parameter's name)
MODELS = {
    "drloc": ("drloc", {}, ("pos_embed", "patch_embed.proj.weight")),
    "esvit_swin": ("esvit", SWIN, ("layers.3.blocks.1.mlp.fc2.weight", "patch_embed.proj.weight")),
}
# the spawned rank runs 1 thread (the tests' setting); all the cores sum in another order
CPU_VARIANTS = {"cpu": {"threads": None}, "cpu_all_threads": {"threads": os.cpu_count()}}
GPU_VARIANTS = {
    "gpu_default": {"matmul_tf32": False, "cudnn_tf32": True},
    "gpu_no_tf32": {"matmul_tf32": False, "cudnn_tf32": False},
    "gpu_no_tf32_math_sdpa": {"matmul_tf32": False, "cudnn_tf32": False, "math_sdpa": True},
    "gpu_no_tf32_deterministic": {"matmul_tf32": False, "cudnn_tf32": False, "deterministic": True},
    "gpu_tf32": {"matmul_tf32": True, "cudnn_tf32": True},
}
REFERENCE = "cpu"
ROWS = 32  # rows kept of each recorded tensor (dim 0): seven variants of the whole Swin fc2 are over 16 MiB
WEIGHT_TOL = 1e-4  # the GPU tests' fp32 tolerance


def test_helpers_on_path() -> None:
    """engine_real and its helpers, imported as tests/gpu imports them."""
    for folder in ("tests/engine", "tests/gpu"):
        if str(REPO / folder) not in sys.path:
            sys.path.insert(0, str(REPO / folder))


@contextlib.contextmanager
def switches(matmul_tf32=False, cudnn_tf32=False, math_sdpa=False, deterministic=False, threads=None):
    """One variant's precision settings, restored afterwards (they are process-wide)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_num_threads())
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul_tf32, cudnn_tf32
    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    attention = contextlib.nullcontext()
    if math_sdpa:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        attention = sdpa_kernel(SDPBackend.MATH)
    try:
        with attention:
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_num_threads(saved[2])
        torch.use_deterministic_algorithms(False)


def recording_engines(tensors: dict, targets: tuple[str, ...]):
    """scale.engine.build_engine, wrapped so that each engine's step records the targets' gradients before it and
    their weights after it into `tensors` (keys `<step>/<grad|weight>/<target>`)."""
    import scale.engine

    build = scale.engine.build_engine

    def build_recording(*args, **kwargs):
        engine = build(*args, **kwargs)
        step, calls = engine.step, [0]

        def named():
            for name, param in engine.method.student.named_parameters():
                for target in targets:
                    if name == target or name.endswith("." + target):
                        yield target, param

        def recorded_step(*a, **kw):
            for target, param in named():
                tensors[f"{calls[0]}/grad/{target}"] = param.grad.detach()[:ROWS].float().cpu().clone()
            out = step(*a, **kw)
            for target, param in named():
                tensors[f"{calls[0]}/weight/{target}"] = param.detach()[:ROWS].float().cpu().clone()
            calls[0] += 1
            return out

        engine.step = recorded_step
        return engine

    return build_recording


def run_variants(variants: dict) -> dict:
    """In a spawned rank: every model under every variant; {variant/model/key: tensor} and {variant/model: losses}."""
    test_helpers_on_path()
    from engine_real import real_run
    from gpu_jobs import cpu_draws

    import scale.engine

    tensors, losses = {}, {}
    build = scale.engine.build_engine
    for variant, settings in variants.items():
        for label, (method, model_kw, targets) in MODELS.items():
            recorded = {}
            scale.engine.build_engine = recording_engines(recorded, targets)
            try:
                with switches(**settings):
                    run = cpu_draws(real_run, method, {"kind": "ddp"}, 0, STEPS, model_kw)
            finally:
                scale.engine.build_engine = build
            tensors |= {f"{variant}/{label}/{key}": value for key, value in recorded.items()}
            losses[f"{variant}/{label}"] = {"losses": run["losses"], "grad_norms": run["grad_norms"]}
    return {"tensors": tensors, "losses": losses}


def experiment(out: Path, work: Path, dry: bool) -> dict:
    """The CPU variants in one rank (gloo), the GPU variants in another (NCCL; none in a dry run); one file."""
    test_helpers_on_path()
    from engine_toy import spawn
    from safetensors.torch import save_file

    tensors, losses = {}, {}
    runs = [("cpu", CPU_VARIANTS)] + ([] if dry else [("cuda", GPU_VARIANTS)])
    for device, variants in runs:
        result = spawn(run_variants, variants, world=1, tmp_path=work, device=device)
        tensors |= result["tensors"]
        losses |= result["losses"]
    tensors = {key: value.contiguous() for key, value in tensors.items()}
    save_file(tensors, str(out), metadata={"losses": json.dumps(losses), "torch": torch.__version__})
    return {"file": out.name, "tensors": len(tensors), "bytes": out.stat().st_size, "variants": len(losses) // 2}


# ---- the analysis, on the CPU ----


def load(path: Path) -> tuple[dict, dict]:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        losses = json.loads(f.metadata()["losses"])
        return {key: f.get_tensor(key) for key in f.keys()}, losses


def compare(ref: dict, other: dict, prefix_ref: str, prefix_other: str, target: str, step: int) -> dict:
    """One target at one step of two runs: gradient and weight differences; where the weights differ beyond
    WEIGHT_TOL, how large those elements' gradients are beside the rest's (small ones: the optimizer's amplification)."""
    g_ref, g = ref[f"{prefix_ref}/{step}/grad/{target}"], other[f"{prefix_other}/{step}/grad/{target}"]
    w_ref, w = ref[f"{prefix_ref}/{step}/weight/{target}"], other[f"{prefix_other}/{step}/weight/{target}"]
    off = (w - w_ref).abs() > WEIGHT_TOL
    result = {
        "grad_max_abs": float((g - g_ref).abs().max()),
        "grad_rel": float((g - g_ref).norm() / g_ref.norm().clamp_min(1e-30)),
        "weight_max_abs": float((w - w_ref).abs().max()),
        "weight_off_fraction": float(off.float().mean()),
    }
    if off.any() and not off.all():
        result["median_abs_grad_off"] = float(g_ref.abs()[off].median())
        result["median_abs_grad_rest"] = float(g_ref.abs()[~off].median())
    return result


def analyse(path: Path) -> dict:
    """{model: {target: {variant: [per-step comparison with the CPU's default run]}}, losses' largest differences}."""
    tensors, losses = load(path)
    variants = sorted({key.split("/")[0] for key in tensors} - {REFERENCE})
    result = {}
    for label, (_, _, targets) in MODELS.items():
        ref_losses = losses[f"{REFERENCE}/{label}"]["losses"]
        result[label] = {"loss_max_abs": {}, "targets": {}}
        for variant in variants:
            got = losses[f"{variant}/{label}"]["losses"]
            result[label]["loss_max_abs"][variant] = max(abs(a - b) for a, b in zip(got, ref_losses, strict=True))
        for target in targets:
            result[label]["targets"][target] = {
                variant: [
                    compare(tensors, tensors, f"{REFERENCE}/{label}", f"{variant}/{label}", target, step)
                    for step in range(STEPS)
                ]
                for variant in variants
            }
    return result


def report(path: Path) -> list[str]:
    """The analysis as lines: per model and tensor, each variant's last-step weight and gradient differences."""
    lines = [f"fp32 experiment {path.name}: every variant against the CPU's default run ({STEPS} steps)"]
    for label, model in analyse(path).items():
        losses = ", ".join(f"{v} {d:.1e}" for v, d in model["loss_max_abs"].items())
        lines.append(f"{label}: largest loss difference: {losses}")
        for target, variants in model["targets"].items():
            lines.append(f"  {target}: step-by-step weight max |diff| (fraction > {WEIGHT_TOL:g}); last grad rel")
            for variant, steps in variants.items():
                per_step = " ".join(f"{s['weight_max_abs']:.1e}({s['weight_off_fraction']:.0%})" for s in steps)
                last = steps[-1]
                amplified = ""
                if "median_abs_grad_off" in last:
                    amplified = (
                        f"; median |grad| of those off {last['median_abs_grad_off']:.1e} vs the rest "
                        f"{last['median_abs_grad_rest']:.1e}"
                    )
                lines.append(f"    {variant:28s} {per_step}; grad rel {last['grad_rel']:.1e}{amplified}")
    return lines


def main(argv: list[str]) -> int:
    """python3 tools/devicecheck/fp32.py FILE: the report of a device check's fp32.safetensors."""
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: tools/devicecheck/fp32.py FP32_SAFETENSORS (from a device check's OUT)", file=sys.stderr)
        return 2
    print("\n".join(report(Path(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
