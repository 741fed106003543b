"""Data: shards (`shards/`: write, read, verify), the loader spec (`spec.py`) and loaders (`loader.py`, `dali/`),
multi-crop views, the embedded data sets, the exact evaluation passes (`evaluation.py`) that in-training validation
and `scale eval` share. docs/explanation/data.md lists the modules."""
