"""DDPG (Lillicrap et al., 2016, as Fujimoto et al. 2018 re-tuned it: "OurDDPG") as a plugin: the
one file a contributor writes to train an algorithm fastpop does not have. A config that names
this module in `plugins:` (`tests.ddpg_plugin`) and sets `algo: ddpg` trains it in both
collection modes and under PBT; nothing else in fastpop names it. The shared-critic strategies
(cemrl, dvd) refuse it: its state is not TD3's. tests/test_plugin_algorithm.py is the acceptance
check, and takes it out of the registry again.

One member: a deterministic tanh actor (`networks.DeterministicActor`, so the collectors' numpy
"deterministic" policy acts for it), ONE critic Q(s, a), both with Polyak-averaged targets
updated at every step, Gaussian exploration noise, no target smoothing and no actor delay (what
TD3 added). Everything a population may vary is a traced hparam; the losses are per example.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NamedTuple

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from fastpop.agents import losses, registry
from fastpop.agents.base import (
    Agent,
    AlgorithmEntry,
    UpdateAnatomy,
    adam_step,
    hparams_from_values,
    init_actor_critic,
    keyed_update,
    network_optimizer,
    no_draws,
    polyak,
)
from fastpop.agents.networks import MLP, DeterministicActor, as_float_observation
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition

NAME = "ddpg"


@dataclasses.dataclass(frozen=True)
class DDPGConfig:
    """Static shape of a DDPG member; equal across a population."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor and the critic (OurDDPG: 256-256)."""
    batch_size: int = 256
    """Transitions per gradient step."""
    n_step: int = 1
    """Env steps a transition's return spans before it bootstraps; 1: one-step TD."""


class DDPGHParams(NamedTuple):
    """Per-member values, all traced: PBT may change any of them without recompiling."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    discount: jax.Array
    tau: jax.Array  # Polyak rate of both targets
    exploration_noise: jax.Array  # acting noise std, in units of the action half-range
    n_step: jax.Array  # int32: the member's n of n-step returns, 1..agent.n_step


INTEGERS = frozenset({"n_step"})
DDPG_DEFAULTS = {
    "actor_lr": 3e-4,
    "critic_lr": 3e-4,
    "discount": 0.99,
    "tau": 0.005,
    "exploration_noise": 0.1,
}


class DDPGState(NamedTuple):
    actor: PyTree
    critic: PyTree
    target_actor: PyTree
    target_critic: PyTree
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    step: jax.Array  # updates done


class Critic(nn.Module):
    """One Q(s, a) network: the observation and action concatenated into an MLP; (B,) values."""

    hidden_sizes: Sequence[int]

    @nn.compact
    def __call__(self, obs: jax.Array, action: jax.Array) -> jax.Array:
        x = jnp.concatenate([as_float_observation(obs), action], axis=-1)
        return MLP((*self.hidden_sizes, 1))(x)[..., 0]


def ddpg_critic_loss(
    q_value: chex.Array,
    reward: chex.Array,
    discount: chex.Numeric,
    terminated: chex.Array,
    next_target_q_value: chex.Array,
) -> chex.Array:
    """Squared error of Q(s, a) to r + discount * Q'(s', mu'(s')), one transition."""
    chex.assert_rank([q_value, next_target_q_value], 0)
    target = losses.bootstrap_target(reward, discount, terminated, next_target_q_value)
    return jnp.square(q_value - target)


def ddpg_actor_loss(q_value: chex.Array) -> chex.Array:
    """-Q(s, mu(s)): the deterministic policy gradient, one observation."""
    chex.assert_rank(q_value, 0)
    return -q_value


def make_ddpg(spec: EnvSpec, config: DDPGConfig = DDPGConfig()) -> Agent:
    if spec.discrete:
        raise ValueError("DDPG needs a continuous action space; use DQN for discrete actions")
    actor_net = DeterministicActor(
        spec.action_dim, config.hidden_sizes, spec.action_low, spec.action_high
    )
    critic_net = Critic(config.hidden_sizes)
    optimizer = network_optimizer(0.0)  # Adam's moments; the rates are hparams
    half_range = (spec.action_high - spec.action_low) / 2.0
    critic_losses, actor_losses = jax.vmap(ddpg_critic_loss), jax.vmap(ddpg_actor_loss)

    def default_hparams() -> DDPGHParams:
        return hparams_from_values(DDPGHParams, INTEGERS, **DDPG_DEFAULTS, n_step=config.n_step)

    def init(key: PRNGKey, hparams: DDPGHParams) -> DDPGState:
        del hparams
        actor, critic = init_actor_critic(key, actor_net, critic_net, spec)
        return DDPGState(
            actor=actor,
            critic=critic,
            target_actor=actor,
            target_critic=critic,
            actor_opt=optimizer.init(actor),
            critic_opt=optimizer.init(critic),
            step=jnp.zeros((), jnp.int32),
        )

    def act(actor, obs, key, hparams: DDPGHParams, explore, env_steps=0, episode_draws=None):
        del env_steps, episode_draws
        action = actor_net.apply(actor, obs)
        noise_std = jnp.where(explore, hparams.exploration_noise, 0.0) * half_range
        noise = noise_std * jax.random.normal(key, action.shape)
        return jnp.clip(action + noise, spec.action_low, spec.action_high)

    def critic_loss(critic, state: DDPGState, batch: Transition, hparams: DDPGHParams):
        next_action = actor_net.apply(state.target_actor, batch.next_obs)
        next_q = critic_net.apply(state.target_critic, batch.next_obs, next_action)
        q = critic_net.apply(critic, batch.obs, batch.action)
        reward, discount = losses.discounted_rewards(batch, hparams.discount)
        return jnp.mean(critic_losses(q, reward, discount, batch.terminated, next_q)), jnp.mean(q)

    def actor_loss(actor, critic, obs):
        return jnp.mean(actor_losses(critic_net.apply(critic, obs, actor_net.apply(actor, obs))))

    def update_drawn(state: DDPGState, batch: Transition, hparams: DDPGHParams, drawn):
        del drawn  # DDPG's update draws nothing: no target smoothing
        ranks = [1 + len(spec.obs_shape), 2, losses.reward_rank(batch)]
        chex.assert_rank([batch.obs, batch.action, batch.reward], ranks)
        (q_loss, q_mean), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic, state, batch, hparams
        )
        critic, critic_opt = adam_step(
            state.critic, grads, state.critic_opt, optimizer, hparams.critic_lr
        )
        pi_loss, grads = jax.value_and_grad(actor_loss)(state.actor, critic, batch.obs)
        actor, actor_opt = adam_step(
            state.actor, grads, state.actor_opt, optimizer, hparams.actor_lr
        )
        state = DDPGState(
            actor=actor,
            critic=critic,
            target_actor=polyak(state.target_actor, actor, hparams.tau),
            target_critic=polyak(state.target_critic, critic, hparams.tau),
            actor_opt=actor_opt,
            critic_opt=critic_opt,
            step=state.step + 1,
        )
        return state, {"critic_loss": q_loss, "q_mean": q_mean, "actor_loss": pi_loss}

    return Agent(
        name=NAME,
        init=init,
        act=act,
        update=keyed_update(no_draws, update_drawn),
        draw=no_draws,
        update_drawn=update_drawn,
        policy_params=lambda state: state.actor,
        default_hparams=default_hparams,
        batch_size=config.batch_size,
        n_step=config.n_step,
    )


ENTRY = AlgorithmEntry(
    name=NAME,
    make=make_ddpg,
    config_type=DDPGConfig,
    actions="continuous",
    numpy_policy="deterministic",  # a tanh MLP actor and hparam exploration_noise, as TD3's
    deterministic_action="DDPG's actor",
    # what its update steps and writes, for `fastpop bench update`'s floor: all of it, each step
    update_anatomy=lambda agent, hparams: UpdateAnatomy(
        optimised=(("critic", "critic_opt"), ("actor", "actor_opt")),
        targets=("target_actor", "target_critic"),
    ),
)
if NAME not in registry.NAMES:
    registry.register(ENTRY)
