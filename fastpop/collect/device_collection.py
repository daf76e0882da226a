"""Device mode's collection: P members x E device envs (brax, gymnax, Playground) stepped on
the device by the policy the learner trains, two compiled calls per chunk (the chunk's plan,
programs and learner bookkeeping: fastpop.collect.chunk_programs; its rollout of the members'
lanes: fastpop.collect.device_rollout); rows never leave the device and no worker process is
started.
A `Collection` (fastpop.collect.sources)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator
from concurrent import futures
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.collect import chunk_programs, device_rollout, snapshot
from fastpop.compilation import stored_programs
from fastpop.compilation.background import in_background
from fastpop.config.sections import CollectConfig
from fastpop.learn.learner import Learner, LearnerParts
from fastpop.learn.update_protocol import Training
from fastpop.population import sharding
from fastpop.types import EnvSpec
from fastpop.xla_defaults import env_stepping_options


class DeviceParts(NamedTuple):
    """What device collection is made of (fastpop.run.parts.RunParts.device_parts)."""

    env: Any  # the DeviceEnv
    episode_length: int
    collect: CollectConfig
    eval_episodes: int
    population_size: int
    seed: int
    agent: Any
    env_spec: EnvSpec
    training: Training  # its `policies` and `update`, for the program per chunk
    mesh: Any  # None: one device
    # What decides its programs, to keep them on disk (fastpop.compilation.stored_programs);
    # None: not kept
    program_identity: str | None = None


class DeviceCollection:
    """P members x E device envs stepped on the device, two jitted calls per chunk of rows (env
    states donated), acting with each member's current exploration; evaluation on a separate
    batch of envs with the snapshot's policy held constant. With population.devices > 1 each
    device steps the envs of its own members. The learner's state it acts with comes in as
    arguments (`feed`, `next_chunk`)."""

    evaluator_restarts = 0  # nothing to restart
    chunks_per_pass = 1  # every call makes one: the loop checks signals and evaluations between

    def __init__(self, parts: DeviceParts, policy_template=None):
        """policy_template: shapes of the learner's `policy_tree` (what a snapshot decodes to);
        None: given later by `set_policy_template`, before the loop (`make_ahead` may then
        make the lanes and the chunk program beside the learner's making)."""
        self.parts = parts
        self.env, self.episode_length = parts.env, parts.episode_length
        key = jax.random.fold_in(jax.random.key(parts.seed), 0xDE1)
        self.key, lanes_key = jax.random.split(key)
        lanes = parts.population_size * parts.collect.envs_per_member
        init = device_rollout.lanes_init(self.env, lanes)
        # Lanes are member-major: split over the learner's mesh like the members they serve
        # (their scalars, a key, on every device).
        self._placement = None
        if parts.mesh is not None:
            split, everywhere = sharding.members(parts.mesh), sharding.replicated(parts.mesh)
            shapes = jax.eval_shape(init, lanes_key)
            self._placement = jax.tree.map(lambda s: split if s.ndim else everywhere, shapes)
        self._identity = parts.program_identity  # None on a mesh (run/parts.stored_identity)
        self._lanes, self._lanes_ahead = None, None  # made at first use, or by `make_ahead`
        self._lanes_program = stored_programs.stored_jit(init, self._identity, "lanes")
        self._lanes_key = lanes_key
        if self._placement is not None:
            self.lanes = jax.jit(init, out_shardings=self._placement)(lanes_key)
        elif policy_template is not None or jax.process_count() > 1:
            self.lanes = self._lanes_program(lanes_key)
        members = device_rollout.MemberLanes(
            self.env,
            self.episode_length,
            parts.agent,
            parts.env_spec,
            parts.training.policies,
            parts.population_size,
            parts.collect.envs_per_member,
            parts.collect.warmup_steps,
            parts.collect.chunk_len,
        )
        # The chunk's rollout (the collect program's first half), and it jitted alone.
        self.chunk_rollout = functools.partial(device_rollout.member_rollout, members)
        stepping = env_stepping_options()  # CPU: a shorter compile of an env's step
        self._chunk = jax.jit(self.chunk_rollout, donate_argnums=0, compiler_options=stepping)
        self._programs = None  # the chunk's programs, made at the first `feed`
        # or by `make_ahead`: (programs, their collect's compile, their update's compile)
        self._programs_ahead: tuple | None = None
        self._evaluate = stored_programs.stored_jit(
            self._evaluate_members, self._identity, "evaluate", compiler_options=stepping
        )
        self._evaluate_program: Future | None = None
        self._evaluation_wanted = False  # compiled ahead once `running` (after the first update)
        self._evaluations_wait = True  # `running` tells: each snapshot evaluated when handed in
        self._snapshots: list[dict] = []  # handed in, evaluated once the program is compiled
        self._results: list[dict] = []
        if policy_template is not None:
            self.set_policy_template(policy_template)

    def set_policy_template(self, policy_template) -> None:
        """What an evaluation snapshot decodes to: host arrays of the policy tree's shapes."""
        self._snapshot = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), policy_template
        )
        self._treedef = jax.tree.structure(policy_template)

    @property
    def lanes(self):
        if self._lanes_ahead is not None:  # made in a thread: its error, if any, raises here
            self._lanes, self._lanes_ahead = self._lanes_ahead.result(), None
        elif self._lanes is None:
            self._lanes = self._lanes_program(self._lanes_key)
        return self._lanes

    @lanes.setter
    def lanes(self, lanes) -> None:
        self._lanes, self._lanes_ahead = lanes, None

    # --- checkpoints ---

    def saved(self) -> dict:
        return {"lanes": self.lanes, "key": self.key}

    def restore(self, tree: dict) -> None:
        lanes = tree["lanes"]
        if self._placement is None:
            self.lanes = jax.tree.map(jnp.asarray, lanes)
        else:
            self.lanes = sharding.place_from_host(lanes, self._placement)
        self.key = tree["key"]

    # --- the run loop's interface ---

    @contextlib.contextmanager
    def running(self, learner: Learner, log_event, generation: int) -> Iterator[None]:
        """The evaluation program compiles in a thread once the first update calls have run:
        the first evaluation would otherwise stop the loop for as long (~5 s for the inverted
        pendulum on the CPU). Not sooner: compiled beside the chunk program, the two shared
        the GIL while tracing and the cores while compiling, and the first chunk came ~3 s
        later; traced beside the warm-up's chunks, it held the loop's thread back and the
        first update came ~1 s later (the brax preset on 2 cores, results/startup/README.md)."""
        self._evaluation_wanted = True
        self._evaluations_wait = learner.strategy.acts_on_evaluations
        yield

    def _compile_evaluation_ahead(self) -> None:
        """The evaluation's compile started in a thread, once, if the loop is `running`."""
        if self._evaluation_wanted and self._evaluate_program is None:
            self._evaluate_program = in_background(self._compile_evaluation)

    def stop(self) -> dict:
        return {}  # no worker processes, no stats of theirs

    def publishes_to(self, version: int) -> bool:
        return False  # the chunk's program acts with the learner's own states

    def publish(self, learner: Learner, copy) -> None:
        pass

    def feed(self, learner: Learner) -> list:
        """One chunk of every lane, inserted, and the updates it allows, as two compiled calls
        over the learner's state (fastpop.collect.chunk_programs.run_chunk); env lanes, buffers
        and member states are donated. No episodes are reported: their returns would have to
        cross to the host every chunk."""
        if self._programs is None:
            self._programs = self._chunk_programs(learner)
        self.key, key = jax.random.split(self.key)
        per_member, commit = self.parts.collect.envs_per_member, self._placement is None
        # One device: the arguments committed to it, as `make_ahead` compiles the programs.
        self.lanes = chunk_programs.run_chunk(
            self._programs, learner, self.lanes, key, per_member, commit
        )
        if learner.updates:
            self._compile_evaluation_ahead()
        return []

    def make_ahead(self, learner_parts: LearnerParts) -> Future | None:
        """Before the learner `learner_parts` make is made (run/parts.local_pieces; one device,
        one process): the env lanes made in a thread, and the chunk's programs traced here from
        shapes, a run's longest trace, while the learner is made in a thread (XLA compiles its
        members' init on the other core), each compiled in a thread of its own as soon as it
        is traced. Returns the learner's future (None where nothing is made ahead: the caller
        makes it). A cold brax start ~1-2 s sooner than with the learner made after the trace,
        and 1-3 s sooner again with the two programs compiled at once (alternating pairs,
        results/startup/README.md)."""
        if self._placement is not None or jax.process_count() > 1:
            return None
        self._lanes_ahead = in_background(self._lanes_program, self._lanes_key)
        add_rows, state = chunk_programs.chunk_program_inputs(learner_parts)
        learner = in_background(Learner, learner_parts)
        rollout, identity = self.chunk_rollout, self._identity
        programs = chunk_programs.chunk_programs(
            self.parts.training, add_rows, rollout, None, identity
        )
        lanes = stored_programs.output_shapes(self._lanes_program, self._lanes_key)
        compiles = [
            in_background(lowered.compile)
            for lowered in chunk_programs.lowerings(programs, lanes, state)
        ]
        self._programs_ahead = (programs, *compiles)
        return learner

    def _chunk_programs(self, learner: Learner) -> chunk_programs.ChunkPrograms:
        """The programs compiled ahead once their collect program is (the warm-up's chunks
        call no update: `feed` waits for its compile at the first update call), else (not
        asked for, or it failed: then it raises here, where the loop reports errors) made now,
        placed over the mesh as the learner is."""
        if self._programs_ahead is not None:
            programs, collect_compile, update_compile = self._programs_ahead
            if collect_compile.exception() is None:
                return programs._replace(update_compile=update_compile)
        placement = None
        if self.parts.mesh is not None:  # as the learner and `init` placed them
            arrays = (self.lanes, learner.replay.buffers, learner.states)
            placement = jax.tree.map(lambda leaf: leaf.sharding, arrays)
        return chunk_programs.chunk_programs(
            learner.training, learner.replay.add_rows, self.chunk_rollout, placement, self._identity
        )

    def next_chunk(self, states, hparams, member_steps: int):
        """The next `chunk_len` rows of every lane as device arrays, acting with the members'
        `states` and `hparams` after `member_steps` env steps each, without inserting them
        (what `fastpop bench device` times as collection alone)."""
        self.key, key = jax.random.split(self.key)
        self.lanes, rows = self._chunk(self.lanes, key, states, hparams, jnp.int32(member_steps))
        return rows, []

    def evaluate(self, arrays: dict) -> None:
        """Evaluates the snapshot now, or, where the strategy does not act on evaluations and
        the evaluation program is still compiling, once `evaluations` finds it compiled: the
        loop trains meanwhile (a cold brax pendulum run's first evaluation held training ~4 s
        for that compile). Where the strategy acts on them, waiting keeps a run's rounds, and
        so its numbers, the same from run to run."""
        self._snapshots.append(arrays)
        self._evaluate_handed_in(None if self._evaluations_wait else 0.0)

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        self._evaluate_handed_in(timeout)
        results, self._results = self._results, []
        return results

    def _evaluate_handed_in(self, timeout: float | None) -> None:
        """Evaluates the snapshots handed in, in order, once the evaluation program is compiled
        (waiting for it at most `timeout` seconds; None: as long as it takes). Without one it
        starts nothing: the loop asks every pass, and the compile waits for the first update."""
        if not self._snapshots:
            return
        self._compile_evaluation_ahead()
        if self._evaluate_program is not None:
            futures.wait([self._evaluate_program], timeout)
            if not self._evaluate_program.done():
                return
        while self._snapshots:
            self._evaluate_now(self._snapshots.pop(0))

    def _evaluate_now(self, arrays: dict) -> None:
        leaves, meta = snapshot.decode(arrays)
        policy, hparams, _ = jax.tree.unflatten(self._treedef, leaves)
        start = time.perf_counter()
        returns = self._member_returns(policy, hparams, self._evaluation_key(meta))
        self._results.append(
            {
                "eval_index": meta.eval_index,
                "env_steps": meta.env_steps,
                "updates": meta.updates,
                "wall_time": meta.wall_time,
                "return_mean": returns.mean(axis=1).tolist(),
                "return_std": returns.std(axis=1).tolist(),
                "seconds": time.perf_counter() - start,
            }
        )

    def _member_returns(self, policy, hparams, key) -> np.ndarray:
        """(P, episodes) returns of a decoded snapshot's members."""
        return np.asarray(self._evaluation_program()(policy, hparams, key), np.float64)

    def _evaluation_key(self, meta: snapshot.SnapshotMeta):
        return jax.random.fold_in(jax.random.key(self.parts.seed), 7919 * (meta.eval_index + 1))

    def _compile_evaluation(self):
        """The evaluation program for a decoded snapshot, as `evaluate` passes it (so it runs
        where the jitted call would). Shapes only: the learner's state is the loop's."""
        key = jax.eval_shape(lambda: self._evaluation_key(snapshot.SnapshotMeta(0, 0, 0, 0.0)))
        policy, hparams, _ = self._snapshot
        return self._evaluate.lower(policy, hparams, key).compile()

    def _evaluation_program(self):
        """The program compiled in the background (started now by an evaluation that comes
        before the first update: compiled from shapes either way, so that the program stored on
        disk is the same whichever came first), or, where that failed (or it was not
        `running`), the jitted call, which raises the same error here in the loop."""
        self._compile_evaluation_ahead()
        if self._evaluate_program is not None:
            try:
                return self._evaluate_program.result()
            except Exception:  # the jitted call below raises it where the loop reports it
                pass
        return self._evaluate

    # --- compiled programs ---

    def _evaluate_members(self, policy, hparams, key):
        episodes, agent = self.parts.eval_episodes, self.parts.agent
        return device_rollout.evaluate_members(
            self.env, self.episode_length, agent, policy, hparams, key, episodes
        )
