"""SAC (Haarnoja et al., 2018) for one member, with a learned entropy temperature."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from fastpop.agents.base import (
    ActorCriticConfig,
    Agent,
    adam_step,
    hparams_from_values,
    init_actor_critic,
    polyak,
)
from fastpop.networks import GaussianActor, TwinCritic
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition


@dataclasses.dataclass(frozen=True)
class SACConfig(ActorCriticConfig):
    """Static shape of a SAC member (hidden sizes, batch size); equal across a population."""


class SACHParams(NamedTuple):
    actor_lr: jax.Array
    critic_lr: jax.Array
    alpha_lr: jax.Array
    discount: jax.Array
    tau: jax.Array
    reward_scale: jax.Array
    target_entropy: jax.Array  # default -|A|


class SACState(NamedTuple):
    actor: PyTree
    critic: PyTree
    target_critic: PyTree
    log_alpha: jax.Array
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    alpha_opt: optax.OptState
    step: jax.Array


def squashed_gaussian_sample(mean, log_std, key, half_range, center):
    """Reparameterised tanh-Gaussian action and its log-density in action space."""
    std = jnp.exp(log_std)
    pre_tanh = mean + std * jax.random.normal(key, mean.shape)
    gaussian_log_prob = -0.5 * jnp.square((pre_tanh - mean) / std) - log_std
    gaussian_log_prob = gaussian_log_prob - 0.5 * math.log(2 * math.pi)
    # log(1 - tanh(u)^2) in a form that stays finite for large |u|.
    log_det_tanh = 2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    log_prob = jnp.sum(gaussian_log_prob - log_det_tanh - jnp.log(half_range), axis=-1)
    return jnp.tanh(pre_tanh) * half_range + center, log_prob


def make_sac(spec: EnvSpec, config: SACConfig = SACConfig()) -> Agent:
    if spec.discrete:
        raise ValueError("SAC needs a continuous action space; use DQN for discrete actions")
    actor_net = GaussianActor(spec.action_dim, config.hidden_sizes)
    critic_net = TwinCritic(config.hidden_sizes)
    optimizer = optax.scale_by_adam()
    half_range = (spec.action_high - spec.action_low) / 2.0
    center = (spec.action_high + spec.action_low) / 2.0

    def default_hparams() -> SACHParams:
        return hparams_from_values(
            SACHParams,
            frozenset(),
            actor_lr=3e-4,
            critic_lr=3e-4,
            alpha_lr=3e-4,
            discount=0.99,
            tau=0.005,
            reward_scale=1.0,
            target_entropy=-float(spec.action_dim),
        )

    def init(key: PRNGKey, hparams: SACHParams) -> SACState:
        del hparams
        actor, critic = init_actor_critic(key, actor_net, critic_net, spec)
        log_alpha = jnp.zeros((), jnp.float32)
        return SACState(
            actor=actor,
            critic=critic,
            target_critic=critic,
            log_alpha=log_alpha,
            actor_opt=optimizer.init(actor),
            critic_opt=optimizer.init(critic),
            alpha_opt=optimizer.init(log_alpha),
            step=jnp.zeros((), jnp.int32),
        )

    def sample_action(actor, obs, key):
        mean, log_std = actor_net.apply(actor, obs)
        return squashed_gaussian_sample(mean, log_std, key, half_range, center)

    def act(actor, obs, key, hparams: SACHParams, explore, env_steps=0):
        del hparams, env_steps
        sampled, _ = sample_action(actor, obs, key)
        mean, _ = actor_net.apply(actor, obs)
        return jnp.where(explore, sampled, jnp.tanh(mean) * half_range + center)

    def critic_loss(critic, state: SACState, batch: Transition, hparams: SACHParams, key):
        next_action, next_log_prob = sample_action(state.actor, batch.next_obs, key)
        next_q = jnp.min(critic_net.apply(state.target_critic, batch.next_obs, next_action), -1)
        next_value = next_q - jnp.exp(state.log_alpha) * next_log_prob
        # Only termination stops the bootstrap; a time-limit truncation still bootstraps.
        bootstrap = hparams.discount * (1.0 - batch.terminated.astype(jnp.float32))
        target = batch.reward * hparams.reward_scale + bootstrap * next_value
        target = jax.lax.stop_gradient(target)
        q = critic_net.apply(critic, batch.obs, batch.action)
        chex.assert_equal_shape([q[:, 0], target])
        return jnp.mean(jnp.sum(jnp.square(q - target[:, None]), -1)), jnp.mean(q)

    def actor_loss(actor, critic, log_alpha, obs, key):
        action, log_prob = sample_action(actor, obs, key)
        q = jnp.min(critic_net.apply(critic, obs, action), -1)
        return jnp.mean(jnp.exp(log_alpha) * log_prob - q), log_prob

    def alpha_loss(log_alpha, log_prob, target_entropy):
        return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))

    def update(state: SACState, batch: Transition, hparams: SACHParams, key: PRNGKey):
        chex.assert_rank([batch.obs, batch.action, batch.reward], [1 + len(spec.obs_shape), 2, 1])
        critic_key, actor_key = jax.random.split(key)
        (q_loss, q_mean), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic, state, batch, hparams, critic_key
        )
        critic, critic_opt = adam_step(
            state.critic, grads, state.critic_opt, optimizer, hparams.critic_lr
        )
        (pi_loss, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor, critic, state.log_alpha, batch.obs, actor_key
        )
        actor, actor_opt = adam_step(
            state.actor, grads, state.actor_opt, optimizer, hparams.actor_lr
        )
        temperature_loss, grad = jax.value_and_grad(alpha_loss)(
            state.log_alpha, log_prob, hparams.target_entropy
        )
        log_alpha, alpha_opt = adam_step(
            state.log_alpha, grad, state.alpha_opt, optimizer, hparams.alpha_lr
        )
        state = SACState(
            actor=actor,
            critic=critic,
            target_critic=polyak(state.target_critic, critic, hparams.tau),
            log_alpha=log_alpha,
            actor_opt=actor_opt,
            critic_opt=critic_opt,
            alpha_opt=alpha_opt,
            step=state.step + 1,
        )
        metrics = {
            "critic_loss": q_loss,
            "actor_loss": pi_loss,
            "alpha_loss": temperature_loss,
            "alpha": jnp.exp(log_alpha),
            "entropy": -jnp.mean(log_prob),
            "q_mean": q_mean,
        }
        return state, metrics

    return Agent(
        name="sac",
        init=init,
        act=act,
        update=update,
        policy_params=lambda state: state.actor,
        default_hparams=default_hparams,
        batch_size=config.batch_size,
    )
