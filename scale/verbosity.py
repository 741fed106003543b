"""`scale -v`: show the warnings and log lines of libraries that `scale` otherwise keeps off the console.

Each quieted message is quieted once, where the library that emits it is imported or called, with a comment
saying why it tells the user nothing they can act on. `-v` sets SCALE_VERBOSE=1, which ranks spawned by
`--nproc` (and srun tasks of a job submitted from such a shell) inherit."""

import os

ENV = "SCALE_VERBOSE"


def verbose() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def set_verbose(on: bool) -> None:
    if on:
        os.environ[ENV] = "1"
