"""Collector processes: step a fixed set of (member, env) slots with one batched policy call.

A collector runs in a `spawn`-started process and never touches an accelerator: JAX is forced
onto the CPU with one intra-op thread before it starts a backend, so collectors do not compete
with the learner for cores more than their own stepping needs. Parameters arrive through a
`ParamChannel`, transition chunks leave through the collector's own `ChunkRing`, the stop
request is a `StopFlag`, and a pipe carries its final stats or its traceback.

Start-up: a collector imports no JAX (nor flax, optax, the agents or the config sections)
for its warm-up's random steps, and none at all where it acts in numpy (MLP policies of TD3, SAC
and DQN on vector observations: `collect/numpy_policy.py`). What it is sent is plain data
(`CollectorSpec`, with `CollectorEnvs`, a `RowLayout` rather than the config and the replay
spec, and a `NumpyPolicy`), so its first rows wait only for gymnasium and the simulator; any
other agent, with its jitted batched policy, is rebuilt from its `AgentRecipe` (not from the
config) at the collector's first step that acts with a policy (tests/test_collector.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from typing import Any, NamedTuple

import numpy as np

from fastpop.collect import numpy_policy
from fastpop.collect.lockstep_envs import lockstep_envs
from fastpop.collect.numpy_policy import NumpyActing, NumpyPolicy
from fastpop.collect.rows import RowLayout, RowStream
from fastpop.collect.shm import ChunkRing, ChunkRingSpec, ParamChannel, ParamSpec, StopFlag
from fastpop.gc_settings import tune_for_tracing
from fastpop.types import EnvSpec


class CollectorEnvs(NamedTuple):
    """What a collector reads of the config before its warm-up ends, as plain data (made once,
    with the run's parts: fastpop.run.parts.process_parts)."""

    env_id: str
    atari: Any  # envs.AtariOptions, or None for other envs
    atari_vector: bool
    num_collectors: int
    envs_per_member: int
    warmup_steps: int  # per member


class AgentRecipe(NamedTuple):
    """What a spawned worker rebuilds the learner's agent from, as plain data (an agent is
    functions: it does not cross the spawn boundary): `fastpop.agents.make_agent(algo,
    env_spec, **fields)` once the run's `plugins`, which may register the algorithm, are
    imported. Made with the run's parts (fastpop.run.parts.process_parts)."""

    algo: str
    env_spec: EnvSpec  # the learner's: a worker does not make an env to read the shapes again
    fields: dict  # the config's agent section
    plugins: tuple[str, ...]  # the config's plugin modules


def hparams_layout(hparams) -> dict:
    """The layout of stacked `hparams` (an HParams of arrays or of their shapes) as plain data:
    per field, (shape, dtype name), or None where the field is unset."""
    return {
        name: None if value is None else (tuple(value.shape), np.dtype(value.dtype).name)
        for name, value in hparams._asdict().items()
    }


def rebuild_agent(recipe: AgentRecipe, published_hparams: dict):
    """(agent, the tree structure of what the learner publishes) in a spawned worker.
    `published_hparams`: the `hparams_layout` of the hparams the learner publishes beside its
    policies (`Workers`), from which the structure is traced (shapes only)."""
    import importlib

    import jax

    from fastpop.agents import make_agent

    for module in recipe.plugins:  # imported by the parent already: they cannot fail here
        importlib.import_module(module)
    agent = make_agent(recipe.algo, recipe.env_spec, **recipe.fields)
    fields = {
        name: None if layout is None else jax.ShapeDtypeStruct(*layout)
        for name, layout in published_hparams.items()
    }
    hparams = type(agent.default_hparams())(**fields)
    return agent, jax.tree.structure(policy_template(agent, hparams))


class CollectorSpec(NamedTuple):
    """Plain data that crosses the spawn boundary (our own metadata, never user data); nothing
    in it imports JAX when unpickled."""

    index: int
    agent: AgentRecipe  # rebuilt once the warm-up ends, unless a numpy policy acts
    published_hparams: dict  # the publishes' hparams, as `hparams_layout` (`rebuild_agent`)
    envs: CollectorEnvs
    first_slot: int  # global env indices first_slot .. first_slot + num_slots - 1
    num_slots: int  # slot g belongs to member g // envs_per_member
    rows: RowLayout  # the learner's replay spec's: the layout of the rows this collector sends
    params: ParamSpec
    ring: ChunkRingSpec
    stop: str  # the StopFlag's segment
    env_seed: int
    parent_pid: int
    numpy_policy: NumpyPolicy | None  # None: the agent's jitted `act` (imports JAX)


def force_cpu_jax() -> None:
    """Call in a child process before JAX starts a backend: CPU only, single-threaded XLA."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()
    if "jax" in sys.modules:  # imported already (e.g. by a test): it read the variable then
        sys.modules["jax"].config.update("jax_platforms", "cpu")


def policy_template(agent, hparams):
    """Shapes of what the learner publishes: (stacked policy params, stacked `hparams` (arrays or
    their shapes; the fields set per member are part of the layout), (each member's trial, the
    env steps of that trial so far)); `learn/member_clocks.py`. A new trial restarts the
    member's envs and exploration schedules (`SlotTrials`); the step count lets a restarted
    collector resume them where the trial is, instead of from zero."""
    import jax
    import jax.numpy as jnp

    from fastpop import population

    size = population.population_size(hparams)

    def build(hparams):
        states = population.init_population(agent, jax.random.key(0), hparams)
        clocks = (jnp.zeros(size, jnp.int32), jnp.zeros(size, jnp.int32))
        return population.member_policies(agent, states), hparams, clocks

    return jax.eval_shape(build, hparams)


TRIAL_FIELD = "trial_epoch"  # per slot, beside a chunk's rows: the trial they were collected for


class SlotTrials:
    """Per env slot: the trial its member runs (`epochs`, as the learner publishes them) and
    the env steps that trial has taken in the slot (`steps`: what its warm-up and exploration
    act at). A new trial is taken up at the next chunk boundary (`switch`): the chunk in
    progress is stamped with the stopped trial, and the slot's env starts a new episode for the
    new one. When the collector reads the publish that starts it (`stale`), it withdraws the
    chunks it queued in its ring and the one in progress (`ChunkRing.skip_queued`): the learner
    passes over them, and the trial's first own rows are the collector's next chunk instead of
    waiting behind up to `collect.ring_slots` chunks of the stopped trial. The few stamped
    with the stopped trial that the learner took before are taken out of the new trial's buffer
    again (`Learner.insert`). A member whose envs two collectors step keeps its rows from the
    first chunk both stamp with the new trial: as both withdraw their queues, the collector that
    switched sooner loses at most the chunk the learner paired with the other's last stale one.
    `new_episodes`: the slots whose episode started or ended since the policy last acted, for
    the exploration's per-episode draws (agent.exploration_std_min)."""

    def __init__(self, slot_rows: np.ndarray):
        self.rows = slot_rows  # each slot's member, as a row of the collector's own members
        self.epochs = np.zeros(len(slot_rows), np.int64)
        self.steps = np.zeros(len(slot_rows), np.int64)
        self.published = self.epochs.copy()
        self.new_episodes = np.ones(len(slot_rows), bool)  # every slot's first episode

    def join(self, epochs: np.ndarray, steps: np.ndarray, envs_per_member: int) -> None:
        """A collector started during a run takes the trials where they are."""
        self.epochs = self.published = np.asarray(epochs)[self.rows].astype(np.int64)
        self.steps = np.asarray(steps)[self.rows].astype(np.int64) // envs_per_member

    def read(self, epochs: np.ndarray) -> bool:
        """Takes the published trials; True when a slot's rows so far are its stopped trial's
        (a new trial waits for the chunk boundary)."""
        self.published = np.asarray(epochs)[self.rows].astype(np.int64)
        return bool((self.published != self.epochs).any())

    def switch(self) -> np.ndarray:
        """At a chunk boundary: the slots whose member started a new trial take it up (their
        steps from 0); returns them (bool)."""
        new = self.published != self.epochs
        self.epochs[new], self.steps[new] = self.published[new], 0
        self.new_episodes |= new  # their envs restart (or were ending anyway)
        return new

    def stepped(self, ended: np.ndarray) -> None:
        """One env step of every slot; `ended`: the slots whose episode it ended."""
        self.steps += 1
        self.new_episodes |= ended

    def take_new_episodes(self) -> np.ndarray:
        """The slots whose episode started since the last call (the policy acts now)."""
        new, self.new_episodes = self.new_episodes, np.zeros_like(self.new_episodes)
        return new


def max_episodes_per_chunk(num_slots: int, chunk_len: int) -> int:
    # An episode spans at least two rows (one step and its autoreset row).
    return num_slots * (chunk_len // 2 + 1)


class _StopOrOrphaned:
    """Set when the learner asks to stop or has died (this process was re-parented): a
    collector blocked on a full ring must notice both, or it outlives a SIGKILLed learner."""

    def __init__(self, stop_flag: StopFlag, parent_pid: int):
        self.stop_flag, self.parent_pid = stop_flag, parent_pid

    def is_set(self) -> bool:
        return self.stop_flag.is_set() or os.getppid() != self.parent_pid


def report(connection, message) -> None:
    """Sends to the learner unless it is gone (then nobody is listening)."""
    with contextlib.suppress(OSError):  # BrokenPipeError: the learner died
        connection.send(message)


def run_collector(spec: CollectorSpec, status) -> None:
    """Process entry point. Reports ("stats", index, dict) at a clean exit and
    ("error", index, traceback) when it fails, on the `status` pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner coordinates every shutdown
    tune_for_tracing()
    force_cpu_jax()
    try:
        with StopFlag.attach(spec.stop) as stop_flag:
            stats = _collect(spec, _StopOrOrphaned(stop_flag, spec.parent_pid))
        report(status, ("stats", spec.index, stats))
    except Exception:
        report(status, ("error", spec.index, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        status.close()


def whole_chunks(env_steps: int, rows: RowLayout) -> int:
    """The warm-up rounded up to whole chunks: its last chunk is sent before the collector
    builds its policy (importing JAX, ~1-2 s), so a replay.min_size the warm-up fills lets the
    learner start while that happens, rather than wait for a chunk half random, half policy."""
    return -(-env_steps // rows.chunk_len) * rows.chunk_len


def _build_acting(spec: CollectorSpec, slot_members: np.ndarray, own_members: slice):
    """The batched policy and how to load it from the published leaves (from member
    `own_members.start` on): built at the first step that acts with a policy. The warm-up's
    random steps run before, without JAX, and a numpy policy needs none: importing it, tracing
    and compiling took ~2 s of CPU per collector, 16 of them on 2 cores most of the paper
    preset's 44 s to its first env step (results/startup/README.md). Built in a thread from
    half-way through the warm-up instead, it slowed the warm-up more than it saved at its end
    (stop 36)."""
    rows = slot_members - own_members.start
    if (policy := spec.numpy_policy) is not None:
        rng = numpy_policy.exploration_generator(spec.env_seed)
        return NumpyActing(policy, rng), numpy_policy.slots_policy(policy, rows)
    import jax

    from fastpop.collect.acting import JaxActing

    agent, treedef = rebuild_agent(spec.agent, spec.published_hparams)
    key = jax.random.key(spec.env_seed)
    acting = JaxActing(agent, spec.num_slots, spec.envs.envs_per_member, key)

    def slots_policy(leaves):
        """(policy, hparams) of this collector's slots from its members' leaves
        (`ParamChannel.read_if_newer`'s rows)."""
        policy, hparams, _ = jax.tree.unflatten(treedef, leaves)
        return jax.tree.map(lambda leaf: leaf[rows], (policy, hparams))

    return acting, slots_policy


def _adopt_trials(newer: tuple, trials: SlotTrials, ring: ChunkRing, joining: bool, setup) -> None:
    """The trials of a newly read publish (`newer`: version, leaves): a collector joining a run
    (restarted) takes them as they are; one whose members start fresh trials withdraws what it
    has queued of the stopped ones (not worth the learner's wait)."""
    epochs, trial_steps = newer[1][-2:]  # the tree's last leaves
    if joining:
        trials.join(epochs, trial_steps, setup.envs_per_member)
    elif trials.read(epochs):
        ring.skip_queued()


def _collect(spec: CollectorSpec, stop_event) -> dict[str, Any]:
    setup = spec.envs
    envs, stepped_by = lockstep_envs(
        setup.env_id,
        spec.num_slots,
        spec.env_seed,
        atari=setup.atari,
        atari_vector=setup.atari_vector,
        num_collectors=setup.num_collectors,
    )
    slot_members = (spec.first_slot + np.arange(spec.num_slots)) // setup.envs_per_member
    own_members = slice(int(slot_members[0]), int(slot_members[-1]) + 1)  # of the policy leaves

    warmup_env_steps = whole_chunks(-(-setup.warmup_steps // setup.envs_per_member), spec.rows)
    stream = RowStream(spec.rows, spec.num_slots)
    params = ParamChannel.attach(spec.params)
    ring = ChunkRing.attach(spec.ring)
    version, acting, leaves = 0, None, None  # leaves: the newest policy not yet handed over
    episodes: list[tuple[int, float, int]] = []
    timers = {"env_seconds": 0.0, "policy_seconds": 0.0, "blocked_seconds": 0.0}
    trials = SlotTrials(slot_members - own_members.start)
    own_steps = 0  # env steps per env taken by this process
    obs = envs.reset(seed=spec.env_seed)
    try:
        while not stop_event.is_set():
            newer = params.read_if_newer(version, rows=own_members)
            if newer is None and version == 0 and trials.steps.min() >= warmup_env_steps:
                time.sleep(0.005)  # started before the learner: its first publish is on the way
                continue
            if newer is not None:
                _adopt_trials(newer, trials, ring, own_steps == 0 and version == 0, setup)
                version, leaves = newer
            start = time.perf_counter()
            warming = trials.steps < warmup_env_steps
            if warming.all():
                actions = envs.action_space.sample()
            else:
                if acting is None:
                    acting, slots_policy = _build_acting(spec, slot_members, own_members)
                if leaves is not None:
                    acting.set_policy(*slots_policy(leaves))
                    leaves = None
                actions = acting(obs, trials.steps, trials.take_new_episodes())
                if warming.any():  # a fresh trial's warm-up, beside trained members
                    lanes = warming.reshape(-1, *[1] * (actions.ndim - 1))
                    actions = np.where(lanes, envs.action_space.sample(), actions)
            stepped = time.perf_counter()
            next_obs, reward, terminated, truncated = envs.step(actions)
            timers["policy_seconds"] += stepped - start
            timers["env_seconds"] += time.perf_counter() - stepped
            for lane, episode_return, length in stream.append(
                obs, actions, reward, terminated, truncated
            ):
                episodes.append((int(slot_members[lane]), episode_return, length))
            obs = next_obs
            trials.stepped(terminated | truncated)
            own_steps += 1
            if stream.has_chunk():
                start = time.perf_counter()
                chunk = stream.pop_fields() | {TRIAL_FIELD: trials.epochs.astype(np.int32)}
                if not ring.put(chunk, episodes, stop_event=stop_event):
                    break
                timers["blocked_seconds"] += time.perf_counter() - start
                episodes = []
                if (switched := trials.switch()).any():  # fresh trials: new episodes
                    obs, restarted = envs.restart(switched, obs)
                    stream.restart_lanes(restarted)
    finally:
        envs.close()
        params.close()
        ring.close()
    env_steps = own_steps * spec.num_slots
    stats = {**timers, "param_version": version, "env_steps": env_steps, "envs": stepped_by}
    return stats | {"jax_imported": "jax" in sys.modules}  # False until a policy step
