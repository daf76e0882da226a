"""The samples-per-insert rate limiter (host side): keeps the learner's sampling and the
collectors' inserting at the configured ratio.

Whichever side is faster waits. The tolerance lets the two drift apart by a bounded number of
samples (jitter between a collector's chunks and a learner's calls), never by a fraction of
everything inserted so far: a bound that grew with the run would let the faster side run ahead
by that fraction for the whole run, so that a learner-bound run would end at
samples_per_insert * (1 - tolerance) instead of the configured experiment.
"""

from __future__ import annotations


class RateLimiter:
    """Keeps sampled / inserted transitions (per member) at `samples_per_insert`.

    Learning starts once `min_size` transitions are in; from then on the learner may sample
    (one call = `samples_per_call` transitions) and collection may insert (one chunk =
    `insert_size` transitions) while sampled stays within `slack` of samples_per_insert x
    inserted (both counted from the start of learning). The slack is a fixed number of samples,
    `tolerance` of `min_size` transitions' worth (tolerance * samples_per_insert * min_size, the
    error buffer of Acme's rate limiters), but never below one insert plus one call, so that one
    of the two is always allowed and nothing deadlocks. The achieved ratio is therefore within
    slack / inserted of the target and converges to it, whichever side is the bottleneck.
    """

    def __init__(
        self,
        samples_per_insert: float,
        min_size: int,
        tolerance: float,
        samples_per_call: int,
        insert_size: int,
    ):
        self.samples_per_insert = samples_per_insert
        self.min_size = min_size
        self.tolerance = tolerance
        self.samples_per_call = samples_per_call
        self.insert_size = insert_size
        self.inserted = 0  # per member, since the start
        self.sampled = 0  # per member, since learning started
        self.inserted_at_start: int | None = None  # inserted when learning started
        self.refill_from = 0  # inserted when the buffers last started empty (a resume without
        # saved replay starts them over)

    @property
    def slack(self) -> float:
        """How far (in samples) sampled may be from samples_per_insert x inserted."""
        minimum = self.samples_per_insert * self.insert_size + self.samples_per_call
        return max(self.tolerance * self.samples_per_insert * self.min_size, minimum)

    @property
    def learning(self) -> bool:
        return self.inserted_at_start is not None

    def _target(self) -> float:
        return self.samples_per_insert * (self.inserted - self.inserted_at_start)

    def can_insert(self) -> bool:
        if not self.learning:
            return True
        ahead = self._target() + self.samples_per_insert * self.insert_size - self.sampled
        return ahead <= self.slack

    def can_sample(self) -> bool:
        if not self.learning:
            return False
        return self.sampled + self.samples_per_call - self._target() <= self.slack

    def record_insert(self) -> None:
        self.inserted += self.insert_size
        if not self.learning and self.inserted - self.refill_from >= self.min_size:
            self.inserted_at_start = self.inserted

    def record_calls(self, calls: int = 1) -> None:
        """`calls` update calls started: their samples count (a call's count when it starts)."""
        self.sampled += calls * self.samples_per_call

    @property
    def achieved_samples_per_insert(self) -> float:
        """Sampled per inserted transition since learning started (nan before)."""
        if not self.learning or self.inserted == self.inserted_at_start:
            return float("nan")
        return self.sampled / (self.inserted - self.inserted_at_start)


class InProgramLimiter(RateLimiter):
    """Device mode: one compiled program per chunk makes the rows, inserts them and runs the
    update calls they allow, so there is no jitter to absorb and no side to wait for. The loop
    always inserts (`can_insert`), never samples on its own (`can_sample`); the program runs
    `calls_due()` calls: as many as keep sampled <= samples_per_insert x inserted, exactly."""

    def can_insert(self) -> bool:
        return True

    def can_sample(self) -> bool:
        return False

    def calls_due(self) -> int:
        """Update calls that bring sampled up to the target without passing it."""
        if not self.learning:
            return 0
        return max(0, int((self._target() - self.sampled) // self.samples_per_call))
