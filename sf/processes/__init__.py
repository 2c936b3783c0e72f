"""The lowest layer every process of a run uses: process control (parent-death signals, thread counts, affinity,
killing a process tree and what it leaves behind) and the small shared-memory state all processes read
(SharedState). Imports nothing of sf but itself: sampling, learning and the runner all build on it."""
