"""Evaluation with the policy held constant, in its own process so collection never stalls.

The learner puts a snapshot of every member's policy (and hparams) into a `ChunkRing`; the
evaluator runs `eval.episodes` episodes per member without exploration and sends back plain
numbers. Evaluation environments are built with `training=False`: raw game scores for Atari.
Where the collectors can act in numpy (MLP policies on vector observations:
`acting.numpy_policy_for`), the evaluator does too, with their deterministic action, and never
imports JAX (its import and the act program were ~2-3 CPU-s of every run on a 2-core CPU);
else it runs the agent's jitted `act`.
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
from fastpop.collect.numpy_policy import NumpyActing, NumpyPolicy, nested
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
    numpy_policy: NumpyPolicy | None = None  # None: the agent's jitted `act` (imports JAX)


def evaluate_population(agent, policy, hparams, env_id, episodes, seed, atari=None):
    """Mean and std of each member's return over `episodes` episodes, policy held constant,
    acting with the agent's jitted `act(..., explore=False)` (`run_episodes`)."""
    import jax

    from fastpop import population

    size = population.population_size(hparams)
    # The keys split inside the policy's call: one dispatch per step (a loop of thousands).
    step = jax.jit(population.policy_step(agent, size, 1, explore=False))
    no_steps = np.zeros(size, np.int32)  # greedy: no exploration schedule
    key = jax.random.key(seed)

    def act(obs):
        nonlocal key
        actions, key = step(policy, obs[:, None], key, hparams, no_steps)
        return np.asarray(actions)[:, 0]

    return run_episodes(act, size, env_id, episodes, seed, atari)


def numpy_evaluation(policy: NumpyPolicy, env_id, episodes, atari=None):
    """evaluate(leaves, seed) -> (mean, std) per member, as `evaluate_population` of the
    snapshot's `leaves` (its published tree's, in `policy.leaf_paths`' order), acting in numpy
    with the deterministic action: no JAX."""

    def evaluate(leaves, seed):
        published = nested(policy.leaf_paths, leaves)  # keys 0, 1, 2: params, hparams, clocks
        params, hparams = published[0], published[1]
        acting = NumpyActing(policy, np.random.default_rng(seed), explore=False)
        acting.set_policy(params, hparams)
        size = len(leaves[0])  # a member's row per leaf
        return run_episodes(lambda obs: acting(obs, 0), size, env_id, episodes, seed, atari)

    return evaluate


def run_episodes(act, size, env_id, episodes, seed, atari=None):
    """Mean and std of each of `size` members' returns over `episodes` episodes, `act(obs)` its
    actions for a batch of one observation per member.

    One env per member, stepped together with one batched policy call; a member's env keeps
    running (uncounted) after its own episodes are done until every member has finished.
    """
    from fastpop.envs import make_vector_env

    envs = make_vector_env(env_id, size, seed, training=False, atari=atari)
    returns: list[list[float]] = [[] for _ in range(size)]
    running = np.zeros(size)
    needs_reset = np.zeros(size, bool)  # next step is the autoreset step: not part of an episode
    obs, _ = envs.reset(seed=seed)
    try:
        while min(len(r) for r in returns) < episodes:
            obs, reward, terminated, truncated, _ = envs.step(act(obs))
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
    if spec.numpy_policy is not None:
        evaluate = numpy_evaluation(spec.numpy_policy, spec.env_id, spec.episodes, spec.atari)
    else:
        evaluate = _jax_evaluation(spec)
    ring = ChunkRing.attach(spec.ring)
    try:
        while not stop_flag.is_set() and os.getppid() == spec.parent_pid:
            chunk = ring.try_get()
            if chunk is None:
                time.sleep(0.01)
                continue
            leaves, meta = snapshot.decode(chunk.arrays)
            start = time.perf_counter()
            mean, std = evaluate(leaves, spec.seed + 7919 * meta.eval_index)
            result = {
                **meta._asdict(),
                "return_mean": mean.tolist(),
                "return_std": std.tolist(),
                "seconds": time.perf_counter() - start,
            }
            report(results, ("evaluation", result))
    finally:
        ring.close()


def _jax_evaluation(spec: EvaluatorSpec):
    """evaluate(leaves, seed) with the agent rebuilt from its recipe and its jitted `act`."""
    import jax

    agent, treedef = rebuild_agent(spec.agent, spec.published_hparams)

    def evaluate(leaves, seed):
        policy, hparams, _ = jax.tree.unflatten(treedef, leaves)
        episodes, atari = spec.episodes, spec.atari
        return evaluate_population(agent, policy, hparams, spec.env_id, episodes, seed, atari)

    return evaluate
