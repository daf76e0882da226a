"""TD3 members with one shared critic pair: the population-level update of CEM-RL and DvD.

The members' actors (with their targets and optimizer moments) are stacked along the population
axis; the twin critic, its target and its optimizer state are ONE set of parameters. Each update:

  critic  one gradient step on the union of the trained members' batches (every member samples
          its own batch from the shared buffer), each batch with its own member's target action;
  actors  every `policy_delay` critic steps, one gradient step of the population-level loss
              sum over trained members of their TD3 actor losses  -  lambda * log det K
          (K: `diversity.rbf_kernel` over the members' actions on one shared batch of states,
          DvD's term; lambda = 0 leaves exactly independent TD3 actor steps), then Polyak
          targets for the trained actors and the critic.

Critic-level hparams (critic_lr, discount, tau, noises, delay) are read from member 0: strategies
with a shared critic keep them equal across members.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fastpop import population
from fastpop.agents.base import adam_step, polyak, select_tree
from fastpop.agents.td3 import TD3State
from fastpop.strategies import diversity
from fastpop.strategies.base import Learning, Strategy, no_selection
from fastpop.types import PyTree, Transition


class SharedCriticState(NamedTuple):
    actors: PyTree  # (P, ...)
    target_actors: PyTree  # (P, ...)
    actor_opts: PyTree  # (P, ...)
    critic: PyTree  # one twin critic
    target_critic: PyTree
    critic_opt: PyTree
    step: jax.Array  # critic updates done
    trained: jax.Array  # (P,) bool: members whose actors take gradient steps
    diversity_weight: jax.Array  # DvD's lambda; 0 for CEM-RL


def init(agent, key: jax.Array, hparams, trained: jax.Array) -> SharedCriticState:
    """Independently initialised actors, and member 0's critic as the shared one."""
    members = population.init_population(agent, key, hparams)
    return SharedCriticState(
        actors=members.actor,
        target_actors=members.target_actor,
        actor_opts=members.actor_opt,
        critic=population.member(members.critic, 0),
        target_critic=population.member(members.target_critic, 0),
        critic_opt=population.member(members.critic_opt, 0),
        step=jnp.zeros((), jnp.int32),
        trained=jnp.asarray(trained, bool),
        diversity_weight=jnp.zeros((), jnp.float32),
    )


def strategy(name: str, evaluation_interval: int, init_states, make_update, step) -> Strategy:
    """A shared-critic strategy: it acts through `Learning.step` after every evaluation round,
    which the learner waits for (each round's decision depends on that round's returns, so
    waiting keeps runs reproducible)."""
    learning = Learning(init_states, make_update, policies, member_trees, step)
    return Strategy(name, evaluation_interval, True, lambda: None, no_selection, learning)


def policies(state: SharedCriticState) -> PyTree:
    return state.actors


def member_trees(state: SharedCriticState) -> tuple:
    """The per-member (stacked) part of the state."""
    return (state.actors, state.target_actors, state.actor_opts)


def trained_mean(trained: jax.Array, values: jax.Array) -> jax.Array:
    """Mean of `values` over the trained members (0 when none is)."""
    return jnp.sum(jnp.where(trained, values, 0.0)) / jnp.maximum(jnp.sum(trained), 1)


def population_actor_loss(
    internals, actors, critic, obs, trained, weight, embedding_obs, kernel, hparams=None
):
    """sum_m trained_m * TD3 actor loss_m - lambda * log det K, written for the whole population:
    one `grad` of this gives each actor its own TD3 gradient plus its share of the coupling.
    `hparams`: the critic's (member 0's), whose support its Q is the mean over."""
    member_loss = lambda actor, member_obs: internals.actor_loss(actor, critic, member_obs, hparams)
    losses = jax.vmap(member_loss)(actors, obs)
    td3 = jnp.sum(jnp.where(trained, losses, 0.0))

    length_scale, jitter = kernel

    def coupling(actors):
        embeddings = diversity.embeddings(internals.actor_apply, actors, embedding_obs)
        return diversity.log_det(diversity.rbf_kernel(embeddings, length_scale), jitter)

    # cond, not a product: with lambda = 0 no gradient flows through the kernel at all.
    log_det = jax.lax.cond(weight > 0, coupling, lambda _: jnp.zeros(()), actors)
    return td3 - weight * log_det, losses


def shared_critic_loss(internals):
    """critic_loss(critic, state, batches, hparams, keys) -> (loss, mean q): the trained
    members' mean TD3 critic loss of the one critic, each member's batch with its own target
    actor's smoothed target action (`internals`: TD3's)."""

    def critic_loss(critic, state: SharedCriticState, batches: Transition, hparams, keys):
        def member_loss(target_actor, batch, key):
            view = TD3State(None, critic, target_actor, state.target_critic, None, None, None)
            noise = jax.random.normal(key, batch.action.shape)
            return internals.critic_loss(critic, view, batch, hparams, noise)

        losses, q_means = jax.vmap(member_loss)(state.target_actors, batches, keys)
        return trained_mean(state.trained, losses), trained_mean(state.trained, q_means)

    return critic_loss


def population_actor_step(internals, embedding_states: int, kernel: tuple[float, float]):
    """actor_step(state, batches, member_hparams, hparams) -> (state, mean actor loss): one
    step of `population_actor_loss` for the trained actors (the others keep actor and
    moments), then Polyak targets for them and the critic."""

    def actor_step(state: SharedCriticState, batches: Transition, member_hparams, hparams):
        obs = batches.obs
        embedding_obs = obs[0, :embedding_states]
        grads, losses = jax.grad(population_actor_loss, argnums=1, has_aux=True)(
            internals,
            state.actors,
            state.critic,
            obs,
            state.trained,
            state.diversity_weight,
            embedding_obs,
            kernel,
            hparams,
        )
        step = jax.vmap(lambda a, g, o, lr: adam_step(a, g, o, internals.optimizer, lr))
        actors, opts = step(state.actors, grads, state.actor_opts, member_hparams.actor_lr)
        keep = jax.vmap(select_tree)  # untrained members keep actor and moments
        actors = keep(state.trained, actors, state.actors)
        opts = keep(state.trained, opts, state.actor_opts)
        targets = jax.vmap(polyak, in_axes=(0, 0, None))(state.target_actors, actors, hparams.tau)
        state = state._replace(
            actors=actors,
            actor_opts=opts,
            target_actors=keep(state.trained, targets, state.target_actors),
            target_critic=polyak(state.target_critic, state.critic, hparams.tau),
        )
        return state, trained_mean(state.trained, losses)

    return actor_step


def make_update(
    plan: population.UpdatePlan,
    embedding_states: int = 20,
    length_scale: float = 1.0,
    jitter: float = 1e-3,
):
    """update(state, shared_replay, hparams (stacked), key) -> (state, metrics), jitted with
    the state donated; `plan.num_updates` critic steps per call (the replay is always shared)."""
    internals, sample_batch = plan.agent.internals, plan.sample_batch
    critic_loss = shared_critic_loss(internals)
    actor_step = population_actor_step(internals, embedding_states, (length_scale, jitter))

    def one_update(state: SharedCriticState, replay, member_hparams, key):
        hparams = population.member(member_hparams, 0)
        size = state.trained.shape[0]
        sample_keys, noise_keys = jnp.split(jax.random.split(key, 2 * size), 2)
        # The one critic learns with member 0's hparams: its discount, and its n of n-step.
        own_n = population.replay.own_n_args(hparams, plan.agent.n_step)
        batches = jax.vmap(lambda key: sample_batch(replay, key, *own_n))(sample_keys)
        (loss, q_mean), grads = jax.value_and_grad(critic_loss, has_aux=True)(
            state.critic, state, batches, hparams, noise_keys
        )
        critic, critic_opt = adam_step(
            state.critic, grads, state.critic_opt, internals.optimizer, hparams.critic_lr
        )
        state = state._replace(critic=critic, critic_opt=critic_opt, step=state.step + 1)
        due = state.step % jnp.maximum(hparams.policy_delay, 1) == 0
        state, actor_loss = jax.lax.cond(
            due,
            lambda s: actor_step(s, batches, member_hparams, hparams),
            lambda s: (s, jnp.full((), jnp.nan)),
            state,
        )
        return state, {"critic_loss": loss, "q_mean": q_mean, "actor_loss": actor_loss}

    def update(state, replay, member_hparams, key):
        keys = jax.random.split(key, plan.num_updates)
        state, metrics = jax.lax.scan(
            lambda s, k: one_update(s, replay, member_hparams, k), state, keys
        )
        # Per-member shaped metrics, as the executors return them (the learner averages).
        return state, jax.tree.map(lambda m: jnp.broadcast_to(m, (1, *m.shape)), metrics)

    return jax.jit(update, donate_argnums=0)
