"""Helpers every layer may use (the lowest layer: they import nothing else of sf): atomic file writes and one-line
error texts (files.py), the user-facing error classes (errors.py), many tensors in one shared storage (packed.py)."""
