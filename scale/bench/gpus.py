"""Known GPU models for `scale plan --gpu NAME`: memory and the name scale.bench.mfu.GPU_PEAK_TFLOPS knows them by.
Import-light (the command's parser lists the names)."""

# name -> (memory in GiB as torch.cuda reports it, peak-table name)
GPUS = {
    "a100-40gb": (39.4, "A100"),
    "a100-80gb": (79.1, "A100"),
    "h100-80gb": (79.1, "H100 SXM"),
    "h100-pcie-80gb": (79.1, "H100 PCIe"),
    "h200-141gb": (139.8, "H200"),
    "l40s-48gb": (44.4, "L40S"),
    "l4-24gb": (22.0, "L4"),
    "a10g-24gb": (22.0, "A10G"),
    "v100-16gb": (15.8, "V100"),
    "v100-32gb": (31.7, "V100"),
    "rtx4090-24gb": (23.6, "RTX 4090"),
}
DEFAULT_GPU = "a100-80gb"  # without --gpu, --gpu-mem or a local GPU: the papers' (DINO, EsViT) card
