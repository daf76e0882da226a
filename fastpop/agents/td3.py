"""TD3 (Fujimoto et al., 2018) for one member: twin critics, target smoothing, delayed actor."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
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
    select_tree,
)
from fastpop.agents.critics import ACTOR_QS, Critic, make_critic
from fastpop.agents.networks import DeterministicActor
from fastpop.agents.observation_norm import ObservationStats, with_observation_norm
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition, population_any

NAME = "td3"  # its `algo:` in a config, its registry entry's and its Agent's name


@dataclasses.dataclass(frozen=True)
class TD3Config(ActorCriticConfig):
    """Static shape of a TD3 member (hidden sizes, batch size, critic kind); equal across a
    population. The last five fields are FastTD3's (Seo et al., 2025) choices, each off by
    default: TD3's own."""

    target_actor: bool = True
    """The critics' target actions come from a target actor, Polyak-averaged on the actor steps
    (TD3); false: from the online actor, and the state holds no target actor (FastTD3)."""
    target_critic_every_step: bool = False
    """Polyak-average the target critics after every critic step (FastTD3); false: on the
    delayed actor steps only, with the target actor (TD3)."""
    actor_q: str = "first"
    """What the actor's loss maximizes: first, Q1 (TD3); min, min(Q1, Q2) (FastTD3; of a
    distributional critic, the smaller of the two critics' means)."""
    exploration_std_min: float | None = None
    """Per-episode exploration noise (FastTD3's std_min / std_max): each env lane's noise std
    is drawn uniformly between this and the member's exploration_noise (FastTD3's std_max) at
    the start of each of its episodes, and held for the episode; null: every lane's std is
    exploration_noise (TD3). In units of the action half-range, as exploration_noise."""
    actor_output_init_std: float | None = None
    """The actor's output layer starts from N(0, std^2) weights and zero biases (FastTD3's
    init_scale, 0.01: its first actions near the middle of the action range); null: flax's
    default initialization (TD3)."""


class TD3HParams(NamedTuple):
    """Per-member values, all traced: PBT may change any of them without recompiling."""

    actor_lr: jax.Array
    critic_lr: jax.Array
    discount: jax.Array
    tau: jax.Array
    policy_noise: jax.Array  # target smoothing noise std, in units of the action half-range
    noise_clip: jax.Array  # clip of that noise, same units
    policy_delay: jax.Array  # int32: critic steps per actor (and target) step
    exploration_noise: jax.Array  # acting noise std, in units of the action half-range
    n_step: jax.Array  # int32: the member's n of n-step returns, 1..agent.n_step
    # A distributional critic's support per member (None: agent.v_min / v_max, a constant)
    v_min: jax.Array | None = None
    v_max: jax.Array | None = None


INTEGERS = frozenset({"policy_delay", "n_step"})
TD3_DEFAULTS = {
    "actor_lr": 3e-4,
    "critic_lr": 3e-4,
    "discount": 0.99,
    "tau": 0.005,
    "policy_noise": 0.2,
    "noise_clip": 0.5,
    "policy_delay": 2,
    "exploration_noise": 0.1,
}


class TD3State(NamedTuple):
    actor: PyTree
    critic: PyTree
    target_actor: PyTree | None  # None with agent.target_actor false: the online actor serves
    target_critic: PyTree
    actor_opt: optax.OptState
    critic_opt: optax.OptState
    step: jax.Array  # critic updates done
    observation_norm: ObservationStats | None = None  # agent.observation_norm's; else None


class TD3Internals(NamedTuple):
    """The two halves of a TD3 update, for strategies that recombine them (CEM-RL, DvD).

    critic_step(state, batch, hparams, noise) -> (state, metrics); with
    target_critic_every_step the target critics follow the critics here.
    actor_step(state, obs, hparams, due) -> (state, actor_loss): actor step and Polyak
    targets (the target actor, if any; the target critics, unless they follow every critic
    step) where `due`, the state unchanged elsewhere.
    critic_loss(critic, state, batch, hparams, noise) -> (loss, mean q): the targets come from
    state.target_actor (state.actor without one) and state.target_critic, smoothed by `noise`,
    standard normal of the batch's action shape (`jax.random.normal(key, batch.action.shape)`);
    squared errors of a scalar critic, cross-entropies of a distributional one.
    actor_loss(actor, critic, obs, hparams=None) -> -mean Q1(obs, actor(obs)), or with actor_q
    min -mean min(Q1, Q2) (a distributional critic's Q: its mean over the support of
    `hparams`, `Critic.member_support`).
    actor_apply(actor, obs) -> deterministic actions.
    optimizer: the moment-only optimizer of `adam_step` (`network_optimizer`).
    """

    critic_step: Callable
    actor_step: Callable
    critic_loss: Callable
    actor_loss: Callable
    actor_apply: Callable
    optimizer: optax.GradientTransformation
    # The target critics written after every critic step (config.target_critic_every_step),
    # not with the delayed actor step: what a cost model of the update counts them by.
    target_critic_every_step: bool = False


def critic_batch_loss(critic: Critic) -> Callable:
    """loss(outputs, batch, hparams, next_target_outputs) -> (B,) TD3 critic losses of the
    critic's kind, from both critics' outputs at (obs, action) and both target critics' at
    (next_obs, smoothed target action)."""
    if critic.support is None:
        scalar = jax.vmap(losses.td3_critic_loss)

        def squared_errors(q, batch, hparams, next_q):
            reward, discount = losses.discounted_rewards(batch, hparams.discount)
            return scalar(q, reward, discount, batch.terminated, next_q)

        return squared_errors
    distributional = jax.vmap(losses.td3_distributional_critic_loss, in_axes=(0, 0, 0, 0, None))
    bootstrap = jax.vmap(losses.bootstrap_multiplier)

    def cross_entropies(logits, batch, hparams, next_logits):
        reward, discount = losses.discounted_rewards(batch, hparams.discount)
        multiplier = bootstrap(discount, batch.terminated)
        support = critic.member_support(hparams)
        return distributional(logits, reward, multiplier, next_logits, support)

    return cross_entropies


def make_td3_internals(
    spec: EnvSpec,
    actor_net: DeterministicActor,
    critic: Critic,
    optimizer: optax.GradientTransformation,
    config: TD3Config = TD3Config(),
) -> TD3Internals:
    """The critic and actor halves of a TD3 update: network applies here, arithmetic in losses;
    `config`'s FastTD3 choices (target_actor, target_critic_every_step, actor_q) decide which."""
    # The action bounds are static floats, closed over rather than traced.
    bounded = partial(
        losses.td3_target_action, action_low=spec.action_low, action_high=spec.action_high
    )
    smoothed_action = jax.vmap(bounded, in_axes=(0, 0, None, None))
    critic_net, batch_loss = critic.network, critic_batch_loss(critic)
    example_actor_loss = {"first": losses.td3_actor_loss, "min": losses.td3_min_actor_loss}
    per_example_actor_loss = jax.vmap(example_actor_loss[config.actor_q])

    def critic_loss(critic_params, state: TD3State, batch: Transition, hparams: TD3HParams, noise):
        next_actor = state.target_actor if config.target_actor else state.actor
        next_action = smoothed_action(
            actor_net.apply(next_actor, batch.next_obs),
            noise,
            hparams.policy_noise,
            hparams.noise_clip,
        )
        next_outputs = critic_net.apply(state.target_critic, batch.next_obs, next_action)
        outputs = critic_net.apply(critic_params, batch.obs, batch.action)
        loss = batch_loss(outputs, batch, hparams, next_outputs)
        return jnp.mean(loss), jnp.mean(critic.q_values(outputs, hparams))

    def actor_loss(actor, critic_params, obs, hparams=None):
        outputs = critic_net.apply(critic_params, obs, actor_net.apply(actor, obs))
        return jnp.mean(per_example_actor_loss(critic.q_values(outputs, hparams)))

    def actor_and_targets_step(state: TD3State, obs, hparams: TD3HParams, due):
        loss, grads = jax.value_and_grad(actor_loss)(state.actor, state.critic, obs, hparams)
        actor, actor_opt = adam_step(
            state.actor, grads, state.actor_opt, optimizer, hparams.actor_lr
        )
        stepped = state._replace(actor=actor, actor_opt=actor_opt)
        if config.target_actor:
            stepped = stepped._replace(target_actor=polyak(state.target_actor, actor, hparams.tau))
        if not config.target_critic_every_step:
            target_critic = polyak(state.target_critic, state.critic, hparams.tau)
            stepped = stepped._replace(target_critic=target_critic)
        # Inside a population some members may not be due this step: they keep their state.
        return select_tree(due, stepped, state), jnp.where(due, loss, jnp.nan)

    def critic_step(state: TD3State, batch: Transition, hparams: TD3HParams, noise):
        ranks = [1 + len(spec.obs_shape), 2, losses.reward_rank(batch)]
        chex.assert_rank([batch.obs, batch.action, batch.reward], ranks)
        (loss, q_mean), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic, state, batch, hparams, noise
        )
        critic, critic_opt = adam_step(
            state.critic, grads, state.critic_opt, optimizer, hparams.critic_lr
        )
        state = state._replace(critic=critic, critic_opt=critic_opt, step=state.step + 1)
        if config.target_critic_every_step:
            state = state._replace(target_critic=polyak(state.target_critic, critic, hparams.tau))
        return state, {"critic_loss": loss, "q_mean": q_mean}

    return TD3Internals(
        critic_step,
        actor_and_targets_step,
        critic_loss,
        actor_loss,
        actor_net.apply,
        optimizer,
        config.target_critic_every_step,
    )


def per_episode_std(std_min: float, std_max: jax.Array, episode_draws) -> jax.Array:
    """Each lane's exploration std, (N, 1), from its episode's uniform draw (N,) in [0, 1):
    uniform between std_min and std_max (`TD3Config.exploration_std_min`)."""
    if episode_draws is None:
        raise ValueError(
            "agent.exploration_std_min: an exploring act needs each lane's episode draws "
            "(act(..., episode_draws=...)), which the acting code keeps per env lane"
        )
    return std_min + episode_draws[:, None] * (std_max - std_min)


def exploring_act(spec: EnvSpec, actor_net: DeterministicActor, std_min: float | None):
    """TD3's act: the actor's action plus Gaussian noise of the member's exploration_noise (or,
    with `std_min`, each lane's per-episode std: `per_episode_std`), clipped to the bounds."""
    half_range = (spec.action_high - spec.action_low) / 2.0

    def act(actor, obs, key, hparams: TD3HParams, explore, env_steps=0, episode_draws=None):
        del env_steps
        action = actor_net.apply(actor, obs)
        std = hparams.exploration_noise
        if std_min is not None and explore is not False:
            std = per_episode_std(std_min, std, episode_draws)
        noise_std = jnp.where(explore, std, 0.0) * half_range
        noise = noise_std * jax.random.normal(key, action.shape)
        return jnp.clip(action + noise, spec.action_low, spec.action_high)

    return act


def delayed_actor_update(internals: TD3Internals) -> Callable:
    """update_drawn(state, batch, hparams, noise): a critic step, then, every policy_delay
    critic steps, the actor step and the Polyak targets (`internals`' two halves)."""

    def update_drawn(state: TD3State, batch: Transition, hparams: TD3HParams, noise):
        state, metrics = internals.critic_step(state, batch, hparams, noise)
        due = state.step % jnp.maximum(hparams.policy_delay, 1) == 0
        # One branch for the whole population: skip the actor pass when no member is due,
        # rather than vmap turning the cond into a select that always runs both branches.
        state, policy_loss = jax.lax.cond(
            population_any(due),
            lambda s: internals.actor_step(s, batch.obs, hparams, due),
            lambda s: (s, jnp.full((), jnp.nan)),
            state,
        )
        return state, {**metrics, "actor_loss": policy_loss}

    return update_drawn


def make_td3(spec: EnvSpec, config: TD3Config = TD3Config()) -> Agent:
    if spec.discrete:
        raise ValueError("TD3 needs a continuous action space; use DQN for discrete actions")
    if config.actor_q not in ACTOR_QS:
        raise ValueError(
            f"agent.actor_q: must be one of {', '.join(ACTOR_QS)}, got {config.actor_q!r}"
        )
    actor_net = DeterministicActor(
        spec.action_dim,
        config.actor_widths,
        spec.action_low,
        spec.action_high,
        config.compute_dtype,
        config.network,
        spec.actor_observes,
        config.actor_output_init_std,
        config.mlp_kernels,
    )
    critic = make_critic(config, spec.critic_observes)
    optimizer = network_optimizer(config.weight_decay)
    internals = make_td3_internals(spec, actor_net, critic, optimizer, config)
    std_min = config.exploration_std_min

    def default_hparams() -> TD3HParams:
        return hparams_from_values(TD3HParams, INTEGERS, **TD3_DEFAULTS, n_step=config.n_step)

    def init(key: PRNGKey, hparams: TD3HParams) -> TD3State:
        del hparams
        actor, critic_params = init_actor_critic(key, actor_net, critic.network, spec)
        return TD3State(
            actor=actor,
            critic=critic_params,
            target_actor=actor if config.target_actor else None,
            target_critic=critic_params,
            actor_opt=optimizer.init(actor),
            critic_opt=optimizer.init(critic_params),
            step=jnp.zeros((), jnp.int32),
        )

    def draw(key: PRNGKey) -> jax.Array:
        """The target smoothing noise of one update."""
        return jax.random.normal(key, (config.batch_size, spec.action_dim))

    update_drawn = delayed_actor_update(internals)
    agent = Agent(
        name=NAME,
        init=init,
        act=exploring_act(spec, actor_net, std_min),
        update=keyed_update(draw, update_drawn),
        draw=draw,
        update_drawn=update_drawn,
        policy_params=lambda state: state.actor,
        default_hparams=default_hparams,
        batch_size=config.batch_size,
        n_step=config.n_step,
        internals=internals,
        episode_draws=std_min is not None,
    )
    return with_observation_norm(agent, spec) if config.observation_norm else agent


def update_anatomy(agent: Agent, hparams: TD3HParams) -> UpdateAnatomy:
    """The critic stepped every step; the actor, its target and (unless
    `target_critic_every_step`) the target critics on 1 / policy_delay of the steps, when the
    update takes its delayed branch: costed as its critic and actor steps apart."""
    internals, delayed = agent.internals, 1.0 / max(int(hparams.policy_delay), 1)
    critic_step = lambda state, batch, hparams, key: internals.critic_step(
        state, batch, hparams, agent.draw(key)
    )
    actor_step = lambda state, batch, hparams, key: internals.actor_step(
        state, batch.obs, hparams, jnp.bool_(True)
    )
    return UpdateAnatomy(
        optimised=(("critic", "critic_opt"), ("actor", "actor_opt")),
        targets=("target_actor", "target_critic"),
        write_fractions={
            "actor": delayed,
            "target_actor": delayed,
            "target_critic": 1.0 if internals.target_critic_every_step else delayed,
        },
        parts=((critic_step, 1.0), (actor_step, delayed)),
        branch_fraction=delayed,
    )


ENTRY = AlgorithmEntry(
    name=NAME,
    make=make_td3,
    config_type=TD3Config,
    actions="continuous",
    numpy_policy="deterministic",
    deterministic_action="the actor",
    shared_critic=True,
    asymmetric=True,
    update_anatomy=update_anatomy,
)
