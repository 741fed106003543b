"""Reading back what the trackers wrote offline: W&B's offline transaction logs (<run>/wandb/offline-run-*/
run-*.wandb, a LevelDB-style log of protobuf records) and MLflow's file store (<run>/mlruns)."""

import json
import os
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7  # W&B's log: 32 KiB blocks of records, each with a 7-byte header (crc, length, type)
FULL, FIRST, LAST = 1, 2, 4


def wandb_records(path: Path):
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, chunks = HEADER, b""
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        payload = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        chunks = payload if kind in (FULL, FIRST) else chunks + payload
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(chunks)
            yield record


def wandb_attempts(root: Path) -> list[dict]:
    """One dict per offline attempt (oldest first): its run id, its history {step: {key: value}}, its config keys
    and its artifact names."""
    attempts = []
    for folder in sorted((root / "wandb").glob("offline-run-*")):
        out = {"id": None, "history": {}, "config": {}, "artifacts": []}
        for log in folder.glob("run-*.wandb"):
            for record in wandb_records(log):
                kind = record.WhichOneof("record_type")
                if kind == "run":
                    out["id"] = record.run.run_id
                    out["config"].update({i.key: json.loads(i.value_json) for i in record.run.config.update})
                elif kind == "config":
                    out["config"].update({i.key: json.loads(i.value_json) for i in record.config.update})
                elif kind == "history":
                    row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                    out["history"][int(row["_step"])] = row
                elif kind == "artifact":
                    out["artifacts"].append(record.artifact.name)
        attempts.append(out)
    return attempts


def mlflow_runs(root: Path, store: Path | None = None) -> tuple:
    """The MLflow client of the run's file store (or of `store`) and its runs."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=(store or root / "mlruns").resolve().as_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client, client.search_runs(experiments)
