"""Progress bars for long work: tqdm on the main rank, a no-op elsewhere (and when stderr is not a terminal the
bar still prints sparse updates, so logs of batch jobs stay readable)."""

import sys

from tqdm import tqdm


def progress_bar(total: int, initial: int = 0, enabled: bool = True, desc: str = "") -> tqdm:
    interactive = sys.stderr.isatty()
    return tqdm(
        total=total,
        initial=initial,
        disable=not enabled,
        desc=desc,
        dynamic_ncols=True,
        mininterval=0.5 if interactive else 30.0,
        file=sys.stderr,
    )
