"""Before and at the start of a run: the pre-flight checks (preflight.py), the experiment's lock
(experiment_lock.py), the fork server every process is started from (fork_server.py, fork_server_ready.py), a child's
start and its guarded main (supervision.py), train.py's body (entry.py)."""
