"""torch.hub entry points: `torch.hub.load(SCALE_REPO_DIR, "backbone", path=EXPORT_DIR, source="local")` loads a
backbone exported by `scale ckpt export --format timm|hf` (a timm model; num_classes=0 gives features)."""

dependencies = ["torch", "timm"]


def backbone(path: str, **kwargs):
    """The exported backbone in folder `path`, built by timm from its config.json and loaded strictly."""
    import timm

    return timm.create_model(f"local-dir:{path}", pretrained=True, **kwargs)
