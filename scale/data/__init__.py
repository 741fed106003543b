"""Data: shards (WebDataset), their readers and loaders, multi-crop views, the embedded data sets,
the exact evaluation passes (evaluation.py) that in-training validation and `scale eval` share."""
