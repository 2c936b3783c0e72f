"""The run's health: replacing a process that died (healing.py), the stall watchdog (watchdog.py), stopping
every process with a final checkpoint (stopping.py), deaths and crashes judged (deaths.py)."""
