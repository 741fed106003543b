"""Data: shards (WebDataset), their readers and loaders, multi-crop views, the embedded data sets."""
