"""Members per chunk: how the vectorized executor splits a population on a CPU (the chunks'
programs: fastpop.population.chunked).

On a CPU the best chunk size depends on the CPU (its caches and cores) and the program's shapes,
so `TunedUpdate` measures it the first time it meets a population size: interleaved rounds of
each candidate, compared with chunks of one member round by round (`pick_chunk`), cached in
memory and on disk (fastpop.population.tuning_cache). A run times its own update calls: it
starts with the rule of thumb (`fallback`) and, after REMEASURE_AFTER_CALLS calls, makes the
next ones with each candidate in turn (`Measurement`), so that no update waits for a
measurement and no work is thrown away (timing rounds on copies of the states, as a benchmark's,
would pause td3_pbt_halfcheetah_cpu's learner ~8 s on 2 cores). A measurement whose rounds
disagree (other load on the machine) is measured again by the next run, at most
NOISY_MEASUREMENTS times in all: on a machine that is never quiet every run would otherwise pay
for it again; that run starts with the earlier choice. A benchmark measures at its first call
instead, on copies of the states (`measure_at_first_call`, `calibrate`), so that no timed call
includes it. Where it cannot matter it does not measure: a population of one, a population whose
whole state fits in a CPU's L2 cache (one vmap), and programs with convolutions (one member at a
time: vmapped per-member convolution weights become grouped convolutions, which XLA:CPU runs at
about half the speed of separate ones).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Future
from typing import NamedTuple

import jax
import numpy as np

from fastpop.compilation.background import in_background
from fastpop.population import tuning_cache
from fastpop.population.chunked import ChunkedUpdate, chunk_size, copy_tree, population_size

log = logging.getLogger(__name__)

# FASTPOP_MEMBERS_PER_CHUNK: unset or "auto": measure; an integer: at most that many members
# per chunk, never measured; "rule": `fallback` members per chunk, never measured.
CHUNK_ENV = "FASTPOP_MEMBERS_PER_CHUNK"
LARGEST_CANDIDATE = 16  # beyond 16 members a chunk's state alone is far past any CPU's L2
SMALL_POPULATION_BYTES = 2 * 2**20  # whole population state at most this: one vmap
CALIBRATION_ROUNDS = 3
# Part of the cache key: a change to how chunk sizes are measured or picked must change it, so
# that choices made the old way are measured again.
MEASUREMENT = "members_per_chunk: pick_chunk against chunks of 1, rotating rounds"
STEADY_SPREAD = 0.1  # a candidate's time vs chunks of 1 varying more: measured under load
NOISY_MEASUREMENTS = 2  # measurements under load before the last one is kept for good
REMEASURE_AFTER_CALLS = 20  # calls a run makes with a provisional choice before it measures
_measure_later = True  # else at the first call, before its update (`fastpop bench`)


def measure_at_first_call() -> None:
    """From now on in this process the members per chunk are measured at the first call, before
    its update (a first measurement, or one made again after a measurement under load): for the
    benchmarks, whose timed calls must not include one (`fastpop bench` calls this)."""
    global _measure_later
    _measure_later = False


def candidates(size: int) -> list[int]:
    """Chunk sizes worth measuring: powers of two dividing `size` up to LARGEST_CANDIDATE, and
    the whole population when it is no larger."""
    powers = [c for c in (1, 2, 4, 8, 16) if c <= min(size, LARGEST_CANDIDATE) and size % c == 0]
    return sorted(set(powers + ([size] if size <= LARGEST_CANDIDATE else [])))


def rotating_rounds(sizes: list[int]) -> list[tuple[int, bool]]:
    """(chunk size, timed) for each call of a measurement: a first round of each candidate,
    not timed (a program's first run pays for its first allocations, or its compile), then
    CALIBRATION_ROUNDS timed rounds, each in another order so that drifting load on the machine
    favours no position."""
    calls = []
    for round_index in range(CALIBRATION_ROUNDS + 1):
        turn = round_index % len(sizes)
        calls += [(chunk, round_index > 0) for chunk in sizes[turn:] + sizes[:turn]]
    return calls


class Measurement:
    """The calls of one measurement, each with the next chunk size of `rotating_rounds`, and
    their timings: a run's own update calls (the measurement then costs no update, only the
    time the slower candidates take in their turns), or `calibrate`'s on copies."""

    def __init__(self, sizes: list[int]):
        self.calls = rotating_rounds(sizes)
        self.rounds: dict[int, list[float]] = {chunk: [] for chunk in sizes}

    def next_chunk(self) -> int:
        return self.calls[0][0]

    def record(self, seconds_per_member: float) -> None:
        chunk, timed = self.calls.pop(0)
        if timed:
            self.rounds[chunk].append(seconds_per_member)

    @property
    def done(self) -> bool:
        return not self.calls


class Choice(NamedTuple):
    """A population's members per chunk (None: to be measured, under `cache_key`)."""

    chunk: int | None
    how: str
    cache_key: str = ""
    summary: str = ""  # what is measured, kept with the measurement
    noisy_measurements: int = 0  # earlier measurements whose rounds disagreed
    measure_again: bool = False  # `chunk` is provisional (the rule of thumb, or measured under
    # load): measured after REMEASURE_AFTER_CALLS calls


class TunedUpdate(ChunkedUpdate):
    """A ChunkedUpdate whose chunk size is chosen per population size on first use (CPU).

    `describe(states, replay, hparams, key)` -> (a summary of the program, its shapes, whether
    it has convolutions), for the cache; `fallback`: members per chunk under
    FASTPOP_MEMBERS_PER_CHUNK=rule.
    """

    def __init__(self, member_loop, replay_axis, describe, fallback: int | None):
        super().__init__(member_loop, replay_axis, None)
        self.describe = describe
        self.fallback = fallback
        self.chosen: dict[int, int] = {}  # population size -> members per chunk
        self.how: dict[int, str] = {}  # population size -> how the size was chosen
        self.known: dict[int, Choice] = {}  # `_known_choice`'s, once per size (it traces)
        self.calls: dict[int, int] = {}  # population size -> update calls so far
        self.live: dict[int, Measurement] = {}  # population size -> its calls measuring
        # The other candidates' programs, compiled while a provisional choice runs the first
        # calls (`compile_ahead`): the measurement then times them without compiling them.
        self.candidates_ahead: Future | None = None

    def __call__(self, states, replay, hparams, key):
        if isinstance(jax.tree.leaves(hparams)[0], jax.core.Tracer):
            return super().__call__(states, replay, hparams, key)  # inside a program: untimed
        size = population_size(hparams)
        if self._measurement_due(size):
            self.known[size] = self.known[size]._replace(measure_again=False)
            self._wait_for_candidates()
            self.live[size] = Measurement(candidates(size))
        self.calls[size] = self.calls.get(size, 0) + 1
        if size in self.live:
            return self._measured_call(size, states, replay, hparams, key)
        return super().__call__(states, replay, hparams, key)

    def measures_again(self, hparams) -> bool:
        """Whether the next call is one of those that measure the members per chunk: the run's
        first REMEASURE_AFTER_CALLS calls used a provisional choice (the rule of thumb where
        nothing was measured on this CPU yet, or an earlier measurement made under load), and
        the next `rotating_rounds` calls time each candidate in turn."""
        size = population_size(hparams)
        return size in self.live or self._measurement_due(size)

    def _measurement_due(self, size: int) -> bool:
        known = self.known.get(size)
        due = self.calls.get(size, 0) == REMEASURE_AFTER_CALLS
        return known is not None and known.measure_again and due

    def _measured_call(self, size, states, replay, hparams, key):
        """One update call with the measurement's next chunk size; the last one keeps the
        choice."""
        live = self.live[size]
        states, metrics = self._timed_call(live, states, replay, hparams, key, size)
        if live.done:
            del self.live[size]
            self._note(size, *self._keep(size, live.rounds))
        return states, metrics

    def _timed_call(self, measurement: Measurement, states, replay, hparams, key, members: int):
        """`run` with the measurement's next chunk size on the first `members` members, timed
        alone (what earlier calls and inserts left to compute is waited for first) and recorded
        per member."""
        jax.block_until_ready((states, replay))
        start = time.perf_counter()
        out = self.run(measurement.next_chunk(), states, replay, hparams, key, members)
        jax.block_until_ready(out[0])
        measurement.record((time.perf_counter() - start) / members)
        return out

    def chunk_for(self, states, replay, hparams, key) -> int:
        size = population_size(hparams)
        if size not in self.chosen:
            self._note(size, *self._choose(size, states, replay, hparams, key))
        return self.chosen[size]

    def settled_chunk(self, states, replay, hparams, key) -> int | None:
        """None while the choice is provisional: each call then goes through `__call__`, which
        counts it and measures when due."""
        chunk, size = self.chunk_for(states, replay, hparams, key), population_size(hparams)
        provisional = self.known[size].measure_again or size in self.live
        return None if provisional else chunk

    def _note(self, size: int, chunk: int, how: str) -> None:
        self.chosen[size], self.how[size] = chunk, how
        log.info("vectorized: %d members per chunk at P=%d (%s)", chunk, size, how)

    def chunks_ahead(self, states, replay, hparams, key) -> list[int]:
        """The size chosen without measuring where it can be, else every candidate (the first
        call measures them all)."""
        size = population_size(hparams)
        if size in self.chosen:
            return [self.chosen[size]]
        known = self._known_choice(size, states, replay, hparams, key)
        return candidates(size) if known.chunk is None else [known.chunk]

    def compile_ahead(self, states, replay, hparams, key) -> None:
        """The first call's programs, then, where its choice is provisional, the other
        candidates' in a thread of their own: the first update does not wait for them."""
        super().compile_ahead(states, replay, hparams, key)
        size = population_size(hparams)
        known = self.known.get(size)
        if known is not None and known.measure_again:
            others = [chunk for chunk in candidates(size) if chunk != known.chunk]
            arguments = (others, states, replay, hparams, key)
            self.candidates_ahead = in_background(self.compile_chunks, *arguments)

    def _known_choice(self, size, states, replay, hparams, key) -> Choice:
        """The chunk size where nothing needs measuring (chunk None: measure), worked out once
        per size. Reads only shapes: `compile_ahead` calls it before any row exists."""
        if size not in self.known:
            self.known[size] = self._work_out_choice(size, states, replay, hparams, key)
        return self.known[size]

    def _work_out_choice(self, size, states, replay, hparams, key) -> Choice:
        setting = os.environ.get(CHUNK_ENV, "auto").strip().lower()
        if setting.isdigit() and int(setting) > 0:
            return Choice(chunk_size(size, int(setting)), f"{CHUNK_ENV}={setting}")
        if size == 1:
            return Choice(1, "one member")
        summary, shapes, convolutions = self.describe(states, replay, hparams, key)
        if convolutions:
            return Choice(1, "convolutions: one member at a time")
        state_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(states))
        if state_bytes <= SMALL_POPULATION_BYTES:
            return Choice(size, f"population state {state_bytes / 2**20:.2f} MiB: one vmap")
        if setting == "rule":
            return Choice(chunk_size(size, self.fallback), f"{CHUNK_ENV}=rule")
        cache_key = tuning_cache.key(MEASUREMENT, summary, shapes, f"P={size}")
        cached = tuning_cache.load(cache_key) or {}
        noisy = cached.get("noisy_measurements", 0)
        call = REMEASURE_AFTER_CALLS + 1
        if not cached:
            if not _measure_later:
                return Choice(None, "to measure", cache_key, summary)
            how = f"not measured yet on this CPU: the rule of thumb until update call {call}"
            return Choice(chunk_size(size, self.fallback), how, cache_key, summary, 0, True)
        how = f"measured before ({tuning_cache.path()})"
        if not 0 < noisy < NOISY_MEASUREMENTS:  # steady, or the last one allowed
            return Choice(int(cached["members_per_chunk"]), how)
        if not _measure_later:
            return Choice(None, "to measure", cache_key, summary, noisy)
        how += f" under load; measured again at update call {call}"
        return Choice(int(cached["members_per_chunk"]), how, cache_key, summary, noisy, True)

    def _choose(self, size, states, replay, hparams, key) -> tuple[int, str]:
        known = self._known_choice(size, states, replay, hparams, key)
        if known.chunk is not None:
            return known.chunk, known.how
        return self._measure(size, states, replay, hparams, key)

    def _measure(self, size, states, replay, hparams, key) -> tuple[int, str]:
        """Measures the chunk sizes on copies of the states (`calibrate`): a benchmark's first
        call."""
        return self._keep(size, self.calibrate(size, states, replay, hparams, key))

    def _keep(self, size: int, rounds: dict[int, list[float]]) -> tuple[int, str]:
        """The chunk size picked from timed rounds, kept in the tuning cache."""
        known = self.known[size]
        chunk, ratios, steady = pick_chunk(rounds)
        # A measurement disturbed by other load is kept with its count: measured again by the
        # next run until NOISY_MEASUREMENTS of them.
        noisy = 0 if steady else known.noisy_measurements + 1
        entry = {"members_per_chunk": chunk, "time_vs_one_member": ratios, "what": known.summary}
        tuning_cache.store(
            known.cache_key,
            {**entry, "population": size} | ({"noisy_measurements": noisy} if noisy else {}),
        )
        timings = ", ".join(f"{c}: {ratio:.3f}" for c, ratio in sorted(ratios.items()))
        again = "measured again by the next run" if noisy < NOISY_MEASUREMENTS else "kept"
        note = f"; rounds disagreed ({noisy} of {NOISY_MEASUREMENTS}: {again})" if noisy else ""
        return chunk, f"measured: time per member vs chunks of 1 {{{timings}}}{note}"

    def calibrate(self, size, states, replay, hparams, key) -> dict[int, list[float]]:
        """Seconds per member of each candidate chunk size in each timed round of
        `rotating_rounds`: the same members (the first `largest candidate` of them) updated by
        each, on copies of the states."""
        self._wait_for_candidates()
        sizes = candidates(size)
        members = max(sizes)
        work = copy_tree(states)
        measurement = Measurement(sizes)
        while not measurement.done:
            work, _ = self._timed_call(measurement, work, replay, hparams, key, members)
        return measurement.rounds

    def _wait_for_candidates(self) -> None:
        """Until the candidates' programs compiled ahead are (one that failed compiles again
        at its first run)."""
        if self.candidates_ahead is not None:
            self.candidates_ahead.exception()
            self.candidates_ahead = None


def pick_chunk(rounds: dict[int, list[float]]) -> tuple[int, dict[int, float], bool]:
    """The chunk size to use from timed rounds {chunk: [seconds per member in each round]}
    (chunk 1 included): (chunk, median time relative to chunk 1, whether the rounds agree).

    Chunks of one member run the sequential executor's program, so they are the safe choice: a
    larger chunk is taken only if it beat chunks of 1 in every round (a candidate that was only
    lucky to meet a quiet moment of a shared machine does not), and then the one with the lowest
    median time relative to chunks of 1 in the same round."""
    ratios = {
        c: [t / one for t, one in zip(times, rounds[1], strict=True)] for c, times in rounds.items()
    }
    medians = {c: float(np.median(r)) for c, r in ratios.items()}
    eligible = [c for c, r in ratios.items() if c == 1 or max(r) < 1.0]
    steady = all(max(r) - min(r) <= STEADY_SPREAD for r in ratios.values())
    return min(eligible, key=medians.get), medians, steady


def has_convolutions(function, *abstract_args) -> bool:
    """Whether `function` traced at these argument shapes runs any convolution."""
    jaxpr = jax.make_jaxpr(function)(*abstract_args)
    return "conv_general_dilated" in str(jaxpr)


def abstract_member(tree):
    """ShapeDtypeStructs of one member of a stacked tree."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), tree)


def shapes_text(tree) -> str:
    return str(jax.tree.map(lambda x: f"{x.dtype}{list(x.shape)}", tree))
