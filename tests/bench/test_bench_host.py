"""`scale bench host`: the op counter's classification, and the host budget of DINO ViT-S/16 bf16 under DDP (issue
44 item 5), pinned so that a change adding per-parameter work to the step fails here.

The pinned step is DINO's ViT-S/16 recipe with ViT-Ti as backbone (the same 12 blocks and ops at a quarter of the
width), 32 px global and 16 px local crops (the same 2 + 10 crops in two resolutions) and a small head: the counts
equal the full-size step's (they depend on the layers, not on widths or the batch), at a fraction of its CPU time.
"""

import json

import pytest
import torch

from scale.bench.host import OpCounter, Phases
from scale.commands.bench import bench_host

SMALL_VIT_S16 = [
    "engine.kind=ddp",
    "engine.precision=bf16",
    "train.global_batch=2",
    "model.name=vit_tiny",
    "model.img_size=32",
    "data.views.global_size=32",
    "data.views.local_sizes=[16]",
    "method.dino.out_dim=256",
    "method.dino.hidden_dim=64",
    "method.dino.bottleneck_dim=32",
]
# measured on this code (`scale bench host dino/table2/vit_s16` with SMALL_VIT_S16, a non-log step): 1,440 launching,
# 215 casts, 30 launches in clip + optimizer + guard + EMA. Before the student's fused weight casts
# (scale.engine.lowp): 1,616 / 391 / 30; before that 1,725 / 396 / 38; before issue 44's changes: 2,325 launching,
# 502 casts, 350 launches in the optimizer phase (EMA and clipping factors counted one launch per tensor, as CUDA runs
# a foreach op over 0-d factors). Issue 44's targets: <= 1,700 launching, <= 370 casts, <= 30 optimizer-side. The 215
# casts left are the official code's too (docs/explanation/benchmarks.md). Per-parameter work adds about 150 (an op
# per parameter tensor); the student's weights left to autocast again 176 casts; stochastic depth drawn per block
# again 84; DINO's entropy/KL or the embeddings' spread computed on a non-log step 7 or 6.
LAUNCHING, CASTS, OPTIMIZER_SIDE = 1440, 215, 30


@pytest.fixture(scope="module")
def budget(tmp_path_factory):
    out = tmp_path_factory.mktemp("host") / "host.json"
    assert bench_host(["dino/table2/vit_s16", *SMALL_VIT_S16, "--steps", "1", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def test_dino_vit_s16_ddp_bf16_step_keeps_its_host_budget(budget):
    rows = budget["phases"]
    assert rows["total"]["launching"] <= LAUNCHING
    assert rows["total"]["casts"] <= CASTS
    assert sum(rows[p]["launching"] for p in ("clip", "optimizer", "guard", "ema")) <= OPTIMIZER_SIDE
    # per-parameter work anywhere outside forward and backward would show as about one op per parameter
    assert all(rows[p]["ops"] < 40 for p in ("data", "clip", "optimizer", "guard", "ema", "metrics", "other"))
    assert rows["total"]["syncs"] == 0 and rows["total"]["dtensor"] == 0
    assert rows["forward"]["launching"] > 100 and rows["backward"]["launching"] > 100  # the step was counted


def test_the_counter_tells_launches_views_copies_casts_and_syncs():
    phases = Phases()
    x, grads = torch.ones(4, 3), [torch.ones(3), torch.ones(2, 2)]
    with OpCounter(phases) as counter:
        with phases("forward"):
            y = x.t().unsqueeze(0)  # views: no launch
            x.add_(1)
            x.to(torch.bfloat16)
            x.clone()
        with phases("clip"):
            torch._foreach_mul_(grads, 2.0)  # one fused launch
            torch._foreach_mul_(grads, [torch.tensor(0.5), torch.tensor(0.5)])  # 0-d factors: one per tensor
        with phases("metrics"):
            float(y.sum())
    forward, clip, metrics = counter.counts["forward"], counter.counts["clip"], counter.counts["metrics"]
    assert (forward["ops"], forward["launching"]) == (5, 3)  # add_, the cast, clone
    assert (forward["copies"], forward["casts"]) == (2, 1)
    assert clip["launching"] == 1 + len(grads)
    assert (metrics["syncs"], metrics["launching"]) == (1, 1)
