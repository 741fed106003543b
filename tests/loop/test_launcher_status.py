"""A preempted run's exit status for the launcher: PREEMPTED_EXIT_CODE, or the marker file and 0 where the launcher
asks for one (the sbatch template, whose srun ends every task once one exits non-zero)."""

import pytest

from scale.errors import PREEMPTED_EXIT_CODE
from scale.loop.preemption import PREEMPTED_MARKER_ENV, launcher_status


def test_without_a_marker_the_status_is_unchanged(monkeypatch):
    monkeypatch.delenv(PREEMPTED_MARKER_ENV, raising=False)
    assert [launcher_status(s) for s in (0, 1, 2, PREEMPTED_EXIT_CODE)] == [0, 1, 2, PREEMPTED_EXIT_CODE]


@pytest.mark.parametrize("status", [0, 1, 2])
def test_other_statuses_keep_their_value_and_leave_no_marker(monkeypatch, tmp_path, status):
    marker = tmp_path / ".preempted-7"
    monkeypatch.setenv(PREEMPTED_MARKER_ENV, str(marker))
    assert launcher_status(status) == status
    assert not marker.exists()


def test_preemption_becomes_the_marker_and_status_0(monkeypatch, tmp_path):
    marker = tmp_path / ".preempted-7"
    monkeypatch.setenv(PREEMPTED_MARKER_ENV, str(marker))
    assert launcher_status(PREEMPTED_EXIT_CODE) == 0
    assert marker.exists()
