"""Each DeepSpeed internal that scale.engine.ds_internals relies on, checked against the installed DeepSpeed: an
upgrade that renames, moves or removes one fails here, naming it, instead of deep inside a resumed run. Where the
internal can be driven without a process group it is (the ZeRO-1/2 fragment mapping, the universal-load flag);
otherwise the test reads DeepSpeed's source for the attribute or argument the function uses."""

import argparse
import errno
import inspect
import re
from types import SimpleNamespace

import pytest
import torch

from scale.engine import ds_internals
from scale.engine.deepspeed import import_deepspeed
from scale.errors import os_error

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


def test_deepspeeds_checkpoint_files_are_written_by_the_two_functions_we_wrap(tmp_path):
    """deferred_write_errors replaces `checkpoint_engine.save` and `_copy_recovery_script`: the functions that
    save_checkpoint calls to write a checkpoint's files must write through nothing else, and
    TorchCheckpointEngine.save must accept a file object for its path."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    user = "deferred_write_errors"
    for writer in ("_save_checkpoint", "_save_zero_checkpoint"):
        text = source(getattr(DeepSpeedEngine, writer))
        relies_on("self.checkpoint_engine.save(" in text, f"DeepSpeedEngine.{writer}'s checkpoint_engine.save", user)
        other = re.findall(r"\b(open|torch\.save|copyfile|copytree|write_text)\(", text)
        relies_on(not other, f"DeepSpeedEngine.{writer} writing only through checkpoint_engine ({other})", user)
    relies_on("self._copy_recovery_script(" in source(DeepSpeedEngine._save_zero_checkpoint), "recovery", user)
    relies_on("self.checkpoint_engine = " in source(DeepSpeedEngine), "DeepSpeedEngine.checkpoint_engine", user)
    copied = []
    ds = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine(), _copy_recovery_script=copied.append)
    ds.checkpoint_engine.zipfile_serialization = True  # as a run's config sets it
    with ds_internals.deferred_write_errors(ds) as errors:
        ds.checkpoint_engine.save({"w": torch.ones(2)}, str(tmp_path / "kept.pt"))
        (tmp_path / "full.pt").symlink_to("/dev/full")  # every write to it fails with ENOSPC
        # past the file's buffer: the write's OSError, then torch's RuntimeError closing the zip file
        ds.checkpoint_engine.save({"w": torch.ones(1_000_000)}, str(tmp_path / "full.pt"))
    assert torch.equal(torch.load(tmp_path / "kept.pt")["w"], torch.ones(2))
    assert [os_error(err).errno for err in errors] == [errno.ENOSPC]  # recorded, not raised
    assert "save" not in vars(ds.checkpoint_engine)  # the class's own method again
    assert ds._copy_recovery_script == copied.append


def test_a_write_that_fails_for_want_of_space_is_recorded_whatever_torch_raises_on_top(monkeypatch, tmp_path):
    """On a file system that fills mid-file (a tmpfs run directory), torch.save's zip writer meets the OSError
    and raises its own RuntimeError ('unexpected pos') while closing: that is a full disk too. Any other error is
    raised at once."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    def torch_save_on_a_filling_disk(state_dict, path, **_):
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 641088 vs 641008")  # noqa: B904 (as torch: implicit context)

    def copy_to_a_full_disk(save_path):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", torch_save_on_a_filling_disk)
    ds = SimpleNamespace(checkpoint_engine=TorchCheckpointEngine(), _copy_recovery_script=copy_to_a_full_disk)
    with ds_internals.deferred_write_errors(ds) as errors:
        ds.checkpoint_engine.save({}, str(tmp_path / "a.pt"))
        ds._copy_recovery_script(str(tmp_path))
    assert [os_error(err).errno for err in errors] == [errno.ENOSPC, errno.ENOSPC]
    monkeypatch.setattr(torch, "save", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError), ds_internals.deferred_write_errors(ds):
        ds.checkpoint_engine.save({}, str(tmp_path / "b.pt"))
