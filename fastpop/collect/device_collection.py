"""Device mode's collection: P members x E device envs (brax, gymnax, Playground) stepped on
the device by the policy the learner trains, two compiled calls per chunk (the chunk's plan,
programs and learner bookkeeping: fastpop.collect.chunk_programs; its rollout of the members'
lanes: fastpop.collect.device_rollout); rows never leave the device and no worker process is
started.
A `Collection` (fastpop.collect.sources)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fastpop.collect import chunk_programs, device_rollout
from fastpop.collect.device_evaluation import DeviceEvaluation
from fastpop.compilation import stored_programs
from fastpop.compilation.background import in_background
from fastpop.config.sections import CollectConfig
from fastpop.learn.learner import Learner, LearnerParts, chunk_program_inputs
from fastpop.learn.update_protocol import Training
from fastpop.population import sharding
from fastpop.types import EnvSpec
from fastpop.xla_defaults import env_stepping_options


class DeviceParts(NamedTuple):
    """What device collection is made of (`RunParts.device`, fastpop.run.parts)."""

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


class EnvLanes:
    """The env lanes' states: made at first use by their stored program, or in a thread by
    `make_ahead`. Member-major: over a mesh, split like the members they serve (their
    scalars, a key, on every device). With `episode_draws` (the agent's: `Agent.episode_draws`)
    they keep each lane's episode draw too, added to what the stored program makes (the env's
    lanes alone, as `run/parts` sizes them)."""

    def __init__(
        self, env, count: int, key, mesh, identity: str | None, at_once: bool, episode_draws=False
    ):
        """`at_once`: made now (else at first use or by `make_ahead`); always so over a mesh."""
        init = device_rollout.lanes_init(env, count)
        self._complete = device_rollout.with_episode_draws if episode_draws else lambda s: s
        self.placement = None
        if mesh is not None:
            split, everywhere = sharding.members(mesh), sharding.replicated(mesh)
            shapes = self._complete(jax.eval_shape(init, key))
            self.placement = jax.tree.map(lambda s: split if s.ndim else everywhere, shapes)
        self._states, self._ahead = None, None
        self.program = stored_programs.stored_jit(init, identity, "lanes")
        self.key = key
        if self.placement is not None:
            complete_init = lambda key: self._complete(init(key))
            self.states = jax.jit(complete_init, out_shardings=self.placement)(key)
        elif at_once:
            self.states = self._complete(self.program(key))

    @property
    def states(self):
        if self._ahead is not None:  # made in a thread: its error, if any, raises here
            self._states, self._ahead = self._complete(self._ahead.result()), None
        elif self._states is None:
            self._states = self._complete(self.program(self.key))
        return self._states

    @states.setter
    def states(self, states) -> None:
        self._states, self._ahead = states, None

    def make_ahead(self) -> None:
        self._ahead = in_background(self.program, self.key)

    def shapes(self):
        return self._complete(stored_programs.output_shapes(self.program, self.key))

    def restore(self, lanes) -> None:
        """From a checkpoint's host arrays."""
        if self.placement is None:
            self.states = jax.tree.map(jnp.asarray, lanes)
        else:
            self.states = sharding.place_from_host(lanes, self.placement)


class DeviceCollection:
    """P members x E device envs stepped on the device, two jitted calls per chunk of rows (env
    states donated), acting with each member's current exploration; evaluation on a separate
    batch of envs with the snapshot's policy held constant (`DeviceEvaluation`). With
    population.devices > 1 each device steps the envs of its own members. The learner's state
    it acts with comes in as arguments (`feed`, `next_chunk`)."""

    evaluator_restarts = 0  # nothing to restart
    chunks_per_pass = 1  # every call makes one: the loop checks signals and evaluations between
    evaluation_type = DeviceEvaluation

    def __init__(self, parts: DeviceParts, policy_template=None):
        """policy_template: shapes of the learner's `policy_tree` (what a snapshot decodes to);
        None: given later by `set_policy_template`, before the loop (`make_ahead` may then
        make the lanes and the chunk program beside the learner's making)."""
        self.parts = parts
        key = jax.random.fold_in(jax.random.key(parts.seed), 0xDE1)
        self.key, lanes_key = jax.random.split(key)
        self._identity = parts.program_identity  # None on a mesh (run/parts.build_run)
        at_once = policy_template is not None or jax.process_count() > 1
        self.env_lanes = EnvLanes(
            parts.env,
            parts.population_size * parts.collect.envs_per_member,
            lanes_key,
            parts.mesh,
            self._identity,
            at_once,
            parts.agent.episode_draws,
        )
        members = device_rollout.MemberLanes(
            parts.env,
            parts.episode_length,
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
        self.evaluation = self.evaluation_type(parts, self._identity)
        if policy_template is not None:
            self.set_policy_template(policy_template)

    def set_policy_template(self, policy_template) -> None:
        """What an evaluation snapshot decodes to: host arrays of the policy tree's shapes."""
        self.evaluation.set_policy_template(policy_template)

    @property
    def lanes(self):
        return self.env_lanes.states

    @lanes.setter
    def lanes(self, lanes) -> None:
        self.env_lanes.states = lanes

    # --- checkpoints ---

    def saved(self) -> dict:
        return {"lanes": self.lanes, "key": self.key}

    def restore(self, tree: dict) -> None:
        self.env_lanes.restore(tree["lanes"])
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
        self.evaluation.start(wait_for_program=learner.strategy.acts_on_evaluations)
        yield

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
        per_member, commit = self.parts.collect.envs_per_member, self.env_lanes.placement is None
        # One device: the arguments committed to it, as `make_ahead` compiles the programs.
        self.lanes = chunk_programs.run_chunk(
            self._programs, learner, self.lanes, key, per_member, commit
        )
        if learner.updates:
            self.evaluation.compile_ahead()
        return []

    def make_ahead(self, learner_parts: LearnerParts) -> Future | None:
        """Before the learner `learner_parts` make is made (run/startup.start_device; one device,
        one process): the env lanes made in a thread, and the chunk's programs traced here from
        shapes, a run's longest trace, while the learner is made in a thread (XLA compiles its
        members' init on the other core), each compiled in a thread of its own as soon as it
        is traced. Returns the learner's future (None where nothing is made ahead: the caller
        makes it). A cold brax start ~1-2 s sooner than with the learner made after the trace,
        and 1-3 s sooner again with the two programs compiled at once (alternating pairs,
        results/startup/README.md)."""
        if self.env_lanes.placement is not None or jax.process_count() > 1:
            return None
        self.env_lanes.make_ahead()
        add_rows, state = chunk_program_inputs(learner_parts)
        learner = in_background(Learner, learner_parts)
        rollout, identity = self.chunk_rollout, self._identity
        programs = chunk_programs.chunk_programs(
            self.parts.training, add_rows, rollout, None, identity
        )
        lanes = self.env_lanes.shapes()
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
        self.evaluation.evaluate(arrays)

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        return self.evaluation.evaluations(timeout)
