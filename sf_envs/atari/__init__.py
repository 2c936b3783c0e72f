"""Atari 2600 games through ale-py (ROMs included in the wheel): see atari_env.py."""
