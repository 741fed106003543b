"""Each DeepSpeed internal that scale.engine.ds_internals relies on, checked against the installed DeepSpeed: an
upgrade that renames, moves or removes one fails here, naming it, instead of deep inside a resumed run. Where the
internal can be driven without a process group it is (the ZeRO-1/2 fragment mapping, the universal-load flag);
otherwise the test reads DeepSpeed's source for the attribute or argument the function uses."""

import argparse
import inspect
import re
from types import SimpleNamespace

import pytest
import torch

from scale.engine import ds_internals
from scale.engine.deepspeed import import_deepspeed

pytest.importorskip("deepspeed")
deepspeed = import_deepspeed(torch.device("cpu"))
from deepspeed.checkpoint import ds_to_universal  # noqa: E402
from deepspeed.runtime.engine import DeepSpeedEngine  # noqa: E402
from deepspeed.runtime.zero import partition_parameters  # noqa: E402
from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3  # noqa: E402
from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer  # noqa: E402
from deepspeed.utils.mixed_precision_linkage import link_hp_params  # noqa: E402


def relies_on(found: bool, internal: str, user: str) -> None:
    if not found:
        pytest.fail(
            f"DeepSpeed {deepspeed.__version__} changed or removed {internal}, which "
            f"scale.engine.ds_internals.{user} relies on (written against DeepSpeed {ds_internals.DS_VERSION}); "
            f"see that function's comment for what it needs"
        )


def source(obj) -> str:
    return inspect.getsource(obj)


def test_zero12_fragments_come_from_deepspeeds_fragment_mapping():
    """Two parameters in one flat partition, linked by DeepSpeed's own link_hp_params as ZeRO-1/2 links them."""
    a, b = torch.nn.Parameter(torch.zeros(4)), torch.nn.Parameter(torch.zeros(6))
    master = torch.arange(10, dtype=torch.float32)
    grads = {0: [torch.full((4,), 1.0), torch.full((6,), 2.0)]}
    try:
        link_hp_params([a, b], master, grads, {}, False, 0, 0, 10, None)
        grad, weights = ds_internals.lp_grad_fragment(b), ds_internals.hp_fragment(b)
    except (AttributeError, TypeError) as err:
        relies_on(False, f"param._hp_mapping / param._index_in_param_group ({err})", "lp_grad_fragment, hp_fragment")
    relies_on(
        grad is grads[0][1], "tensor_fragment.get_lp_grad_fragment(param._index_in_param_group)", "lp_grad_fragment"
    )
    relies_on(
        weights is not None and weights.data_ptr() == master[4:].data_ptr() and weights.numel() == 6,
        "tensor_fragment.get_hp_fragment() (a view of the flat fp32 partition)",
        "hp_fragment",
    )
    no_fragment = torch.nn.Parameter(torch.zeros(2))
    assert ds_internals.lp_grad_fragment(no_fragment) is None and ds_internals.hp_fragment(no_fragment) is None


def test_zero3_partition_is_the_parameters_ds_tensor():
    relies_on("param.ds_tensor = " in source(partition_parameters), "param.ds_tensor", "zero3_partition")


def test_universal_load_sets_the_flag_deepspeeds_load_reads():
    engine = SimpleNamespace(_config=SimpleNamespace(load_universal_checkpoint=False))
    try:
        with ds_internals.universal_load(engine, True):
            inside = DeepSpeedEngine.load_universal_checkpoint(engine)
    except AttributeError as err:
        relies_on(False, f"DeepSpeedEngine.load_universal_checkpoint() ({err})", "universal_load")
    relies_on(inside is True, "DeepSpeedEngine._config.load_universal_checkpoint", "universal_load")
    assert DeepSpeedEngine.load_universal_checkpoint(engine) is False


def test_zero3_still_clones_an_fp32_master_of_fp32_weights():
    """share_fp32_master works around a device comparison in _create_fp32_partitions; once DeepSpeed compares
    devices correctly it shares the weights itself and the workaround goes."""
    create = source(DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions)
    relies_on(
        "self.fp16_partitioned_groups_flat[i].device == self.device" in create,
        "DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions's device check (if fixed: delete share_fp32_master)",
        "share_fp32_master",
    )
    relies_on(
        torch.device("cpu") != "cpu", "torch.device == str (now equal: delete the workaround)", "share_fp32_master"
    )
    weights = [torch.ones(3)]
    optimizer = SimpleNamespace(fp16_partitioned_groups_flat=weights, fp32_partitioned_groups_flat=[torch.ones(3)])
    assert ds_internals.share_fp32_master(optimizer) == 12
    assert optimizer.fp32_partitioned_groups_flat[0].data_ptr() == weights[0].data_ptr()


@pytest.mark.parametrize(
    "cls, attribute",
    [
        (DeepSpeedZeroOptimizer_Stage3, "fp32_partitioned_groups_flat"),
        (DeepSpeedZeroOptimizer_Stage3, "fp16_partitioned_groups_flat"),
        (DeepSpeedZeroOptimizer, "single_partition_of_fp32_groups"),
    ],
)
def test_zero_optimizers_hold_their_flat_partitions(cls, attribute):
    relies_on(f"self.{attribute} = " in source(cls), f"{cls.__name__}.{attribute}", "fp32_master_partitions")


@pytest.mark.parametrize("cls", [DeepSpeedZeroOptimizer_Stage3, DeepSpeedZeroOptimizer])
def test_zero_optimizers_keep_the_client_optimizer(cls):
    relies_on(
        "self.optimizer = init_optimizer" in source(cls.__init__), f"{cls.__name__}.optimizer", "client_optimizer"
    )


def test_ds_to_universal_reads_only_the_arguments_we_pass(monkeypatch):
    relies_on(
        list(inspect.signature(ds_to_universal.main).parameters) == ["args"],
        "ds_to_universal.main(args)",
        "convert_to_universal",
    )
    read = set(re.findall(r"\bargs\.(\w+)", source(ds_to_universal)))
    passed = {}
    monkeypatch.setattr(ds_to_universal, "main", lambda args: passed.update(vars(args)))
    ds_internals.convert_to_universal("in", "out")
    missing = sorted(read - set(passed))
    relies_on(not missing, f"ds_to_universal's arguments (now also reads {', '.join(missing)})", "convert_to_universal")
    assert isinstance(argparse.Namespace(**passed), argparse.Namespace) and passed["input_folder"] == "in"
