"""SAC (Haarnoja et al., 2018) for one member, with a learned entropy temperature.

With n-step returns (`agent.n_step` > 1) the critics' target is the window's discounted reward
sum and the discounted soft value of its bootstrap state, min Q'(s_n, a') - alpha * log
pi(a'|s_n): the entropy terms of the window's intermediate states, -gamma**k * alpha * log
pi(a_k|s_k) for 0 < k < n, are not counted, as FastSAC's n-step targets do not count them
(Seo et al., 2025). Deliberately: the a_k are the stored actions of the policy that collected
the window, whose log-densities under the current policy are not its entropy (the n-step return
is an uncorrected off-policy one already), and counting them would gather each window's
intermediate observations and actions (the sampler gathers its rewards only) and apply the
actor n - 1 more times per transition. The soft value then counts entropy from the bootstrap
state on: the first n - 1 steps are valued by their rewards alone, without a soft return's
alpha * gamma**k * entropy of pi(.|s_k), a difference the learned temperature shrinks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import optax

from fastpop.agents import losses
from fastpop.agents.base import (
    ActorCriticConfig,
    Agent,
    AlgorithmEntry,
    UpdateAnatomy,
    adam_step,
    hparams_from_values,
    init_actor_critic,
    keyed_update,
    network_optimizer,
    polyak,
)
from fastpop.agents.critics import Critic, make_critic
from fastpop.agents.networks import GaussianActor
from fastpop.agents.observation_norm import ObservationStats, with_observation_norm
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition

NAME = "sac"  # its `algo:` in a config, its registry entry's and its Agent's name


@dataclasses.dataclass(frozen=True)
class SACConfig(ActorCriticConfig):
    """Static shape of a SAC member (hidden sizes, batch size, critic kind); equal across a
    population."""


# The temperature's optimizer: Adam, never weight-decayed (agent.weight_decay is the networks').
TEMPERATURE_OPTIMIZER = optax.scale_by_adam()


class SACHParams(NamedTuple):
    actor_lr: jax.Array
    critic_lr: jax.Array
    alpha_lr: jax.Array
    discount: jax.Array
    tau: jax.Array
    reward_scale: jax.Array
    target_entropy: jax.Array  # default -|A|
    n_step: jax.Array  # int32: the member's n of n-step returns, 1..agent.n_step
    # A distributional critic's support per member (None: agent.v_min / v_max, a constant)
    v_min: jax.Array | None = None
    v_max: jax.Array | None = None


class SACState(NamedTuple):
    actor: PyTree
    critic: PyTree
    target_critic: PyTree
    log_alpha: jax.Array
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    alpha_opt: optax.OptState
    step: jax.Array
    observation_norm: ObservationStats | None = None  # agent.observation_norm's; else None


def squashed_gaussian_sample(mean, log_std, noise, half_range, center):
    """Reparameterised tanh-Gaussian action and its log-density in action space; `noise`:
    standard normal of `mean`'s shape."""
    std = jnp.exp(log_std)
    pre_tanh = mean + std * noise
    gaussian_log_prob = -0.5 * jnp.square((pre_tanh - mean) / std) - log_std
    gaussian_log_prob = gaussian_log_prob - 0.5 * math.log(2 * math.pi)
    # log(1 - tanh(u)^2) in a form that stays finite for large |u|.
    log_det_tanh = 2.0 * (math.log(2.0) - pre_tanh - jax.nn.softplus(-2.0 * pre_tanh))
    log_prob = jnp.sum(gaussian_log_prob - log_det_tanh - jnp.log(half_range), axis=-1)
    return jnp.tanh(pre_tanh) * half_range + center, log_prob


def temperature_loss(log_alpha, log_prob, target_entropy):
    """Mean over a batch of sampled actions' log-densities of the per-transition alpha loss."""
    per_example = jax.vmap(losses.sac_temperature_loss, in_axes=(None, 0, None))
    return jnp.mean(per_example(log_alpha, log_prob, target_entropy))


class SACInternals(NamedTuple):
    """The pieces of a SAC update, for code that recombines or costs them.

    sample_action(actor, obs, noise) -> (actions, log-densities) of the squashed Gaussian.
    critic_loss(critic, state, batch, hparams, noise) -> (loss, mean q): targets from
    state.target_critic and next actions sampled from state.actor at temperature state.log_alpha
    (a distributional critic's target: its next-state distribution shifted by -alpha * log pi).
    actor_loss(actor, critic, log_alpha, obs, noise, hparams=None) -> (loss, log-densities of the
    actions).
    critic_step(state, batch, hparams, noise) -> (state, metrics).
    actor_and_temperature_step(state, obs, hparams, noise) -> (state, metrics).
    Each `noise`: standard normal of the batch's action shape.
    optimizer: the moment-only optimizer of `adam_step` for the networks (`network_optimizer`;
    the temperature's is `TEMPERATURE_OPTIMIZER`).
    """

    sample_action: Callable
    critic_loss: Callable
    actor_loss: Callable
    critic_step: Callable
    actor_and_temperature_step: Callable
    optimizer: optax.GradientTransformation


def critic_batch_loss(critic: Critic):
    """loss(outputs, batch, hparams, next_target_outputs, next_log_prob, alpha) -> (B,) SAC
    critic losses of the critic's kind, from both critics' outputs at (obs, action) and both
    target critics' at (next_obs, a' ~ pi), with log pi(a'|s'); one-step or n-step transitions
    (`losses.discounted_rewards`)."""
    if critic.support is None:
        scalar = jax.vmap(losses.sac_critic_loss, in_axes=(0, 0, 0, 0, 0, 0, None, None))

        def squared_errors(q, batch, hparams, next_q, next_log_prob, alpha):
            reward, discount = losses.discounted_rewards(batch, hparams.discount)
            return scalar(
                q,
                reward,
                discount,
                batch.terminated,
                next_q,
                next_log_prob,
                alpha,
                hparams.reward_scale,
            )

        return squared_errors
    distributional = jax.vmap(
        losses.sac_distributional_critic_loss, in_axes=(0, 0, 0, 0, 0, None, None, None)
    )
    bootstrap = jax.vmap(losses.bootstrap_multiplier)

    def cross_entropies(logits, batch, hparams, next_logits, next_log_prob, alpha):
        reward, discount = losses.discounted_rewards(batch, hparams.discount)
        return distributional(
            logits,
            reward,
            bootstrap(discount, batch.terminated),
            next_logits,
            next_log_prob,
            alpha,
            hparams.reward_scale,
            critic.member_support(hparams),
        )

    return cross_entropies


def make_sac_internals(
    spec: EnvSpec,
    actor_net: GaussianActor,
    critic: Critic,
    optimizer: optax.GradientTransformation,
) -> SACInternals:
    """Critic, actor and temperature steps of SAC: network applies here, arithmetic in losses."""
    half_range = (spec.action_high - spec.action_low) / 2.0
    center = (spec.action_high + spec.action_low) / 2.0
    critic_net, batch_loss = critic.network, critic_batch_loss(critic)
    actor_example_loss = jax.vmap(losses.sac_actor_loss, in_axes=(0, 0, None))

    def sample_action(actor, obs, noise):
        mean, log_std = actor_net.apply(actor, obs)
        return squashed_gaussian_sample(mean, log_std, noise, half_range, center)

    def critic_loss(critic_params, state: SACState, batch: Transition, hparams: SACHParams, noise):
        next_action, next_log_prob = sample_action(state.actor, batch.next_obs, noise)
        next_outputs = critic_net.apply(state.target_critic, batch.next_obs, next_action)
        outputs = critic_net.apply(critic_params, batch.obs, batch.action)
        alpha = jnp.exp(state.log_alpha)
        loss = batch_loss(outputs, batch, hparams, next_outputs, next_log_prob, alpha)
        return jnp.mean(loss), jnp.mean(critic.q_values(outputs, hparams))

    def actor_loss(actor, critic_params, log_alpha, obs, noise, hparams=None):
        action, log_prob = sample_action(actor, obs, noise)
        q = critic.q_values(critic_net.apply(critic_params, obs, action), hparams)
        return jnp.mean(actor_example_loss(q, log_prob, jnp.exp(log_alpha))), log_prob

    def critic_step(state: SACState, batch: Transition, hparams: SACHParams, noise):
        (loss, q_mean), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic, state, batch, hparams, noise
        )
        critic, critic_opt = adam_step(
            state.critic, grads, state.critic_opt, optimizer, hparams.critic_lr
        )
        state = state._replace(critic=critic, critic_opt=critic_opt)
        return state, {"critic_loss": loss, "q_mean": q_mean}

    def actor_and_temperature_step(state: SACState, obs, hparams: SACHParams, noise):
        (pi_loss, log_prob), grads = jax.value_and_grad(actor_loss, has_aux=True)(
            state.actor, state.critic, state.log_alpha, obs, noise, hparams
        )
        actor, actor_opt = adam_step(
            state.actor, grads, state.actor_opt, optimizer, hparams.actor_lr
        )
        alpha_loss, grad = jax.value_and_grad(temperature_loss)(
            state.log_alpha, log_prob, hparams.target_entropy
        )
        log_alpha, alpha_opt = adam_step(
            state.log_alpha, grad, state.alpha_opt, TEMPERATURE_OPTIMIZER, hparams.alpha_lr
        )
        state = state._replace(
            actor=actor, actor_opt=actor_opt, log_alpha=log_alpha, alpha_opt=alpha_opt
        )
        metrics = {
            "actor_loss": pi_loss,
            "alpha_loss": alpha_loss,
            "alpha": jnp.exp(log_alpha),
            "entropy": -jnp.mean(log_prob),
        }
        return state, metrics

    return SACInternals(
        sample_action, critic_loss, actor_loss, critic_step, actor_and_temperature_step, optimizer
    )


def default_hparams(spec: EnvSpec, n_step: int = 1) -> SACHParams:
    """The paper's values; the target entropy -|A|; `n_step`: agent.n_step."""
    return hparams_from_values(
        SACHParams,
        frozenset({"n_step"}),
        actor_lr=3e-4,
        critic_lr=3e-4,
        alpha_lr=3e-4,
        discount=0.99,
        tau=0.005,
        reward_scale=1.0,
        target_entropy=-float(spec.action_dim),
        n_step=n_step,
    )


def make_sac(spec: EnvSpec, config: SACConfig = SACConfig()) -> Agent:
    if spec.discrete:
        raise ValueError("SAC needs a continuous action space; use DQN for discrete actions")
    actor_net = GaussianActor(
        spec.action_dim,
        config.actor_widths,
        dtype=config.compute_dtype,
        network=config.network,
        observes=spec.actor_observes,
        kernel=config.mlp_kernels,
    )
    critic = make_critic(config, spec.critic_observes)
    optimizer = network_optimizer(config.weight_decay)
    internals = make_sac_internals(spec, actor_net, critic, optimizer)
    half_range = (spec.action_high - spec.action_low) / 2.0
    center = (spec.action_high + spec.action_low) / 2.0

    def init(key: PRNGKey, hparams: SACHParams) -> SACState:
        del hparams
        actor, critic_params = init_actor_critic(key, actor_net, critic.network, spec)
        log_alpha = jnp.zeros((), jnp.float32)
        return SACState(
            actor=actor,
            critic=critic_params,
            target_critic=critic_params,
            log_alpha=log_alpha,
            actor_opt=optimizer.init(actor),
            critic_opt=optimizer.init(critic_params),
            alpha_opt=TEMPERATURE_OPTIMIZER.init(log_alpha),
            step=jnp.zeros((), jnp.int32),
        )

    def act(actor, obs, key, hparams: SACHParams, explore, env_steps=0):
        del hparams, env_steps
        mean, log_std = actor_net.apply(actor, obs)
        noise = jax.random.normal(key, mean.shape)
        sampled, _ = squashed_gaussian_sample(mean, log_std, noise, half_range, center)
        return jnp.where(explore, sampled, jnp.tanh(mean) * half_range + center)

    def draw(key: PRNGKey) -> tuple[jax.Array, jax.Array]:
        """The noise of one update's next actions (critic step) and new actions (actor step)."""
        shape = (config.batch_size, spec.action_dim)
        critic_key, actor_key = jax.random.split(key)
        return jax.random.normal(critic_key, shape), jax.random.normal(actor_key, shape)

    def update_drawn(state: SACState, batch: Transition, hparams: SACHParams, drawn):
        ranks = [1 + len(spec.obs_shape), 2, losses.reward_rank(batch)]
        chex.assert_rank([batch.obs, batch.action, batch.reward], ranks)
        critic_noise, actor_noise = drawn
        state, critic_metrics = internals.critic_step(state, batch, hparams, critic_noise)
        # The actor is trained against the critic just updated, then the targets follow it.
        state, actor_metrics = internals.actor_and_temperature_step(
            state, batch.obs, hparams, actor_noise
        )
        state = state._replace(
            target_critic=polyak(state.target_critic, state.critic, hparams.tau),
            step=state.step + 1,
        )
        return state, {**critic_metrics, **actor_metrics}

    agent = Agent(
        name=NAME,
        init=init,
        act=act,
        update=keyed_update(draw, update_drawn),
        draw=draw,
        update_drawn=update_drawn,
        policy_params=lambda state: state.actor,
        default_hparams=lambda: default_hparams(spec, config.n_step),
        batch_size=config.batch_size,
        n_step=config.n_step,
        internals=internals,
    )
    return with_observation_norm(agent, spec) if config.observation_norm else agent


def update_anatomy(agent: Agent, hparams: SACHParams) -> UpdateAnatomy:
    """The critic, the actor and the temperature stepped, the target critics written, every
    step."""
    return UpdateAnatomy(
        optimised=(("critic", "critic_opt"), ("actor", "actor_opt"), ("log_alpha", "alpha_opt")),
        targets=("target_critic",),
    )


ENTRY = AlgorithmEntry(
    name=NAME,
    make=make_sac,
    config_type=SACConfig,
    actions="continuous",
    numpy_policy="squashed_gaussian",
    deterministic_action="tanh(mean) scaled to the bounds",
    asymmetric=True,
    update_anatomy=update_anatomy,
)
