"""DaliLoader: the loader protocol (scale/data/loader_protocol.py: steps_per_epoch, iteration yielding Batch,
state_dict / load_state_dict, counters, metrics) over one DALI pipeline per rank.

Order. DALI's webdataset reader splits the samples into world_size contiguous parts (rank r reads part r; the tar
order is reshuffled every DALI epoch with a seed shared by the ranks) and shuffles each part through a buffer of
data.shuffle_buffer samples. Every rank runs steps_per_epoch = samples_per_epoch // global_batch steps of
global_batch // world_size samples per epoch, as with the torchvision loader; the reader's own epochs (each rank's
part, read to its end) run on continuously underneath, so an epoch of the loader is "about one pass": unlike the
torchvision loader's `epochs` mode, it does not guarantee each sample at most once per loader epoch. Modes `epochs`
and `resampled` read the same stream.

Resume. `state_dict()` holds the position (global samples consumed, as in the torchvision loader) and every rank's
DALI pipeline checkpoint (reader position, shuffle buffer and random generator states: `enable_checkpointing`),
all-gathered the first time it is called at a position, so that whichever rank's copy the run checkpoint keeps holds
them all (state_dict is collective when world_size > 1 and torch.distributed is initialised; later calls at the same
position reuse the gathered copy). Exact: resuming with the same world size, device kind, seed, global batch and
shards continues with the same samples and the same augmentations as an uninterrupted run. Not exact: another world
size or device kind, or a state written by the torchvision backend: the position (and so the schedule) carries
over, but the pipelines start a fresh draw seeded by (seed, rank, position); samples may repeat or be missed.

Bad samples. A sample without a .jpg (or without its label) is skipped by the reader; a JPEG that does not decode
stops the run with a UserError (DALI's decoder cannot skip it): check shards with `scale shards verify DIR`.
"""

import base64
import json
import logging
from dataclasses import replace

import numpy as np
import torch

from scale.data.batch import Batch
from scale.data.dali.index import dali_index_paths
from scale.data.dali.pipeline import PipelineSpec, build_pipeline
from scale.data.loader import Loader, SampleError, hash_seed, labels_tensor, parse_label
from scale.data.spec import LoaderSpec
from scale.errors import UserError

log = logging.getLogger(__name__)
DEVICES = ("auto", "cpu", "gpu")
VIEW_KINDS = ("multicrop", "two_view")
LABEL_EXT = {"single": "cls", "multi": "labels"}


def resolve_device(choice: str) -> str:
    """data.dali_device -> "gpu" or "cpu"."""
    if choice not in DEVICES:
        raise UserError(f"data.dali_device must be one of {', '.join(DEVICES)}, got '{choice}'")
    has_gpu = torch.cuda.is_available()
    if choice == "gpu" and not has_gpu:
        raise UserError(
            "data.dali_device=gpu but no CUDA GPU is visible on this machine: use data.dali_device=cpu "
            "(or auto), or data.backend=torchvision"
        )
    return "gpu" if choice == "gpu" or (choice == "auto" and has_gpu) else "cpu"


def sample_key(source_info: str) -> str:
    """DALI's source info 'TAR:OFFSET:KEY.jpg' -> KEY (webdataset: the member name up to its first dot)."""
    return source_info.rsplit(":", 1)[-1].split(".", 1)[0]


class DaliLoader(Loader):
    # DALI runs ahead by itself (its prefetch queue; on the GPU it yields device tensors), and its state is the
    # pipeline's checkpoint, which a batch taken ahead would move: scale.data.prefetch leaves it as it is
    reads_ahead = True

    def __init__(self, spec: LoaderSpec):
        if spec.views.kind not in VIEW_KINDS:
            raise UserError(f"data.backend=dali makes the {' and '.join(VIEW_KINDS)} views, not '{spec.views.kind}'")
        # DALI hands over its own buffers (device tensors on the GPU): nothing to pin, and the views are resolved
        # as for the CPU
        super().__init__(replace(spec, pin_memory=False))
        self.device = resolve_device(getattr(spec.data, "dali_device", "auto"))
        self.label_kind = self.manifest["label_kind"]
        self.pipe = None
        self._checkpoint = None  # this rank's DALI checkpoint to build the pipeline from
        self._every = ""  # JSON list of every rank's checkpoint at self._every_position
        self._every_position = 0

    def spec(self, seed: int) -> PipelineSpec:
        shards = [s for s in self.manifest["shards"] if int(s["count"]) > 0]
        return PipelineSpec(
            paths=[str(self.dir / s["name"]) for s in shards],
            index_paths=[str(p) for p in dali_index_paths(self.dir, self.manifest)],
            label_ext=LABEL_EXT.get(self.label_kind),
            views=self.views,
            mean=tuple(self.views_cfg.mean),
            std=tuple(self.views_cfg.std),
            batch_size=self.local_batch,
            shard_id=self.rank,
            num_shards=self.world_size,
            shuffle_buffer=int(self.cfg.shuffle_buffer),
            seed=seed,
            shard_order_seed=self.seed % 2**31,
            device=self.device,
            device_id=torch.cuda.current_device() if self.device == "gpu" else None,
            num_threads=max(1, int(self.cfg.workers)),
        )

    def _build(self):
        # a restored pipeline replays the first run's construction; a fresh one at position p > 0 is a new draw
        start = 0 if self._checkpoint else self.position
        return build_pipeline(self.spec(hash_seed(self.seed, "dali", self.rank, start) % 2**31), self._checkpoint)

    def __iter__(self):
        if self.pipe is None:
            self.pipe = self._build()
        for _ in range(self.step_in_epoch, self.steps_per_epoch):
            batch = self._batch(self._run())
            self.position += self.global_batch
            self.samples_seen += self.local_batch
            yield batch

    def _run(self):
        try:
            return self.pipe.run()
        except RuntimeError as err:
            first = next((line for line in str(err).splitlines() if line.strip()), "")
            raise UserError(
                f"the DALI pipeline of rank {self.rank} failed reading {self.dir}: {first} (a JPEG that "
                f"does not decode? check with `scale shards verify {self.dir}`)"
            ) from err

    def _batch(self, outputs) -> Batch:
        info, rest = outputs[0], list(outputs[1:])
        keys = [sample_key(bytes(np.asarray(info[i])).decode()) for i in range(len(info))]
        labels = [-1] * len(keys)
        if self.label_kind in LABEL_EXT:
            raw = rest.pop(0)
            labels = [self._label(bytes(np.asarray(raw[i])), key) for i, key in enumerate(keys)]
        crops, first = [], 0
        for n in self.views.views_per_group:
            crops.append(self._stack(rest[first : first + n]))
            first += n
        return Batch(
            crops,
            list(self.views.views_per_group),
            labels_tensor(labels, self.label_kind, len(self.manifest["classes"])),
            keys,
        )

    def _label(self, text: bytes, key: str):
        try:
            return parse_label(text, self.label_kind, f"{self.dir} key {key}", len(self.manifest["classes"]))
        except SampleError as err:
            raise UserError(f"bad label: {err.where}") from None

    def _stack(self, views: list) -> torch.Tensor:
        """View-major [n * B, 3, S, S] float32 from n DALI outputs of [B, 3, S, S]."""
        first = views[0].as_tensor()
        shape = list(first.shape())
        b = shape[0]
        if self.device == "cpu":
            out = torch.empty([len(views) * b] + shape[1:])
            for v, tl in enumerate(views):
                out[v * b : (v + 1) * b] = torch.from_numpy(tl.as_array())
            return out
        from nvidia.dali.plugin.pytorch import feed_ndarray

        out = torch.empty([len(views) * b] + shape[1:], device=torch.device("cuda", torch.cuda.current_device()))
        stream = torch.cuda.current_stream()
        for v, tl in enumerate(views):
            feed_ndarray(tl.as_tensor(), out[v * b : (v + 1) * b], cuda_stream=stream)
        return out

    # ------------------------------------------------------------------------------------------------ resuming

    def _every_checkpoint(self) -> str:
        if self.pipe is None:  # nothing read since construction or restore: the state we started from
            return self._every
        if self._every_position != self.position or not self._every:
            own = base64.b64encode(self.pipe.checkpoint()).decode()
            every = [own]
            if self.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
                every = [None] * self.world_size
                torch.distributed.all_gather_object(every, own)
            self._every, self._every_position = json.dumps(every), self.position
        return self._every

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.update(backend="dali", world_size=self.world_size, device=self.device, dali=self._every_checkpoint())
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        every = json.loads(state["dali"]) if state.get("dali") else []
        same = (
            state.get("backend") == "dali"
            and state.get("world_size") == self.world_size
            and state.get("device") == self.device
            and len(every) == self.world_size
        )
        self.pipe = None
        self._checkpoint = base64.b64decode(every[self.rank]) if same else None
        self._every, self._every_position = (state["dali"], self.position) if same else ("", 0)
        if not same and self.position:
            log.warning(
                "data: the DALI pipelines resume at position %d with a fresh draw (the saved state is from "
                "backend %s, world size %s, device %s; this run: dali, %d, %s)",
                self.position,
                state.get("backend", "torchvision"),
                state.get("world_size"),
                state.get("device"),
                self.world_size,
                self.device,
            )
