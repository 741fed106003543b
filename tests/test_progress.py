"""Progress in a file (a Slurm log): whole lines, never tqdm's `\\r` updates, so log records are never glued to a
bar (`... 2.55s/it, loss=3.4815]15:57:58 [rank 0] INFO ...`)."""

import io
import logging
import sys

from scale.progress import ProgressLines, progress_bar


def test_not_a_terminal_gets_whole_progress_lines_between_whole_log_lines(monkeypatch):
    out = io.StringIO()  # not a TTY, like a Slurm log
    monkeypatch.setattr(sys, "stderr", out)
    handler = logging.StreamHandler(out)
    log = logging.getLogger("test_progress")
    log.addHandler(handler)
    bar = progress_bar(total=4, desc="train")
    assert isinstance(bar, ProgressLines)
    bar.mininterval = 0  # a line at every update (30 s apart in a real log)
    for step in range(4):
        bar.update(1)
        bar.set_postfix(loss=f"{3.48 - step:.2f}")
        log.warning("logged at step %d", step + 1)
    bar.close()
    log.removeHandler(handler)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0].startswith("train: 1/4 (25%), ") and lines[0].endswith(" s/it")
    assert lines[1] == "logged at step 1"  # a record on its own line, after the progress line
    assert lines[-2].startswith("train: 4/4 (100%)") and lines[-2].endswith("loss=1.48")
