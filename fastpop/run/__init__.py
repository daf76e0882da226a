"""One run: the loop, its progress and phases, stop signals, checkpoints and resume, metrics and
trackers, and the in-process driver the learning tests use."""
