"""The parts of tools/device-check that are more than orchestration, one concern per module: the fp32 GPU/CPU
experiment (fp32), the profiler trace's busy time and gaps (trace), the official DINO step (official) and the
measured-rows table (rows). Importable on a machine without a GPU, so that their tests run in CI."""
