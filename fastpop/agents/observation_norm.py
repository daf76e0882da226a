"""`agent.observation_norm`: each member normalizes the observations its networks see by its
own running mean and variance, clip((obs - mean) / sqrt(var + 1e-8), -10, 10)
(`fastpop.types.normalized_observation`).

Where the statistics are updated: inside the member's update, from the observations of the
batch it samples, merged into the running ones with Chan et al.'s parallel form of Welford's
algorithm, incremental and with the count capped at `COUNT_CAP` (`merged`): past the cap, an
exponential moving average over about the last million observations. That is pure, per member
and traced: the same program in process and device mode and under every executor (vectorized,
sequential, chunked, sharded), with no host work. The
statistics are a field of the member's state, so checkpoints keep them and strategies that copy
a member's state (PBT's exploit) copy them with it. Counting each inserted row once instead
would put the update at the population level, apart from the members' states (process mode's
`Learner.insert`, device mode's collect program), while the update in flight holds those states
(donated). Sampled uniformly, the batches' observations are the replay's in expectation.

Where they are applied: the update normalizes its batch's `obs` and `next_obs` with the
statistics that include the batch; `policy_params` publishes the statistics beside the
network's params, under `OBSERVATION_NORM_KEY` ({"params": ..., "observation_norm": {"mean",
"var"}}), and `act` reads them from there. So every policy made from the published params --
the collectors' numpy policy (`collect/numpy_policy.py`) and jitted one, the evaluator, device
mode's rollout and evaluation, `fastpop eval` and `fastpop export`'s function and weights --
normalizes alike, from the same numbers. The agent's `internals` (the raw critic and actor steps
that shared-critic strategies recombine) do not normalize: the config refuses the option there.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fastpop.agents.base import Agent, keyed_update
from fastpop.agents.networks import as_float_observation
from fastpop.types import OBSERVATION_NORM_KEY, EnvSpec, Transition, normalized_observation

# The count's cap. Past it a batch of B weighs B / (COUNT_CAP + B), constant: the statistics
# become an exponential moving average over about the last COUNT_CAP observations (one batch of
# 256's sampling noise averaged ~4000 times; and they follow the observations as the policy
# changes). Uncapped, the weight shrinks until an update is lost in float32's rounding (6e-8
# relative): at 2**20 one observation still weighs 1e-6, 16 times that. The float32 count
# itself stopped near 2**24 * B (count + B rounded back to count), freezing the statistics.
COUNT_CAP = 2.0**20


class ObservationStats(NamedTuple):
    """One member's running statistics of the observations it has learned from."""

    mean: jax.Array  # (obs_dim,) float32
    var: jax.Array  # (obs_dim,) float32: the population variance (numpy's var, ddof 0)
    count: jax.Array  # () float32: observations merged so far, capped at COUNT_CAP


def initial_stats(spec: EnvSpec) -> ObservationStats:
    """No observation seen: mean 0, variance 1 (the identity, up to the clip)."""
    (obs_dim,) = spec.obs_shape
    return ObservationStats(
        jnp.zeros(obs_dim, jnp.float32), jnp.ones(obs_dim, jnp.float32), jnp.zeros((), jnp.float32)
    )


def merged(stats: ObservationStats, obs: jax.Array) -> ObservationStats:
    """`stats` with a batch of observations (batch, obs_dim) merged in (Chan et al., 1979): up
    to COUNT_CAP observations, the mean and variance of everything seen, as if computed over
    all of it at once; past it, an exponential moving average of weight batch / (COUNT_CAP +
    batch).

    Incremental, var += w * ((batch_var - var) + delta**2 * (1 - w)), w the batch's weight: the
    form `var * count + ...` rounded each product of the count, and drifted -1.3e-3 over 1e8
    observations in batches of 256 (tests/test_observation_norm.py).
    """
    batch_count = jnp.float32(obs.shape[0])
    batch_mean = jnp.mean(obs, axis=0)
    batch_var = jnp.var(obs, axis=0)
    # min: a checkpoint written before the cap may hold a larger count.
    weight = batch_count / (jnp.minimum(stats.count, COUNT_CAP) + batch_count)
    delta = batch_mean - stats.mean
    mean = stats.mean + weight * delta
    var = stats.var + weight * ((batch_var - stats.var) + jnp.square(delta) * (1.0 - weight))
    # The first batch's statistics are its own: var + (batch_var - var) rounds them at var's
    # scale (the initial 1).
    first = stats.count == 0
    mean, var = jnp.where(first, batch_mean, mean), jnp.where(first, batch_var, var)
    return ObservationStats(mean, var, jnp.minimum(stats.count + batch_count, COUNT_CAP))


def published(stats: ObservationStats) -> dict:
    """What a policy needs of the statistics (the count stays in the state)."""
    return {"mean": stats.mean, "var": stats.var}


def normalize(norm: dict, obs: jax.Array) -> jax.Array:
    """A batch of observations normalized by published statistics (`published`)."""
    return normalized_observation(as_float_observation(obs), norm["mean"], norm["var"], jnp)


def check_observations(spec: EnvSpec) -> None:
    """Vector observations only: per-feature statistics of images (Atari frames, MinAtar grids)
    are not what their convolutions expect."""
    if len(spec.obs_shape) != 1:
        raise ValueError(
            "agent.observation_norm normalizes vector observations, and this environment's are "
            f"of shape {spec.obs_shape} (images): set agent.observation_norm: false"
        )


def with_observation_norm(agent: Agent, spec: EnvSpec) -> Agent:
    """`agent` whose networks see normalized observations: its state's `observation_norm`
    field holds the statistics, its policy params are dicts (flax variables) that get them
    published beside the network's params. Raises ValueError for image observations."""
    check_observations(spec)

    def init(key, hparams):
        return agent.init(key, hparams)._replace(observation_norm=initial_stats(spec))

    def policy_params(state) -> dict:
        return {
            **agent.policy_params(state),
            OBSERVATION_NORM_KEY: published(state.observation_norm),
        }

    def act(policy: dict, obs, *args, **kwargs):
        network = {name: leaf for name, leaf in policy.items() if name != OBSERVATION_NORM_KEY}
        return agent.act(network, normalize(policy[OBSERVATION_NORM_KEY], obs), *args, **kwargs)

    def update_drawn(state, batch: Transition, hparams, drawn):
        stats = merged(state.observation_norm, as_float_observation(batch.obs))
        norm = published(stats)
        batch = batch._replace(
            obs=normalize(norm, batch.obs), next_obs=normalize(norm, batch.next_obs)
        )
        state, metrics = agent.update_drawn(state, batch, hparams, drawn)
        return state._replace(observation_norm=stats), metrics

    return agent._replace(
        init=init,
        act=act,
        update=keyed_update(agent.draw, update_drawn),
        update_drawn=update_drawn,
        policy_params=policy_params,
    )
