"""An agent's functions other than its update, over every member at once (vmapped): acting,
one step of every member's policy, the policies collectors act with, and the members' init.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from fastpop.agents.base import Agent
from fastpop.compilation.rarely_run import rarely_run_jit
from fastpop.compilation.shared_programs import shared
from fastpop.population.stacking import population_size
from fastpop.types import PRNGKey, PyTree


def population_act(agent: Agent, env_steps_per_member: bool = False):
    """agent.act for a population: params, obs (P, N, ...), keys and hparams stacked over
    members; `explore` shared by all, `env_steps` too or, with `env_steps_per_member`, (P,): each
    member's exploration (DQN's epsilon) on its own trial's clock (`learn/member_clocks.py`);
    `episode_draws` (P, N), where the agent reads them (`Agent.episode_draws`), else None."""
    steps_axis = 0 if env_steps_per_member else None
    members = jax.vmap(agent.act, in_axes=(0, 0, 0, 0, None, steps_axis))
    with_draws = jax.vmap(agent.act, in_axes=(0, 0, 0, 0, None, steps_axis, 0))

    def act(params, obs, keys, hparams, explore, env_steps, episode_draws=None):
        if episode_draws is None:  # an agent without them never sees the argument
            return members(params, obs, keys, hparams, explore, env_steps)
        return with_draws(params, obs, keys, hparams, explore, env_steps, episode_draws)

    return act


def policy_step(agent: Agent, size: int, envs_per_member: int, explore: bool = True):
    """One call per env step for `size` members (to be jitted): `step(policy, obs (P, N, ...),
    key, hparams, env_steps_per_env (P,), episode_draws=None)` -> (actions (P, N, ...), the next
    key); `episode_draws`: `population_act`'s. The keys are split inside it, as `key, act_key =
    split(key)` and `split(act_key, P)` by hand would: one dispatch per step instead of three."""
    act = population_act(agent, env_steps_per_member=True)

    def step(policy, obs, key, hparams, env_steps_per_env, episode_draws=None):
        key, act_key = jax.random.split(key)
        keys = jax.random.split(act_key, size)
        member_steps = env_steps_per_env * envs_per_member  # each member's trial's env steps
        return act(policy, obs, keys, hparams, explore, member_steps, episode_draws), key

    return step


def member_policies(agent: Agent, states: PyTree) -> PyTree:
    """The stacked policy parameters of every member (what collectors act with)."""
    return jax.vmap(agent.policy_params)(states)


@shared
def initializer(agent: Agent) -> Callable[[PRNGKey, PyTree], PyTree]:
    """`init_population` of `agent` compiled once, for callers that initialise members again
    (halving's fresh trials), for a short compile: it runs once or rarely."""

    def init_members(key: PRNGKey, hparams: PyTree) -> PyTree:
        return jax.vmap(agent.init)(jax.random.split(key, population_size(hparams)), hparams)

    return rarely_run_jit(init_members)


def init_population(agent: Agent, key: PRNGKey, hparams: PyTree) -> PyTree:
    """Independently initialised members, stacked; member i uses split(key, P)[i]."""
    return initializer(agent)(key, hparams)
