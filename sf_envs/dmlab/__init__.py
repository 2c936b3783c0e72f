"""DeepMind Lab integration (written against deepmind_lab's documented Python API; see docs/envs.md)."""
