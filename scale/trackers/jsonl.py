"""metrics.jsonl: one JSON object per logged step, always written (scale status and scale report read it)."""

import json
import time
from pathlib import Path

from scale.nofollow import open_text


class JsonlSink:
    def __init__(self, path: Path):
        self._file = open_text(path, "a")

    def log(self, step: int, record: dict) -> None:
        self._file.write(json.dumps({"step": step, "time": time.time(), **record}) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
