"""Correspondence accuracy and distance error on feature maps whose right answer is known."""

import pytest
import torch
import torch.nn as nn

from scale.data.batch import Batch
from scale.eval.correspondence import evaluate, match_scores, second_view

MEAN, STD = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)


class RowProfile(nn.Module):
    """Tokens of 4x4 patches: the per-row means of each patch (per channel). A horizontal flip maps the patch at
    (r, c) to (r, w-1-c) and leaves its row means unchanged, so the true match is exact (cosine 1)."""

    def forward(self, x):
        b, ch, height, width = x.shape
        patches = x.reshape(b, ch, height // 4, 4, width // 4, 4)
        tokens = patches.mean(dim=5).permute(0, 2, 4, 1, 3).reshape(b, (height // 4) * (width // 4), ch * 4)
        return {"tokens": tokens, "grid": (height // 4, width // 4), "pooled": tokens.mean(1)}


class PositionOnly(nn.Module):
    """Tokens that encode their grid position and ignore the image: they match the unflipped position."""

    def forward(self, x):
        b, _, height, width = x.shape
        n = (height // 4) * (width // 4)
        return {"tokens": torch.eye(n).expand(b, n, n), "grid": (height // 4, width // 4), "pooled": torch.zeros(b, n)}


def batches(count=3, size=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    for _ in range(count):
        images = torch.rand(size, 3, 32, 32, generator=g)
        yield Batch([(images - mean) / std], [1], torch.zeros(size, dtype=torch.long), [])


def test_row_profile_map_finds_every_mirrored_token():
    result = evaluate(RowProfile(), batches(), torch.device("cpu"), MEAN, STD, jitter=(0, 0, 0, 0), grayscale_p=0.0)
    assert result["accuracy"] == pytest.approx(100.0)
    assert result["distance_error_px"] == pytest.approx(0.0)
    assert result["similarity"] == pytest.approx(1.0, abs=1e-5)
    assert result["images"] == 6 and result["top"] == 10


def test_position_only_map_never_finds_the_mirror():
    result = evaluate(PositionOnly(), batches(), torch.device("cpu"), MEAN, STD, jitter=(0, 0, 0, 0), grayscale_p=0.0)
    assert result["accuracy"] == 0.0
    assert result["distance_error_px"] > 4.0  # at least one 4-px token off (even grid: no token is its own mirror)


def test_distance_error_of_an_unmirrored_match():
    """Tokens matched to their own position: the error of token (r, c) is |2c - (w-1)| tokens times the stride."""
    h, w, stride = 2, 4, (8.0, 5.0)
    tokens = torch.eye(h * w).unsqueeze(0)
    scores = match_scores(tokens, tokens, (h, w), stride, top=h * w)
    expected = sum(abs(2 * c - (w - 1)) * stride[1] for _ in range(h) for c in range(w)) / (h * w)
    assert scores["accuracy"].item() == 0.0
    assert scores["distance"].item() == pytest.approx(expected)


def test_second_view_is_a_flip_then_jitter_and_greyscale():
    g = torch.Generator().manual_seed(1)
    images = torch.rand(3, 3, 8, 8, generator=g)
    assert torch.equal(second_view(images, g, (0, 0, 0, 0), 0.0), images.flip(-1))
    grey = second_view(images, g, (0.4, 0.4, 0.2, 0.1), 1.0)
    assert torch.allclose(grey[:, 0], grey[:, 1]) and torch.allclose(grey[:, 1], grey[:, 2])
    jittered = second_view(images, g, (0.4, 0.4, 0.2, 0.1), 0.0)
    assert not torch.allclose(jittered, images.flip(-1))
    assert jittered.min() >= 0 and jittered.max() <= 1


def test_mild_jitter_keeps_most_matches():
    result = evaluate(RowProfile(), batches(count=4), torch.device("cpu"), MEAN, STD, grayscale_p=0.0, seed=2)
    assert result["accuracy"] > 50.0  # chance is 1/64
