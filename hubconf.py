"""torch.hub entry points: `torch.hub.load(SCALE_REPO_DIR, "backbone", path=EXPORT_DIR, source="local")` loads a
backbone exported by `scale ckpt export --format timm|hf` (a timm model; num_classes=0 gives features). A folder it
cannot load raises scale.checkpoint.share.ExportUnreadable, naming the file."""

dependencies = ["torch", "timm"]


def backbone(path: str, **kwargs):
    """The exported backbone in folder `path`, built by timm from its config.json and loaded strictly."""
    from scale.checkpoint.share import load_exported

    return load_exported(path, **kwargs)
