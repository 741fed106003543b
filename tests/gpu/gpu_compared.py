"""What the GPU tests compared with the CPU, kept for the device check (tools/device-check's compared.json): a GPU
run returns only a few files, and work without a GPU goes on from them."""

import json
import os


def record_compared(run: dict, ref: dict, tol: float, keep: int = 5) -> None:
    """Where SCALE_GPU_TESTS_COMPARED names a file (tools/device-check), append one JSON line: this test's largest
    differences from the CPU (the `keep` tensors farthest from it, with their first values on both devices), so
    that work without a GPU can go on from what a GPU run compared."""
    path = os.environ.get("SCALE_GPU_TESTS_COMPARED")
    if not path:
        return
    tensors = []
    for part in ("student", "teacher"):
        for name, value in ref[part].items():
            got = run[part].get(name)
            if got is None or not value.is_floating_point() or got.shape != value.shape:
                continue
            diff = (got.float() - value.float()).abs()
            tensors.append({"tensor": f"{part} {name}", "shape": list(value.shape), "max_abs": float(diff.max()),
                            "over_tol": float((diff > tol).float().mean()), "got": got.flatten()[:6].tolist(),
                            "cpu": value.flatten()[:6].tolist()})  # fmt: skip
    tensors.sort(key=lambda t: -t["max_abs"])
    losses = max((abs(a - b) for a, b in zip(run["losses"], ref["losses"], strict=False)), default=0.0)
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
    line = {"test": test, "tol": tol, "loss_max_abs": losses, "tensors": tensors[:keep]}
    with open(path, "a") as f:  # one short write per line: xdist workers append to the same file
        f.write(json.dumps(line) + "\n")
