"""scale.engine.lowp: the teacher's and the student's Linear and Conv weights held in the autocast dtype give
autocast's outputs and gradients bit for bit, and follow every change of the fp32 weights."""

import contextlib
import copy

import pytest
import torch
from torch import nn

from scale.bench.host import OpCounter, Phases
from scale.engine.lowp import LowPrecisionStudent, LowPrecisionTeacher, block_of, cast_parameters


class TwoPassNet(nn.Module):
    """A patch embedding, two blocks (LayerNorm then Linear, on a residual stream) and a head, run over two inputs
    of different lengths as DINO runs its global and local crops (each weight used by both passes); a frozen layer
    (MoCo v3's patch projection) and a layer the forward never uses."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Conv1d(3, 8, 2, stride=2)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8)) for _ in range(2))
        self.frozen = nn.Linear(8, 8).requires_grad_(False)
        self.unused = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, crops: list[torch.Tensor]) -> torch.Tensor:
        pooled = []
        for x in crops:
            x = self.frozen(self.embed(x).transpose(1, 2))
            for block in self.blocks:
                x = x + block(x)
            pooled.append(x.mean(1))
        return self.head(torch.cat(pooled))


def loss_and_grads(net: nn.Module, crops: list[torch.Tensor], region, per_crop: bool) -> tuple[torch.Tensor, dict]:
    """A step's loss and gradients; `per_crop`: the method calls the net once per crop resolution (in one region)."""
    with torch.autocast("cpu", dtype=torch.bfloat16), region():
        out = torch.cat([net([x]) for x in crops]) if per_crop else net(crops)
        loss = out.float().pow(2).mean()
    loss.backward()
    grads = {n: p.grad for n, p in net.named_parameters()}
    return loss.detach(), grads


def test_block_of_is_the_module_path_up_to_its_last_list_index():
    assert block_of("backbone.blocks.3.attn.qkv") == "backbone.blocks.3"
    assert block_of("backbone.layers.2.blocks.5.mlp.fc1") == "backbone.layers.2.blocks.5"
    assert block_of("head.mlp.0") == "head.mlp.0"
    assert block_of("backbone.patch_embed.proj") == "backbone.patch_embed.proj"


@pytest.mark.parametrize("per_crop", [False, True])
def test_lowp_student_gives_autocasts_loss_and_gradients_and_uses_each_steps_weights(per_crop):
    """Two optimizer steps of the student with its weights cast by fused copies and of a copy left to autocast:
    the same losses and gradients bit for bit (the copy rounds as autocast's cast; a weight's gradients from the
    two passes are summed in bf16 before the cast back, as under autocast's cached cast), so the second step's
    forward read the weights the first step's update wrote (a stale bf16 copy would differ). Called once per crop
    resolution, the calls of a region share its cast (a second copy would change what the first call's graph
    saved: autograd would refuse the backward)."""
    torch.manual_seed(0)
    student = TwoPassNet()
    reference = copy.deepcopy(student)
    lowp = LowPrecisionStudent(student, torch.bfloat16)
    shadow = lowp.shadow
    assert shadow.head.weight.dtype == torch.bfloat16 and student.head.weight.dtype == torch.float32
    assert shadow.frozen.weight is student.frozen.weight  # frozen: left to autocast, no gradient path
    assert shadow.blocks[0][0].weight is student.blocks[0][0].weight  # LayerNorm: autocast runs it in fp32
    assert len(lowp.blocks) == 5  # embed, blocks.0, blocks.1, unused, head (frozen: none)
    optimizers = [torch.optim.SGD(net.parameters(), lr=0.5) for net in (student, reference)]
    for _ in range(2):
        crops = [torch.randn(2, 3, 8), torch.randn(6, 3, 4)]
        loss, grads = loss_and_grads(student, crops, lowp.region, per_crop)
        expected_loss, expected = loss_and_grads(reference, crops, contextlib.nullcontext, per_crop)
        assert torch.equal(loss, expected_loss)
        assert grads.keys() == expected.keys()
        for name, grad in expected.items():
            assert (grad is None) == (grads[name] is None), name
            assert grad is None or (grads[name].dtype == torch.float32 and torch.equal(grads[name], grad)), name
        assert grads["unused.weight"] is None and grads["frozen.weight"] is None  # no gradient: no update
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    assert all(v.dtype == torch.float32 for v in student.state_dict().values())  # checkpoints keep fp32
    student.eval()  # the shadow follows the student's mode
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        student(crops)
    assert not shadow.training


def count_casts(net: nn.Module, crops: list[torch.Tensor]) -> OpCounter:
    phases = Phases()
    with OpCounter(phases) as counter:
        with phases("forward"), torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(crops).float().pow(2).mean()
        with phases("backward"):
            loss.backward()
    return counter


def test_lowp_student_casts_once_per_block_each_way():
    """Per step: one fused copy per block forward and one back, instead of autocast's cast per weight each way
    (here 8 trainable weights and biases in use; the frozen layer is cast by autocast in both)."""
    torch.manual_seed(0)
    student = TwoPassNet()
    reference = copy.deepcopy(student)
    lowp = LowPrecisionStudent(student, torch.bfloat16)
    crops = [torch.randn(2, 3, 8), torch.randn(6, 3, 4)]
    fused, autocast = count_casts(student, crops), count_casts(reference, crops)
    assert fused.launched["forward"]["aten::_foreach_copy_"] == len(lowp.blocks) == 5
    # the unused layer's gradients never come: its block's backward does not run
    assert fused.launched["backward"]["aten::_foreach_copy_"] == len(lowp.blocks) - 1
    assert autocast.counts["forward"]["casts"] - fused.counts["forward"]["casts"] == 8 - 5
    assert autocast.counts["backward"]["casts"] - fused.counts["backward"]["casts"] == 8 - 4


def test_lowp_teacher_gives_autocasts_outputs_and_follows_the_fp32_weights():
    """The teacher's forward on weights held in bf16 equals autocast's on the fp32 weights, bit for bit, and sees
    an update of the fp32 weights once refreshed; the fp32 module stays the teacher's parameters and buffers."""
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    teacher.requires_grad_(False)
    x = torch.randn(5, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = teacher(x)
    lowp = LowPrecisionTeacher(teacher, torch.bfloat16)
    assert lowp.shadow[0].weight.dtype == torch.bfloat16 and teacher[0].weight.dtype == torch.float32
    assert lowp.shadow[1].weight is teacher[1].weight and lowp.shadow[2].running_mean is teacher[2].running_mean
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(teacher(x), expected)
    with torch.no_grad():
        teacher[0].weight.mul_(2.0)  # as the EMA writes the fp32 teacher
    lowp.refresh()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        changed = teacher(x)
        teacher.eval()  # the shadow follows the teacher's mode
        evaluated = teacher(x)
    assert not torch.equal(changed, expected)
    assert not lowp.shadow.training and not torch.equal(evaluated, changed)
    assert all(v.dtype != torch.bfloat16 for v in teacher.state_dict().values())  # checkpoints keep fp32


def test_lowp_student_gradients_of_a_block_are_views_of_one_allocation():
    """The fused cast's backward allocates one fp32 buffer per block, not one per weight; the parameters take its
    views as their gradients without a copy (laid out as the parameters), and the next step's backward adds into
    them (gradient accumulation) as into any gradient."""
    torch.manual_seed(0)
    student = TwoPassNet()
    reference = copy.deepcopy(student)
    lowp = LowPrecisionStudent(student, torch.bfloat16)
    crops = [torch.randn(2, 3, 8), torch.randn(6, 3, 4)]
    for _ in range(2):  # two micro-batches into the same gradients
        _, grads = loss_and_grads(student, crops, lowp.region, per_crop=False)
        _, expected = loss_and_grads(reference, crops, contextlib.nullcontext, per_crop=False)
    storages: dict[str, set] = {}
    cast = {id(p) for _, p in cast_parameters(student)}
    for name, p in student.named_parameters():
        if id(p) in cast and p.grad is not None:
            assert p.grad.stride() == p.stride() and torch.equal(p.grad, expected[name]), name
            storages.setdefault(block_of(name.rsplit(".", 1)[0]), set()).add(p.grad.untyped_storage().data_ptr())
    assert sorted(storages) == ["blocks.0.1", "blocks.1.1", "embed", "head"]
    assert all(len(s) == 1 for s in storages.values())  # one allocation per block
    assert len(set.union(*storages.values())) == 4  # each its own
