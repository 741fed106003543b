"""DALI's `mixed` decoding (nvJPEG) against its CPU mode and against the torchvision backend's CPU views:

- the same pipeline on the GPU and on the CPU draws the same crop parameters, and its views are within 1 grey
  level on average (99.9% of pixels within 16: nvJPEG's IDCT and chroma upsampling round differently);
- with the colour ops off, each view is the torchvision backend's crop-and-resize (scale.data.views.resize_crop)
  of the box DALI drew, within 2 grey levels on average (DALI's and Pillow's antialiased resampling);
- DALI on the GPU vs the torchvision pipeline on the CPU: images/s printed, not asserted."""

import tarfile

import numpy as np
import pytest
import torch
from gpu_env import SELF_CHECK, require_cuda

pytest.importorskip("nvidia.dali", reason="DALI not installed (pip install 'scale[dali]')")

from scale.data import embedded  # noqa: E402
from scale.data.dali.loader import DaliLoader, sample_key  # noqa: E402
from scale.data.dali.pipeline import PARAMS, build_pipeline  # noqa: E402
from scale.data.spec import LoaderSpec  # noqa: E402
from scale.data.throughput import bench_dali, bench_views  # noqa: E402
from scale.data.views import decode_rgb, resize_crop  # noqa: E402
from tests.data.helpers import tiny_cfg  # noqa: E402

pytestmark = pytest.mark.gpu

GLOBAL, LOCAL, N_LOCAL, BATCH = 32, 16, 2, 16
DALI_DEVICE = "cpu" if SELF_CHECK else "gpu"
NO_COLOUR = {
    "views.color_jitter_p": 0.0,
    "views.grayscale_p": 0.0,
    "views.blur_p": [0.0, 0.0],
    "views.local_blur_p": 0.0,
    "views.solarize_p": [0.0, 0.0],
    "views.local_solarize_p": 0.0,
    "views.flip_p": 0.0,
}


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """1200 train crops of 12 photos, 64x64 JPEGs, in 5 shards."""
    return embedded.build("photos", tmp_path_factory.mktemp("photos"))["train"]


def first_batch(photos, device: str, **overrides) -> dict:
    """One batch of the loader's pipeline with its random draws exposed: keys, and per view the crops in grey
    levels (normalisation undone, float [B, 3, S, S]) and the PARAMS."""
    cfg = tiny_cfg(photos, backend="dali", dali_device=device, shuffle_buffer=64, **overrides)
    cfg.views.global_size, cfg.views.local_sizes, cfg.views.n_local = GLOBAL, [LOCAL], [N_LOCAL]
    loader = DaliLoader(LoaderSpec(cfg, "train", BATCH, 0, 1, seed=5))
    outputs = build_pipeline(loader.spec(seed=11), expose=True).run()
    n_views = sum(loader.views.views_per_group)
    crops, params = outputs[2 : 2 + n_views], outputs[2 + n_views :]
    mean = np.array(cfg.views.mean).reshape(1, 3, 1, 1) * 255
    std = np.array(cfg.views.std).reshape(1, 3, 1, 1) * 255
    views = []
    for v, crop in enumerate(crops):
        crop = crop.as_cpu() if device == "gpu" else crop
        drawn = {name: np.stack([np.array(t) for t in params[v * len(PARAMS) + p]]) for p, name in enumerate(PARAMS)}
        views.append({"levels": np.array(crop.as_tensor()) * std + mean, **drawn})
    keys = [sample_key(bytes(np.asarray(outputs[0][i])).decode()) for i in range(BATCH)]
    return {"keys": keys, "views": views, "interpolation": cfg.views.interpolation}


def jpegs_by_key(shard_dir) -> dict[str, bytes]:
    out = {}
    for path in sorted(shard_dir.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".jpg"):
                    out[member.name.split(".", 1)[0]] = tar.extractfile(member).read()
    return out


def test_mixed_decoding_gives_the_cpu_views(photos):
    require_cuda("DALI mixed decoding")
    gpu, cpu = first_batch(photos, "gpu"), first_batch(photos, "cpu")
    assert gpu["keys"] == cpu["keys"]
    for v, (ours, ref) in enumerate(zip(gpu["views"], cpu["views"])):
        for name in PARAMS:
            np.testing.assert_array_equal(ours[name], ref[name], err_msg=f"view {v} {name}")
        diff = np.abs(ours["levels"] - ref["levels"])
        assert diff.mean() < 1.0 and np.quantile(diff, 0.999) < 16, (v, diff.mean(), np.quantile(diff, 0.999))


def test_views_are_the_torchvision_crops_of_the_drawn_boxes(photos):
    batch = first_batch(photos, DALI_DEVICE, **NO_COLOUR)
    jpegs = jpegs_by_key(photos)
    for v, view in enumerate(batch["views"]):
        size = view["levels"].shape[-1]
        for i, key in enumerate(batch["keys"]):
            (top, left), (height, width) = view["anchor"][i][:2], view["size"][i][:2]  # (y, x) and (h, w)
            pixels = torch.from_numpy(np.array(decode_rgb(jpegs[key]))).permute(2, 0, 1)
            box = (int(left), int(top), int(left + width), int(top + height))
            ref = resize_crop(pixels, box, size, batch["interpolation"]).float().numpy()
            diff = np.abs(view["levels"][i] - ref)
            assert diff.mean() < 2.0, (v, key, box, diff.mean())


def test_print_dali_gpu_vs_torchvision_cpu_throughput(photos, capsys):
    require_cuda("DALI on the GPU")
    views = tiny_cfg(photos).views
    views.global_size, views.local_sizes, views.n_local = 224, [96], [10]  # DINO's 2x224 + 10x96
    cpu = bench_views(views, photos, workers=1, images=256)
    gpu = bench_dali(views, photos, workers=1, images=256, device="gpu")
    with capsys.disabled():
        print(
            f"\nDINO views of 64 px photos, 1 CPU worker/thread: torchvision CPU {cpu['cpu']['images_per_s']:.1f} "
            f"images/s, DALI {gpu['device']} {gpu['images_per_s']:.1f} images/s"
        )
    assert gpu["device"] == "gpu" and gpu["images"] > 0
