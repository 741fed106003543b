"""Thin command-line layers over the library: parse arguments, call one function, print its result."""

import argparse


def process_count(text: str) -> int:
    """--nproc: a whole number of processes, at least 1 (argparse prints the error and exits 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of processes, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"needs at least 1 process, got {value}")
    return value
