"""The training loop: `scale train` (train.py) runs the step (step.py) over the loader, with the run directory
(rundir.py), resume checks (resume.py), preemption, the run lock, disk-space checks, the per-step
monitors, in-training validation (validation.py) and the k-NN monitor (knn_monitor.py). The top of the training
stack: it imports engine/, methods/, data/, checkpoint/ and the rest; none of them, nor eval/, imports it."""
