"""scale/loop/preemption.py in process: a run that is its own launcher takes a closed terminal and Ctrl-C as stop
signals (checkpoint, exit 3) and a Ctrl-C after one of them as Python's KeyboardInterrupt; a rank that a launcher
started leaves both to that launcher."""

import os
import signal

import pytest

from scale.loop.preemption import OWN_LAUNCHER_SIGNALS, Preemption

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, *OWN_LAUNCHER_SIGNALS)


@pytest.fixture(autouse=True)
def handlers():
    saved = {sig: signal.getsignal(sig) for sig in SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", OWN_LAUNCHER_SIGNALS)
def test_a_run_that_is_its_own_launcher_stops_at_a_step_on_hangup_or_ctrl_c(sig):
    preemption = Preemption(["SIGTERM", "SIGUSR1"], own_launcher=True)
    assert not preemption.requested()
    os.kill(os.getpid(), sig)
    assert preemption.received == sig.name
    assert preemption.requested()


def test_ctrl_c_after_a_stop_signal_stops_at_once():
    preemption = Preemption(["SIGTERM", "SIGUSR1"], own_launcher=True)
    os.kill(os.getpid(), signal.SIGTERM)
    assert preemption.received == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)


def test_a_rank_that_a_launcher_started_leaves_hangup_and_ctrl_c_alone():
    before = {sig: signal.getsignal(sig) for sig in OWN_LAUNCHER_SIGNALS}
    Preemption(["SIGTERM", "SIGUSR1"], own_launcher=False)
    assert {sig: signal.getsignal(sig) for sig in OWN_LAUNCHER_SIGNALS} == before
