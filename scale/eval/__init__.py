"""Evaluations of a backbone: k-NN, linear probe (lr grid), logistic-regression suite, correspondence, retrieval, copy
detection, video segmentation. `scale eval ...` runs them (scale/evaluate.py) and prints their results (tables.py);
images.py reads image files for the dense protocols (and `scale viz`); each other module holds one evaluation. Never
imports the training loop (scale/loop/): in-training validation and the k-NN monitor live there, fine-tuning is a run
of the loop (scale/loop/finetune.py), the evaluation dataset is scale/data/evaluation.py and the backbone's weights
are read by scale/checkpoint/weights.py."""
