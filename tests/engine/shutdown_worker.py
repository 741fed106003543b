"""Run by test_dist as 2 ranks: does shutdown() wait for the peer on the success path, and not on a failure?
argv: mode (success | failure), a directory for the ranks' marker files."""

import json
import sys
import time
from pathlib import Path

from scale.engine.dist import init_distributed, shutdown

mode, folder = sys.argv[1], Path(sys.argv[2])
info, _ = init_distributed(timeout_minutes=2)
report = {"rank": info.rank}
if mode == "success":
    try:
        if info.rank == 0:
            time.sleep(1.0)  # rank 0 still working (writing results) while rank 1 is done
            (folder / "rank0_done").touch()
    finally:
        shutdown()
    report["peer_done_at_exit"] = (folder / "rank0_done").exists()
elif info.rank == 1:  # failure: rank 1 fails and must leave without waiting for rank 0
    try:
        try:
            raise RuntimeError("rank 1 fails")
        finally:
            shutdown()
    except RuntimeError:
        (folder / "rank1_left").touch()
else:  # rank 0 keeps working until it sees that rank 1 has left
    deadline = time.monotonic() + 60
    while not (folder / "rank1_left").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    report["peer_left"] = (folder / "rank1_left").exists()
sys.stdout.write(json.dumps(report) + "\n")
sys.stdout.flush()
