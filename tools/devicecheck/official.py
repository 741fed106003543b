"""Issue 44 item 4: facebookresearch/dino's own training step, timed at the same per-GPU batch, crops and precision
as scale's bench, on synthetic images made once on the device.

The code is the official checkout's (vision_transformer.vit_*, DINOHead, utils.MultiCropWrapper,
utils.get_params_groups, utils.clip_gradients, utils.cancel_gradients_last_layer, main_dino.DINOLoss, AdamW over
its parameter groups, the student in DDP as main_dino.train_dino wraps it), exported by `tools/device-wheels` into
the git-ignored `.official/dino` and carried to the machine, never copied into this repository. The loop below is
main_dino.train_one_epoch's body (main_dino.py, train_one_epoch) with its data loader, schedules' lookup and
logging left out, except what costs device time: the `loss.item()` finiteness check and the per-step
`torch.cuda.synchronize()` + `loss.item()` of its logger. The one change: its autocast is fp16 with a GradScaler
(`--use_fp16`), ours bf16, so the official code runs `torch.autocast(dtype=bfloat16)` and no scaler, as scale's
bf16 does. Settings are main_dino's defaults (out_dim 65536, norm_last_layer, no BN in the head, drop_path 0.1,
teacher temperature 0.04, clip 3.0, freeze_last_layer 1, momentum 0.996) with scale's crop count."""

import math
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2] / ".official" / "dino"


def load(root: Path = ROOT):
    """The official modules (main_dino imports `utils` and `vision_transformer` by their top-level names)."""
    if not (root / "main_dino.py").is_file():
        raise FileNotFoundError(f"{root}: no official DINO checkout (make device-wheels exports it)")
    sys.path.insert(0, str(root))
    import main_dino
    import utils
    import vision_transformer

    return main_dino, utils, vision_transformer


def build(device, arch: str, patch: int, out_dim: int, global_crops: int, local_crops: int, root: Path = ROOT):
    """main_dino.train_dino's student, teacher, loss and optimizer (world size 1)."""
    main_dino, utils, vits = load(root)
    student = vits.__dict__[arch](patch_size=patch, drop_path_rate=0.1)
    teacher = vits.__dict__[arch](patch_size=patch)
    student = utils.MultiCropWrapper(student, vits.DINOHead(student.embed_dim, out_dim, use_bn=False))
    teacher = utils.MultiCropWrapper(teacher, vits.DINOHead(teacher.embed_dim, out_dim, use_bn=False))
    student, teacher = student.to(device), teacher.to(device)
    ddp = {"device_ids": [device.index]} if device.type == "cuda" else {}
    student = torch.nn.parallel.DistributedDataParallel(student, **ddp)
    teacher.load_state_dict(student.module.state_dict())
    for p in teacher.parameters():
        p.requires_grad = False
    loss = main_dino.DINOLoss(out_dim, global_crops + local_crops, 0.04, 0.04, 0, 100).to(device)
    optimizer = torch.optim.AdamW(utils.get_params_groups(student))
    return student, teacher, loss, optimizer, utils


def bench(device, batch: int, crops: list[tuple[int, int]], precision: str, steps: int, warmup: int, **model) -> dict:
    """Seconds per step of the official step; crops: [(count, size)], the global crops first."""
    arch, patch, out_dim = model.get("arch", "vit_small"), model.get("patch", 16), model.get("out_dim", 65536)
    (global_crops, _), local = crops[0], crops[1:]
    local_crops = sum(n for n, _ in local)
    student, teacher, dino_loss, optimizer, utils = build(
        device, arch, patch, out_dim, global_crops, local_crops, model.get("root", ROOT)
    )
    gen = torch.Generator(device=device).manual_seed(0)
    images = [torch.randn(batch, 3, s, s, device=device, generator=gen) for n, s in crops for _ in range(n)]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    epoch, lr, wd, momentum, clip, freeze = 1, 5e-4, 0.04, 0.996, 3.0, 1

    def step():
        for i, group in enumerate(optimizer.param_groups):
            group["lr"] = lr
            if i == 0:
                group["weight_decay"] = wd
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            teacher_output = teacher(images[:2])
            student_output = student(images)
            loss = dino_loss(student_output, teacher_output, epoch)
        if not math.isfinite(loss.item()):
            raise SystemExit(f"official DINO step: loss {loss.item()}")
        optimizer.zero_grad()
        loss.backward()
        utils.clip_gradients(student, clip)
        utils.cancel_gradients_last_layer(epoch, student, freeze)
        optimizer.step()
        with torch.no_grad():
            for param_q, param_k in zip(student.module.parameters(), teacher.parameters(), strict=True):
                param_k.data.mul_(momentum).add_((1 - momentum) * param_q.detach().data)
        sync()
        return loss.item()

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    for _ in range(steps):
        started = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - started)
    step_s = sorted(times)[len(times) // 2]
    result = {"step_s": step_s, "images_per_s": batch / step_s, "batch": batch, "losses": losses}
    if device.type == "cuda":
        result["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return result
