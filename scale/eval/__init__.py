"""Evaluations of a backbone: k-NN, linear probe (lr grid), k-NN monitor, logistic-regression suite, correspondence,
fine-tuning. `scale eval ...` (scale/commands/eval.py) runs them; each module holds one evaluation."""
