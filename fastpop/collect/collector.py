"""Collector processes: step a fixed set of (member, env) slots with one batched policy call.

A collector runs in a `spawn`-started process and never touches an accelerator: JAX is forced
onto the CPU with one intra-op thread before it is imported, so collectors do not compete with
the learner for cores more than their own stepping needs. Parameters arrive through a
`ParamChannel`, transition chunks leave through the collector's own `ChunkRing`.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, NamedTuple

import numpy as np

from fastpop.collect.shm import ChunkRing, ChunkRingSpec, ParamChannel, ParamSpec


class CollectorSpec(NamedTuple):
    """Plain data that crosses the spawn boundary (our own metadata, never user data)."""

    index: int
    config: dict  # the resolved config (config_to_dict)
    first_slot: int  # global env indices first_slot .. first_slot + num_slots - 1
    num_slots: int  # slot g belongs to member g // envs_per_member
    params: ParamSpec
    ring: ChunkRingSpec
    env_seed: int
    parent_pid: int


def force_cpu_jax() -> None:
    """Call before importing JAX in a child process: CPU only, single-threaded XLA."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_multi_thread_eigen=false".strip()


def policy_template(agent, size: int):
    """Shapes of what the learner publishes: (stacked policy params, stacked hparams, env steps
    per member so far). The step count lets a restarted collector resume its warm-up and
    exploration schedules where the run is, instead of from zero."""
    import jax
    import jax.numpy as jnp

    from fastpop import population

    def build():
        hparams = population.broadcast_hparams(agent.default_hparams(), size)
        states = population.init_population(agent, jax.random.key(0), hparams)
        return population.member_policies(agent, states), hparams, jnp.zeros((), jnp.int32)

    return jax.eval_shape(build)


def batched_policy_step(agent, num_slots: int, envs_per_member: int):
    """One call per env step: next key, and an exploring action for every slot.

    Splitting keys inside the compiled call keeps it to one dispatch per step, which is most
    of a collector's overhead next to a fast simulator.
    """
    import jax

    from fastpop import population

    act = population.population_act(agent)

    def step(policy, obs, key, hparams, env_steps_per_env):
        key, act_key = jax.random.split(key)
        keys = jax.random.split(act_key, num_slots)
        member_steps = env_steps_per_env * envs_per_member
        actions = act(policy, obs[:, None], keys, hparams, True, member_steps)
        return actions[:, 0], key

    return step


def max_episodes_per_chunk(num_slots: int, chunk_len: int) -> int:
    # An episode spans at least two rows (one step and its autoreset row).
    return num_slots * (chunk_len // 2 + 1)


class _StopOrOrphaned:
    """Set when the learner asks to stop or has died (this process was re-parented): a
    collector blocked on a full ring must notice both, or it outlives a SIGKILLed learner."""

    def __init__(self, stop_event, parent_pid: int):
        self.stop_event, self.parent_pid = stop_event, parent_pid

    def is_set(self) -> bool:
        return self.stop_event.is_set() or os.getppid() != self.parent_pid


def run_collector(spec: CollectorSpec, stop_event, status_queue) -> None:
    """Process entry point. Reports ("stats", index, dict) at a clean exit and
    ("error", index, traceback) when it fails."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner coordinates every shutdown
    force_cpu_jax()
    try:
        stats = _collect(spec, _StopOrOrphaned(stop_event, spec.parent_pid))
        status_queue.put(("stats", spec.index, stats))
    except Exception:
        status_queue.put(("error", spec.index, traceback.format_exc()))
        raise SystemExit(1) from None


def _collect(spec: CollectorSpec, stop_event) -> dict[str, Any]:
    import jax

    from fastpop import config as config_lib
    from fastpop import replay
    from fastpop.agents import make_agent
    from fastpop.envs import env_spec, make_vector_env
    from fastpop.rollout import RowStream

    config = config_lib.config_from_dict(spec.config)
    envs_per_member = config.collect.envs_per_member
    atari = config_lib.atari_options(config)
    envs = make_vector_env(config.env.id, spec.num_slots, spec.env_seed, atari=atari)
    env_spec = env_spec(config.env.id, atari)
    agent = make_agent(config.algo, env_spec, **config.agent)
    template = policy_template(agent, config.population.size)
    treedef = jax.tree.structure(template)
    slot_members = (spec.first_slot + np.arange(spec.num_slots)) // envs_per_member
    act = jax.jit(batched_policy_step(agent, spec.num_slots, envs_per_member))
    warmup_env_steps = -(-config.collect.warmup_steps // envs_per_member)
    rows_spec = replay.make_replay_spec(  # only its row layout is used
        env_spec, config.collect.chunk_len * 8, 1, config.collect.chunk_len
    )
    stream = RowStream(rows_spec, spec.num_slots)
    params = ParamChannel.attach(spec.params)
    ring = ChunkRing.attach(spec.ring)
    key = jax.random.key(spec.env_seed)
    version, policy, hparams = 0, None, None
    episodes: list[tuple[int, float, int]] = []
    timers = {"env_seconds": 0.0, "policy_seconds": 0.0, "blocked_seconds": 0.0}
    steps = 0  # env steps per env, counted from the start of the run
    first_version = True
    obs, _ = envs.reset(seed=spec.env_seed)
    try:
        while not stop_event.is_set():
            newer = params.read_if_newer(version)
            if newer is not None:
                version, leaves = newer
                # On the (CPU) device once per version, not once per step.
                policy, hparams, run_member_steps = jax.tree.unflatten(treedef, leaves)
                policy, hparams = jax.device_put(
                    jax.tree.map(lambda leaf: leaf[slot_members], (policy, hparams))
                )
                if first_version:  # a restarted collector joins a run already under way
                    steps = int(run_member_steps) // envs_per_member
                    first_version = False
            start = time.perf_counter()
            if steps < warmup_env_steps or policy is None:
                actions = envs.action_space.sample()
            else:
                actions, key = act(policy, obs, key, hparams, np.int32(steps))
                actions = np.asarray(actions)
            stepped = time.perf_counter()
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            timers["policy_seconds"] += stepped - start
            timers["env_seconds"] += time.perf_counter() - stepped
            for lane, episode_return, length in stream.append(
                obs, actions, reward, terminated, truncated
            ):
                episodes.append((int(slot_members[lane]), episode_return, length))
            obs = next_obs
            steps += 1
            if stream.has_chunk():
                start = time.perf_counter()
                if not ring.put(stream.pop_chunk()._asdict(), episodes, stop_event=stop_event):
                    break
                timers["blocked_seconds"] += time.perf_counter() - start
                episodes = []
    finally:
        envs.close()
        params.close()
        ring.close()
    return {**timers, "param_version": version}
