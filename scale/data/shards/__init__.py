"""WebDataset shards, one module per job: `write` (a source into shards), `read` (the manifest and a shard's member
index, what the loaders read), `verify` (`scale shards verify`), `jpeg` (the image bytes a shard stores, used by
write and verify) and `layout` (file names, checksums, the tar scan they share). DALI's index files are written by
scale/data/dali/index.py.

A shard directory holds `shard-NNNNNN.tar` files, one `shard-NNNNNN.idx` per tar (member offsets, so a loader can
read any sample by its position; it is also the marker that the shard is complete), one `shard-NNNNNN.dali-idx` (the
same offsets in the format of DALI's webdataset reader) and the manifest `_info.json`:

    {"format": "scale-shards-1", "source": "...", "label_kind": "single" | "multi" | "none",
     "classes": [names...], "num_samples": N, "num_skipped": K, "empty_classes": [names...], "options": {...},
     "shards": [{"name": "shard-000000.tar", "count": n, "sha256": "...", "bytes": b, "index": "shard-000000.idx"}],
     "skipped_report": "_skipped.tsv"}

Each sample is `KEY.jpg` (JPEG bytes), `KEY.cls` (class index as text; single-label), or `KEY.labels` (JSON list of
class indices; multi-label), and `KEY.json` ({"source": path, "width": w, "height": h}). Keys are the 9-digit position
of the item in the sorted source listing, so key order is deterministic and stable across reruns.
"""
