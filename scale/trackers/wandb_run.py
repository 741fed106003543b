"""Weights & Biases: one W&B run per scale run, resumed by id after a requeue. Offline (`train.tracker.offline`
or WANDB_MODE=offline) it writes <run>/wandb/offline-run-*, one folder per attempt with the same run id, which
`wandb sync` uploads into that one run. Project, entity and mode: the recipe's keys, else WANDB_PROJECT,
WANDB_ENTITY and WANDB_MODE, else meta.paper, the logged-in default and online; the files go to WANDB_DIR, else the
run directory."""

import json
import secrets
import string
import struct
from pathlib import Path

from scale.trackers.sink import Sink, setting

# W&B's offline transaction log (run-<id>.wandb): a LevelDB-style log of protobuf records in 32 KiB blocks, each
# chunk behind a 7-byte header (crc, length, type). wandb 0.31 ships no Python reader of it (its datastore went
# with the Go core), so the few lines that read it back are here.
BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


class WandbSink(Sink):
    package = "wandb"

    def __init__(self, settings, root: Path, run_id: str | None, config: dict):
        import wandb

        mode = "offline" if settings.offline else setting(None, "WANDB_MODE", None)  # None: online
        store = WandbSink.stores(settings, root)[0]
        # what a killed attempt's offline files hold: records still queued in W&B's service at a SIGKILL are
        # lost although they were sent (online, the server's copy is not read back)
        self.held_step = offline_steps(store, run_id) if mode == "offline" and run_id else None
        self.run = wandb.init(
            project=setting(settings.project, "WANDB_PROJECT", settings.default_project),
            entity=setting(settings.entity, "WANDB_ENTITY", None),
            name=settings.name,
            tags=list(settings.tags) or None,
            id=run_id,
            resume="allow",
            dir=str(store),
            config=config,
            mode=mode,
            settings=wandb.Settings(console="off"),  # our own logs are in <run>/logs
        )
        self.run_id = self.run.id

    @staticmethod
    def new_id() -> str:
        """Chosen (and saved in trackers.json) before the run is created, so that a kill between its creation and
        the save cannot make a second run: W&B's own alphabet and length."""
        return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))

    @staticmethod
    def stores(settings, root: Path) -> list[Path]:
        return [Path(setting(None, "WANDB_DIR", str(root)))]  # W&B writes <dir>/wandb, online or offline

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def attach(self, paths: list[Path]) -> None:
        import wandb

        artifact = wandb.Artifact(f"{self.run.id}-outputs", type="run-outputs")
        for path in paths:
            if path.is_dir():
                artifact.add_dir(str(path), name=path.name)
            else:
                artifact.add_file(str(path))
        self.run.log_artifact(artifact)

    def close(self) -> None:
        self.run.finish()


def offline_steps(store: Path, run_id: str) -> int:
    """The last step the offline attempts of run `run_id` under `store` hold in their files (0: none)."""
    steps = [
        int(json.loads(item.value_json))
        for log in store.glob(f"wandb/offline-run-*/run-{run_id}.wandb")  # -1, -2: attempts in one second
        for record in records(log)
        if record.WhichOneof("record_type") == "history"
        for item in record.history.item
        if (item.key or "/".join(item.nested_key)) == "_step"  # wandb 0.31 writes the key as nested_key
    ]
    return max(steps, default=0)


def records(path: Path):
    """The complete records of a W&B transaction log, in order; a tail cut by a kill (a chunk shorter than its
    header says, a record without its last chunk) ends the reading."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    if data[:4] != b":W&B":
        return
    pos, chunks = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind not in (FULL, FIRST, MIDDLE, LAST) or pos + HEADER + length > len(data):
            return
        payload = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        chunks = payload if kind in (FULL, FIRST) else chunks + payload
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(chunks)
            yield record
