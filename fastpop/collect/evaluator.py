"""Evaluation with the policy held constant, in its own process so collection never stalls.

The learner puts a snapshot of every member's policy (and hparams) into a `ChunkRing`; the
evaluator runs `eval.episodes` episodes per member without exploration and sends back plain
numbers. Evaluation environments are built with `training=False`: raw game scores for Atari.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from typing import Any, NamedTuple

import numpy as np

from fastpop.collect import snapshot
from fastpop.collect.collector import AgentRecipe, force_cpu_jax, rebuild_agent, report
from fastpop.collect.shm import ChunkRing, ChunkRingSpec, StopFlag
from fastpop.gc_settings import tune_for_tracing


class EvaluatorSpec(NamedTuple):
    """Plain data that crosses the spawn boundary (fastpop.collect.worker_processes)."""

    agent: AgentRecipe  # what the agent is rebuilt from
    published_hparams: dict  # the snapshots' hparams, as `hparams_layout` (`rebuild_agent`)
    env_id: str
    atari: Any  # envs.AtariOptions of the training envs, or None for other envs
    episodes: int  # per member and snapshot (eval.episodes)
    ring: ChunkRingSpec  # of `snapshot.layout`s
    stop: str  # the StopFlag's segment
    seed: int
    parent_pid: int


def evaluate_population(agent, policy, hparams, env_id, episodes, seed, atari=None):
    """Mean and std of each member's return over `episodes` episodes, policy held constant.

    One env per member, stepped together with one batched policy call; a member's env keeps
    running (uncounted) after its own episodes are done until every member has finished.
    """
    import jax

    from fastpop import population
    from fastpop.envs import make_vector_env

    size = population.population_size(hparams)
    envs = make_vector_env(env_id, size, seed, training=False, atari=atari)
    # The keys split inside the policy's call: one dispatch per step (a loop of thousands).
    step = jax.jit(population.policy_step(agent, size, 1, explore=False))
    no_steps = np.zeros(size, np.int32)  # greedy: no exploration schedule
    returns: list[list[float]] = [[] for _ in range(size)]
    running = np.zeros(size)
    needs_reset = np.zeros(size, bool)  # next step is the autoreset step: not part of an episode
    key = jax.random.key(seed)
    obs, _ = envs.reset(seed=seed)
    try:
        while min(len(r) for r in returns) < episodes:
            actions, key = step(policy, obs[:, None], key, hparams, no_steps)
            obs, reward, terminated, truncated, _ = envs.step(np.asarray(actions)[:, 0])
            running += np.where(needs_reset, 0.0, reward)
            done = (terminated | truncated) & ~needs_reset
            for member in np.flatnonzero(done):
                if len(returns[member]) < episodes:
                    returns[member].append(float(running[member]))
            running[done] = 0.0
            needs_reset = done
    finally:
        envs.close()
    values = np.array(returns)
    return values.mean(axis=1), values.std(axis=1)


def run_evaluator(spec: EvaluatorSpec, results) -> None:
    """Process entry point: ("evaluation", dict) per snapshot, ("error", -1, traceback), on
    the `results` pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tune_for_tracing()
    force_cpu_jax()
    try:
        with StopFlag.attach(spec.stop) as stop_flag:
            _evaluate_snapshots(spec, stop_flag, results)
    except Exception:
        report(results, ("error", -1, traceback.format_exc()))
        raise SystemExit(1) from None
    finally:
        results.close()


def _evaluate_snapshots(spec: EvaluatorSpec, stop_flag: StopFlag, results) -> None:
    import jax

    agent, treedef = rebuild_agent(spec.agent, spec.published_hparams)
    ring = ChunkRing.attach(spec.ring)
    try:
        while not stop_flag.is_set() and os.getppid() == spec.parent_pid:
            chunk = ring.try_get()
            if chunk is None:
                time.sleep(0.01)
                continue
            leaves, meta = snapshot.decode(chunk.arrays)
            policy, hparams, _ = jax.tree.unflatten(treedef, leaves)
            start = time.perf_counter()
            mean, std = evaluate_population(
                agent,
                policy,
                hparams,
                spec.env_id,
                spec.episodes,
                seed=spec.seed + 7919 * meta.eval_index,
                atari=spec.atari,
            )
            result = {
                **meta._asdict(),
                "return_mean": mean.tolist(),
                "return_std": std.tolist(),
                "seconds": time.perf_counter() - start,
            }
            report(results, ("evaluation", result))
    finally:
        ring.close()
