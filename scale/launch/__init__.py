"""Starting runs: local processes (gloo), Slurm jobs and their status."""
