"""MLflow: one MLflow run per scale run, reopened by id after a requeue. The store: `train.tracker.tracking_uri`,
else MLFLOW_TRACKING_URI, else a folder, <run>/mlruns (`mlflow ui --backend-store-uri <run>/mlruns`): no server, no
network. The experiment: `train.tracker.project`, else MLFLOW_EXPERIMENT_NAME, else meta.paper."""

import os
import re
import time
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from scale.trackers.sink import Sink, setting

PARAMS_PER_CALL = 100  # MLflow's limit per log_batch


def flat(tree, prefix: str = "") -> dict[str, str]:
    """{dotted key: value} of a nested dict (MLflow params are flat strings)."""
    if not isinstance(tree, dict):
        return {re.sub(r"[^\w\-. /]", "_", prefix[:-1]): str(tree)}  # the characters MLflow accepts in a key
    return {k: v for key, value in tree.items() for k, v in flat(value, f"{prefix}{key}.").items()}


def tracking_uri(settings, root: Path) -> str:
    return setting(settings.tracking_uri, "MLFLOW_TRACKING_URI", (root / "mlruns").resolve().as_uri())


def local_store(uri: str) -> Path | None:
    """The folder a file store (file: URI or plain path) or a SQLite store (the database file's folder) writes;
    None for a server (http, databricks, ...)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return Path(url2pathname(parsed.path) if parsed.scheme else uri)
    if parsed.scheme == "sqlite":  # sqlite:///relative.db, sqlite:////absolute.db
        return Path(uri.removeprefix("sqlite:///")).parent
    return None


class MlflowSink(Sink):
    package = "mlflow"

    def __init__(self, settings, root: Path, run_id: str | None, config: dict):
        uri = tracking_uri(settings, root)
        if urlparse(uri).scheme in ("", "file"):  # MLflow 3 keeps the file store behind this switch (no SQLAlchemy)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        # MLflow's usage telemetry (read when mlflow is first imported, just below) fetches a config from the
        # network and then draws from Python's global `random` in a thread of its own, at a time of its own: on
        # rank 0 only, into the stream each rank checkpoints. Off unless the environment turns it on.
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunStatus

        self.client = MlflowClient(tracking_uri=uri)
        if run_id is None:
            name = setting(settings.project, "MLFLOW_EXPERIMENT_NAME", settings.default_project)
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            tags = {tag: "" for tag in settings.tags}
            commit = config["scale"].get("git_commit")
            tags.update({"mlflow.source.git.commit": commit} if commit else {})
            run_id = self.client.create_run(experiment_id, run_name=settings.name, tags=tags).info.run_id
            params = [Param(k, v[:6000]) for k, v in flat(config).items()]
            for start in range(0, len(params), PARAMS_PER_CALL):
                self.client.log_batch(run_id, params=params[start : start + PARAMS_PER_CALL])
        else:
            self.client.update_run(run_id, status=RunStatus.to_string(RunStatus.RUNNING))
        self.run_id = run_id

    @staticmethod
    def stores(settings, root: Path) -> list[Path]:
        store = local_store(tracking_uri(settings, root))
        return [] if store is None else [store]

    def log(self, step: int, scalars: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in scalars.items()])

    def attach(self, paths: list[Path]) -> None:
        for path in paths:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), path.name)
            else:
                self.client.log_artifact(self.run_id, str(path))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)
