"""Populations: the policies' hyperparameters in shared memory (control.py), population-based training's
decisions (pbt.py), and PBT across torchrun's ranks (link.py)."""
