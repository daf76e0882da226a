"""What the machine offers this process: the cores it may run on (collectors' emulator threads,
whether collectors start before the learner, the tuning cache's machine key)."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS says)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
