"""Recipe tooling: `check` (every recipe loads, its model builds on the meta device, its parameter count matches the
paper) and `smoke` (shrink any recipe to a tiny model on embedded data so its code path runs in seconds)."""
