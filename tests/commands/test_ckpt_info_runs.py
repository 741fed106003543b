"""`scale ckpt info` on a run without a loadable checkpoint lists what is there (each step folder, sealed or not,
and why it cannot be loaded) and exits 0; a path that is not a run is one line and exit 2."""

import json

from scale.checkpoint.store import TMP_PREFIX, step_name
from scale.cli import main as cli
from tests.checkpoint.test_steering import saved_run


def rows_of(out: str) -> dict[str, str]:
    """{path: the rest of its row} from the table `scale ckpt info` prints."""
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["step", "saved", "loadable", "path"])
    return {line.split()[-1]: line for line in lines[header + 1 :]}


def test_a_run_with_no_complete_checkpoint_lists_every_folder_and_why(tmp_path, capsys):
    root = saved_run(tmp_path / "checkpoints", steps=(2, 4))
    (root / step_name(4) / "meta.json").unlink()  # a partial write
    with open(next(p for p in (root / step_name(2)).rglob("*.distcp")), "ab") as f:
        f.write(b"x")  # another size than sealed
    (root / f"{TMP_PREFIX}{step_name(6)}").mkdir()  # a write that was killed
    assert cli(["ckpt", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[0].split(None, 1) == ["checkpoint", f"none loadable under {tmp_path}"], out
    rows = rows_of(out)
    assert list(rows) == [f"{TMP_PREFIX}{step_name(6)}", step_name(4), step_name(2)], out
    assert "not sealed" in rows[f"{TMP_PREFIX}{step_name(6)}"]
    assert "no meta.json" in rows[step_name(4)]
    assert "bytes, expected" in rows[step_name(2)]
    # the same from the checkpoints/ folder, as JSON
    assert cli(["ckpt", "info", str(root), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["checkpoints"]
    assert [(r["step"], r["loadable"] == "yes") for r in listed] == [(6, False), (4, False), (2, False)]


def test_a_damaged_newest_checkpoint_is_listed_and_the_previous_one_described(tmp_path, capsys):
    root = saved_run(tmp_path / "checkpoints", steps=(2, 4))
    damaged = next(p for p in (root / step_name(4)).rglob("*.distcp"))
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF  # same size: only the checksum tells
    damaged.write_bytes(bytes(data))
    assert cli(["ckpt", "info", str(tmp_path), "--verify"]) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[0].split() == ["checkpoint", str(root / step_name(2))], out
    rows = rows_of(out)
    assert "damaged" in rows[step_name(4)] and damaged.name in rows[step_name(4)], out
    assert rows[step_name(2)].split()[-2] == "yes"


def test_a_run_that_has_not_saved_yet_exits_0(tmp_path, capsys):
    (tmp_path / "config.yaml").write_text("meta: {name: x}\n")
    assert cli(["ckpt", "info", str(tmp_path)]) == 0
    assert "no checkpoint saved yet" in capsys.readouterr().out
    (tmp_path / "checkpoints").mkdir()  # created, still empty
    for path in (tmp_path, tmp_path / "checkpoints"):
        assert cli(["ckpt", "info", str(path)]) == 0
        assert "no checkpoint saved yet" in capsys.readouterr().out


def test_a_path_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path, tmp_path / "missing"):
        assert cli(["ckpt", "info", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a run directory" in err or "no such run directory" in err, err
        assert "Traceback" not in err
