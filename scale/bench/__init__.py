"""Throughput benchmarks and the capacity planner.

- `run`: real training steps of a recipe (the training loop's `train_step`), timed by phase, with peak memory
  (`memory`), per-rank state bytes and MFU, on shards or `synthetic` batches; `matrix`: several settings in one run,
  one table;
- `tables`: DINO Table 8, EsViT Table 9 and MoCo v3 Table 3 on the machine at hand;
- `trace`: what one step of a recipe computes and keeps, counted on fake tensors (no memory, no compute); `steptrace`:
  what it records (no torch); `trace_cache`: traces kept on disk, so that the planner's second call imports no torch;
- `memory_report`: per-rank state bytes of each engine after one step (`python -m scale.bench.memory_report`);
- `flops`: FLOPs per step and the device's peak FLOP/s (MFU); `plan`: per-GPU memory and step time of each engine.
"""
