"""Reading back what the trackers wrote offline: W&B's offline transaction logs (<run>/wandb/offline-run-*/
run-*.wandb, a LevelDB-style log of protobuf records) and MLflow's file store (<run>/mlruns)."""

import json
import os
import time
from pathlib import Path

from scale.trackers.wandb_run import records as wandb_records


def wandb_attempts(root: Path, finished: bool = True, wait_s: float = 120.0) -> list[dict]:
    """One dict per offline attempt (oldest first): its run id, its history {step: {key: value}}, its config keys
    and its artifact names. W&B's service holds a run's records in a buffer and writes them when the run ends,
    which may be a moment after `run.finish()` returns on a busy machine: with `finished`, read again until every
    attempt's log holds its exit record (at most `wait_s`); attempts that were killed never get one."""
    deadline = time.monotonic() + wait_s
    while True:
        attempts = read_wandb_attempts(root)
        if not finished or all(a["exited"] for a in attempts) or time.monotonic() > deadline:
            return attempts
        time.sleep(0.2)


def read_wandb_attempts(root: Path) -> list[dict]:
    attempts = []
    for folder in sorted((root / "wandb").glob("offline-run-*")):
        out = {"id": None, "history": {}, "config": {}, "artifacts": [], "exited": False}
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
                elif kind == "exit":
                    out["exited"] = True
        attempts.append(out)
    return attempts


def mlflow_runs(root: Path, store: Path | None = None) -> tuple:
    """The MLflow client of the run's file store (or of `store`) and its runs."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=(store or root / "mlruns").resolve().as_uri())
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client, client.search_runs(experiments)
