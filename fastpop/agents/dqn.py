"""DQN (Mnih et al., 2015) for one member: Huber loss, hard target copies, double-DQN option."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from fastpop.agents import losses, networks
from fastpop.agents.base import (
    Agent,
    AlgorithmEntry,
    UpdateAnatomy,
    adam_step,
    hparams_from_values,
    keyed_update,
    no_draws,
    select_tree,
)
from fastpop.agents.networks import QNetwork
from fastpop.agents.observation_norm import ObservationStats, with_observation_norm
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition

NAME = "dqn"  # its `algo:` in a config, its registry entry's and its Agent's name


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    """Static shape of a DQN member; equal across a population."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """MLP torso widths (torso: mlp)."""
    torso: str | None = None
    """mlp, nature_cnn (Mnih et al. 2015) or minatar_cnn (Young & Tian 2019: one 3x3
    convolution of 16 filters, 128 units); null: by observation, Atari frames nature_cnn,
    other images (MinAtar's 10x10xC) minatar_cnn, vectors mlp."""
    batch_size: int = 32
    """Transitions per gradient step (Mnih et al.: 32)."""
    double_dqn: bool = True
    """Pick the bootstrap action with the online network (van Hasselt et al., 2016)."""
    adam_eps: float = 1.5e-4
    """Adam epsilon (Dopamine / Rainbow setting for Atari)."""
    huber_delta: float = 1.0
    """Quadratic-to-linear switch of the Huber loss."""
    n_step: int = 1
    """Env steps a transition's return spans before it bootstraps (n-step returns): never
    across a termination, through a truncation (population/n_step.py); 1: one-step TD."""
    observation_norm: bool = False
    """Normalize observations by the member's running mean and variance, clip((obs - mean) /
    sqrt(var + 1e-8), -10, 10), wherever its networks see one: in its update and in every policy
    made from its published params (collectors, evaluation, fastpop eval and export). The
    statistics are updated from the batches it learns from and kept in its state (checkpoints,
    PBT's copies). Vector observations only; not with strategies that share one critic."""
    dueling: bool = False
    """A dueling head (Wang et al., 2016): Q = V(s) + A(s, a) - mean_a A(s, a), a value and an
    advantage stream of one linear layer each on the torso."""


class DQNHParams(NamedTuple):
    learning_rate: jax.Array
    discount: jax.Array
    target_update_period: jax.Array  # int32: updates between hard target copies
    epsilon_start: jax.Array
    epsilon_end: jax.Array
    epsilon_decay_steps: jax.Array  # int32: env steps of the linear epsilon decay
    n_step: jax.Array  # int32: the member's n of n-step returns, 1..agent.n_step


class DQNState(NamedTuple):
    params: PyTree
    target_params: PyTree
    opt_state: optax.OptState
    step: jax.Array
    observation_norm: ObservationStats | None = None  # agent.observation_norm's; else None


def epsilon(hparams: DQNHParams, env_steps) -> jax.Array:
    """Linear decay from epsilon_start to epsilon_end over epsilon_decay_steps env steps."""
    fraction = jnp.clip(env_steps / jnp.maximum(hparams.epsilon_decay_steps, 1), 0.0, 1.0)
    return hparams.epsilon_start + fraction * (hparams.epsilon_end - hparams.epsilon_start)


def q_network(spec: EnvSpec, config: DQNConfig) -> QNetwork:
    """The action-value network of `config.torso` (null: by observation) for `spec`."""
    if not spec.discrete:
        raise ValueError("DQN needs a discrete action space; use TD3 or SAC for continuous")
    torso = config.torso or networks.default_torso(spec.obs_shape, spec.obs_dtype)
    if torso not in networks.TORSOS:
        raise ValueError(f"unknown torso {torso!r}; use one of {', '.join(networks.TORSOS)}")
    if torso != "mlp" and len(spec.obs_shape) != 3:
        raise ValueError(f"torso {torso} needs image observations (H, W, C), not {spec.obs_shape}")
    return QNetwork(
        spec.num_actions, config.hidden_sizes, torso, len(spec.obs_shape), config.dueling
    )


def epsilon_greedy_act(spec: EnvSpec, network: QNetwork) -> Callable:
    """DQN's act: the greedy action of the Q-network, or with probability epsilon (exploring;
    `epsilon`, on the member's env steps) a uniformly random one."""

    def act(params, obs, key, hparams: DQNHParams, explore, env_steps=0):
        greedy = jnp.argmax(network.apply(params, obs), axis=-1).astype(jnp.int32)
        explore_key, action_key = jax.random.split(key)
        random_action = jax.random.randint(action_key, greedy.shape, 0, spec.num_actions)
        rate = jnp.where(explore, epsilon(hparams, env_steps), 0.0)
        take_random = jax.random.uniform(explore_key, greedy.shape) < rate
        return jnp.where(take_random, random_action, greedy)

    return act


def dqn_update(
    spec: EnvSpec, config: DQNConfig, network: QNetwork, optimizer: optax.GradientTransformation
) -> Callable:
    """update_drawn(state, batch, hparams, drawn): one optimizer step on the batch's mean
    `losses.dqn_loss` (the bootstrap action picked by the online network with double_dqn, by
    the target network without), the target network copied every target_update_period steps;
    it draws nothing."""
    example_loss = jax.vmap(partial(losses.dqn_loss, huber_delta=config.huber_delta))

    def loss_fn(params, target_params, batch: Transition, hparams: DQNHParams):
        next_target_q = network.apply(target_params, batch.next_obs)
        # Double DQN picks the bootstrap action with the online network, plain DQN with the target.
        next_selector_q = (
            network.apply(params, batch.next_obs) if config.double_dqn else next_target_q
        )
        q = network.apply(params, batch.obs)
        action = batch.action.astype(jnp.int32)
        reward, discount = losses.discounted_rewards(batch, hparams.discount)
        loss = example_loss(
            q,
            action,
            reward,
            discount,
            batch.terminated,
            next_target_q,
            next_selector_q,
        )
        return jnp.mean(loss), jnp.mean(jnp.take_along_axis(q, action[:, None], axis=-1))

    def update_drawn(state: DQNState, batch: Transition, hparams: DQNHParams, drawn):
        del drawn  # DQN's update draws nothing
        ranks = [1 + len(spec.obs_shape), 1, losses.reward_rank(batch)]
        chex.assert_rank([batch.obs, batch.action, batch.reward], ranks)
        (loss, q_mean), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.params, state.target_params, batch, hparams
        )
        params, opt_state = adam_step(
            state.params, grads, state.opt_state, optimizer, hparams.learning_rate
        )
        step = state.step + 1
        copy_now = step % jnp.maximum(hparams.target_update_period, 1) == 0
        target_params = select_tree(copy_now, params, state.target_params)
        return DQNState(params, target_params, opt_state, step), {"loss": loss, "q_mean": q_mean}

    return update_drawn


def make_dqn(spec: EnvSpec, config: DQNConfig = DQNConfig()) -> Agent:
    network = q_network(spec, config)
    optimizer = optax.scale_by_adam(eps=config.adam_eps)

    def default_hparams() -> DQNHParams:
        return hparams_from_values(
            DQNHParams,
            frozenset({"target_update_period", "epsilon_decay_steps", "n_step"}),
            learning_rate=1e-4,
            discount=0.99,
            target_update_period=1000,
            epsilon_start=1.0,
            epsilon_end=0.01,
            epsilon_decay_steps=250_000,
            n_step=config.n_step,
        )

    def init(key: PRNGKey, hparams: DQNHParams) -> DQNState:
        del hparams
        params = network.init(key, jnp.zeros((1, *spec.obs_shape), spec.obs_dtype))
        return DQNState(params, params, optimizer.init(params), jnp.zeros((), jnp.int32))

    update_drawn = dqn_update(spec, config, network, optimizer)
    agent = Agent(
        name=NAME,
        init=init,
        act=epsilon_greedy_act(spec, network),
        update=keyed_update(no_draws, update_drawn),
        draw=no_draws,
        update_drawn=update_drawn,
        policy_params=lambda state: state.params,
        default_hparams=default_hparams,
        batch_size=config.batch_size,
        n_step=config.n_step,
    )
    return with_observation_norm(agent, spec) if config.observation_norm else agent


def update_anatomy(agent: Agent, hparams: DQNHParams) -> UpdateAnatomy:
    """The Q network stepped every step; its target copied every target_update_period."""
    period = max(int(hparams.target_update_period), 1)
    return UpdateAnatomy(
        optimised=(("params", "opt_state"),),
        targets=("target_params",),
        write_fractions={"target_params": 1.0 / period},
    )


ENTRY = AlgorithmEntry(
    name=NAME,
    make=make_dqn,
    config_type=DQNConfig,
    actions="discrete",
    numpy_policy="epsilon_greedy",
    deterministic_action="argmax Q",
    update_anatomy=update_anatomy,
)
