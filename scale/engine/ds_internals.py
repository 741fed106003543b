"""Every place the DeepSpeed engine (scale.engine.deepspeed) reaches past DeepSpeed's public API, each behind one
function. Written against DeepSpeed 0.19.8 (setup.cfg allows >=0.19,<0.20); tests/engine/test_ds_internals.py
checks each internal against the installed DeepSpeed and names it when an upgrade changed or removed it.

DeepSpeed's public tensor APIs (deepspeed.utils.safe_get_local_*, PR #4681) cover ZeRO-3 only, and the full ones
(safe_get_full_*, PR #2727) all-reduce a whole tensor per parameter; DINO's per-parameter clipping and frozen
last layer need this rank's ZeRO-1/2 fragments, which only the parameters' private fragment mappings give."""

import argparse
import contextlib
from pathlib import Path

import torch
from torch import nn

from scale.engine.params import nbytes
from scale.errors import os_error

DS_VERSION = "0.19.8"


def lp_grad_fragment(param: nn.Parameter) -> torch.Tensor | None:
    """ZeRO-1/2: this rank's fragment of the reduced gradient (a view the optimizer reads), None if it holds none.
    Internals: `param._hp_mapping` (set by deepspeed.utils.mixed_precision_linkage.link_hp_params, a
    tensor_fragment) and `param._index_in_param_group`, as DeepSpeed's own get_full_hp_grad reads them."""
    mapping = getattr(param, "_hp_mapping", None)
    return mapping.get_lp_grad_fragment(param._index_in_param_group) if mapping is not None else None


def hp_fragment(param: nn.Parameter) -> torch.Tensor | None:
    """ZeRO-1/2: this rank's fragment of the fp32 master weights, None if it holds none. Internal:
    `param._hp_mapping.get_hp_fragment()` (tensor_fragment.hp_fragment)."""
    mapping = getattr(param, "_hp_mapping", None)
    return mapping.get_hp_fragment() if mapping is not None else None


def zero3_partition(param: nn.Parameter) -> torch.Tensor:
    """ZeRO-3: this rank's partition of a parameter's weights. Internal: `param.ds_tensor`, set by
    deepspeed.runtime.zero.partition_parameters (no public getter of the model-precision partition)."""
    return param.ds_tensor


@contextlib.contextmanager
def universal_load(engine, enabled: bool):
    """Inside: `engine.load_checkpoint` reads DeepSpeed's universal checkpoint format when `enabled`. DeepSpeed
    reads the choice only from the config given to deepspeed.initialize (checkpoint.load_universal), through
    DeepSpeedEngine.load_universal_checkpoint() -> `engine._config.load_universal_checkpoint`; whether a resume is
    elastic is known only at load time, so the flag is set around the load (as in DeepSpeed issue #6470)."""
    engine._config.load_universal_checkpoint = enabled
    try:
        yield
    finally:
        engine._config.load_universal_checkpoint = False


def share_fp32_master(zero_optimizer) -> int:
    """ZeRO-3 with fp32 weights: DeepSpeed means to use the weight partitions themselves as the fp32 master copy
    (stage3.py `_create_fp32_partitions`: "we don't need another copy of the weights"), but its check compares
    the partition's torch.device with `self.device`, a device string, which never matches in torch 2.x, so it
    clones a second fp32 copy. Point the master partitions at the weights (the optimizer keeps the same tensor
    objects); returns bytes freed. Internals: DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat and
    fp16_partitioned_groups_flat (the model-precision partitions, whatever their dtype)."""
    freed = 0
    pairs = zip(zero_optimizer.fp32_partitioned_groups_flat, zero_optimizer.fp16_partitioned_groups_flat)
    for master, weights in pairs:
        if (
            master.dtype == weights.dtype
            and master.device == weights.device
            and master.shape == weights.shape
            and master.untyped_storage().data_ptr() != weights.untyped_storage().data_ptr()
        ):
            freed += nbytes(master)
            master.data = weights.data
    return freed


def fp32_master_partitions(zero_optimizer, stage: int) -> list[torch.Tensor]:
    """This rank's flat fp32 master partitions, one per parameter group. Internals:
    DeepSpeedZeroOptimizer_Stage3.fp32_partitioned_groups_flat, DeepSpeedZeroOptimizer (ZeRO-1/2)
    .single_partition_of_fp32_groups."""
    if stage == 3:
        return zero_optimizer.fp32_partitioned_groups_flat
    return zero_optimizer.single_partition_of_fp32_groups


def client_optimizer(zero_optimizer) -> torch.optim.Optimizer:
    """The torch optimizer given to deepspeed.initialize, over the flat fp32 partitions. Internal: the ZeRO
    optimizers' `.optimizer` attribute (both stages set it in their __init__)."""
    return zero_optimizer.optimizer


UNIVERSAL_ARGS = {"num_extract_workers": 1, "num_merge_workers": 1, "keep_temp_folder": False, "strict": True}


def convert_to_universal(input_folder: Path, output_folder: Path) -> None:
    """DeepSpeed's ds_to_universal command, called in process: its `main` takes the argparse namespace of its
    command line, whose fields change between versions (inject_missing_state: added by PR #5608, reverted by
    #5720, read again by 0.19.8), so every field it reads is passed. One worker each: small, and no fork inside a
    run."""
    from deepspeed.checkpoint.ds_to_universal import main

    main(
        argparse.Namespace(
            input_folder=str(input_folder),
            output_folder=str(output_folder),
            inject_missing_state=False,
            **UNIVERSAL_ARGS,
        )
    )


@contextlib.contextmanager
def deferred_write_errors(ds):
    """DeepSpeed's save_checkpoint writes its files between collectives of its own (a barrier after them), so a
    rank whose write raises leaves the others waiting in that barrier. Inside this context a write that fails for
    an OSError (a full disk) is recorded in the list it yields instead of raised: the caller raises it once
    DeepSpeed's collectives are done. The two ways DeepSpeed writes a checkpoint's files (0.19.8, `save_latest` off):
    `DeepSpeedEngine.checkpoint_engine.save(state_dict, path)` (TorchCheckpointEngine: torch.save, which takes a
    file object too: written through a Python file, a full disk is an OSError with its errno, not only torch's
    'unexpected pos' RuntimeError) and `DeepSpeedEngine._copy_recovery_script(save_path)` (rank 0 copies DeepSpeed's
    zero_to_fp32.py beside the ZeRO files)."""
    errors: list[Exception] = []
    writer = ds.checkpoint_engine
    save = writer.save

    def save_through_file(state_dict, path):
        with open(path, "wb") as f:
            save(state_dict, f)

    with (
        _recording(writer, "save", save_through_file, errors),
        _recording(ds, "_copy_recovery_script", ds._copy_recovery_script, errors),
    ):
        yield errors


@contextlib.contextmanager
def _recording(owner, name: str, function, errors: list):
    """`owner.name` is `function`, whose failures caused by an OSError are appended to `errors`, not raised."""

    def recorded(*args, **kwargs):
        try:
            function(*args, **kwargs)
        except Exception as err:
            if os_error(err) is None:
                raise
            errors.append(err)

    own = vars(owner).get(name)  # normally none: the class's method
    setattr(owner, name, recorded)
    try:
        yield
    finally:
        if own is None:
            delattr(owner, name)
        else:
            setattr(owner, name, own)
