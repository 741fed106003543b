"""`scale eval retrieval`: revisited Oxford/Paris mAP with the easy/hard/junk rules on known rankings, the ground
truth pickle read without running code, and the data set layout made up on disk."""

import json
import os
import pickle

import numpy as np
import pytest
from PIL import Image

from scale.cli import main as cli
from scale.errors import UserError
from scale.eval import ranking, retrieval, safe_pickle

TINY_VIT = ["model.pooling=cls", "model.img_size=32", "model.patch_size=8"]


def test_average_precision_of_a_known_ranking():
    # positives at ranks 0 and 2 of 2: (1 + 1) / 2 / 2 + (1/2 + 2/3) / 2 / 2
    assert ranking.average_precision([0, 2], 2) == pytest.approx(0.5 + 7 / 24)
    assert ranking.average_precision([0], 2) == pytest.approx(0.5)  # one positive never found
    assert ranking.average_precision([], 3) == 0.0


def test_revisited_map_with_junk_easy_and_hard():
    ranks = np.array([[3, 0, 5, 1, 4, 2], [0, 1, 2, 3, 4, 5]]).T  # [database, queries]
    gnd = [
        {"easy": [0], "hard": [1], "junk": [3]},
        {"easy": np.array([2]), "hard": np.array([], dtype=np.int64), "junk": []},
    ]
    # query 0, Medium: junk 3 leaves [0, 5, 1, 4, 2]: positives 0 and 1 at ranks 0 and 2 -> 0.5 + 7/24
    # query 1, Medium: positive 2 at rank 2 -> (0/2 + 1/3) / 2 = 1/6
    assert ranking.revisited_map(ranks, gnd, "medium") == pytest.approx(100 * (0.5 + 7 / 24 + 1 / 6) / 2)
    # query 0, Hard: junk 3 and easy 0 leave [5, 1, 4, 2]: positive 1 at rank 1 -> (0 + 1/2) / 2; query 1 has no
    # hard positive and is left out of the mean
    assert ranking.revisited_map(ranks, gnd, "hard") == pytest.approx(25.0)
    assert ranking.revisited_map(ranks, gnd, "easy") == pytest.approx(100 * (1.0 + 1 / 6) / 2)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_ground_truth_pickle_is_read_without_running_code(tmp_path):
    good = tmp_path / "good.pkl"
    good.write_bytes(pickle.dumps({"gnd": [{"bbx": np.array([1.0, 2.0]), "easy": np.arange(3)}], "n": 1.5}, 2))
    value = safe_pickle.load(good)
    np.testing.assert_array_equal(value["gnd"][0]["easy"], [0, 1, 2])
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps({"gnd": Evil()}))
    with pytest.raises(UserError, match=r"evil.pkl: not a plain-data pickle \(refused global (posix|os)\.system\)"):
        safe_pickle.load(evil)


def make_revisited(root, dataset="roxford5k"):
    """6 database images; query q0 is a copy of database image 0 (easy), q1 of image 1 (hard)."""
    folder = root / dataset
    (folder / "jpg").mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"db_{i}" for i in range(6)]
    for name in names:
        Image.fromarray(rng.integers(0, 255, (40, 56, 3), dtype=np.uint8)).save(folder / "jpg" / f"{name}.jpg")
    for query, source in (("q0", "db_0"), ("q1", "db_1")):
        (folder / "jpg" / f"{query}.jpg").write_bytes((folder / "jpg" / f"{source}.jpg").read_bytes())
    gnd = [
        {"bbx": [0.0, 0.0, 56.0, 40.0], "easy": np.array([0]), "hard": np.array([], np.int64), "junk": np.array([5])},
        {"bbx": [0.0, 0.0, 56.0, 40.0], "easy": np.array([], np.int64), "hard": np.array([1]), "junk": np.array([])},
    ]
    (folder / f"gnd_{dataset}.pkl").write_bytes(pickle.dumps({"imlist": names, "qimlist": ["q0", "q1"], "gnd": gnd}))
    return root


def test_layout_is_read_and_a_missing_file_is_named(tmp_path):
    root = make_revisited(tmp_path)
    data = retrieval.read_revisited(root, "roxford5k")
    assert len(data.images) == 6 and [q.stem for q in data.queries] == ["q0", "q1"]
    (root / "roxford5k" / "jpg" / "db_4.jpg").unlink()
    with pytest.raises(UserError, match="db_4.jpg"):
        retrieval.read_revisited(root, "roxford5k")
    with pytest.raises(UserError, match="gnd_rparis6k.pkl"):
        retrieval.read_revisited(root, "rparis6k")


@pytest.mark.parametrize("options", [[], ["--multiscale", "--query-crop"]])
def test_cli_ranks_the_copies_first(tmp_path, options):
    root = make_revisited(tmp_path)
    out = tmp_path / "retrieval.json"
    args = ["eval", "retrieval", "demo/dino_tiny", *TINY_VIT, "--random-init", "--data", str(root), "--imsize", "48"]
    assert cli([*args, *options, "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    # each query is a copy of its positive: cosine 1, ranked first, whatever the features
    assert result["medium_map"] == pytest.approx(100.0) and result["hard_map"] == pytest.approx(100.0)
    assert [row[0] for row in result["ranks_top10"]] == [0, 1]


def test_cli_names_the_missing_file(tmp_path, capsys):
    root = make_revisited(tmp_path)
    (root / "roxford5k" / "jpg" / "q1.jpg").unlink()
    args = ["eval", "retrieval", "demo/dino_tiny", *TINY_VIT, "--random-init", "--data", str(root)]
    assert cli(args) == 2
    assert "q1.jpg" in capsys.readouterr().err
