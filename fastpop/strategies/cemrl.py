"""CEM-RL (Pourchot & Sigaud, ICLR 2019) over TD3: a diagonal-Gaussian CEM over the flattened
actor parameters, half of its samples improved by TD3 actor steps against one shared critic.

Member 0 acts with the CEM mean (evaluated and logged as its own curve, never trained); members
1..P-1 are the generation's mirrored samples, the first `trained_fraction` of them trained. Each
generation (`cemrl.generation_steps` env steps per member) ends with an evaluation of every
member with the policy held constant (the learner waits for it); the returns of the samples,
after their gradient steps, refit the distribution (Lamarckian, as in the paper) and the next
generation is sampled: fresh actors, targets equal to them, fresh optimizer moments. The critic
and the shared replay carry over.

Gradient steps per generation: `generation_steps * samples_per_insert / batch_size` critic
steps, and that over `policy_delay` actor steps for each trained actor. The authors' code gives
each trained actor as many actor steps as the generation's samples took env steps, and the
critic as many in all (apourchot/CEM-RL, es_grad.py, lines 418-433): configs/td3_cemrl_hopper.yaml
sets samples_per_insert = (population.size - 1) * batch_size and policy_delay = 1 for that.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from fastpop import population
from fastpop.compilation.rarely_run import rarely_run_jit
from fastpop.schema import field
from fastpop.strategies import cem, shared_critic
from fastpop.strategies.base import Evaluation, MeanMember, StrategyEntry

MEAN_MEMBER = 0


@dataclasses.dataclass(frozen=True)
class CEMRLConfig:
    generation_steps: int = field(5_000, min=1)
    """Env steps per member in one generation; each ends with an evaluation of every member."""
    trained_fraction: float = field(0.5, min=0, max=1)
    """Share of the sampled actors that take TD3 actor steps against the shared critic."""
    elite_fraction: float = field(0.5, gt=0, max=1)
    """Share of the sampled actors, best first, that the distribution is refitted to."""
    initial_variance: float = field(1e-3, gt=0)
    """Variance of every actor parameter in the first generation."""
    initial_noise: float = field(1e-3, min=0)
    """Variance added at the first refit (keeps the search from collapsing)."""
    noise_decay: float = field(0.95, min=0, max=1)
    """Per generation: noise <- decay * noise + (1 - decay) * noise_floor."""
    noise_floor: float = field(1e-5, min=0)
    """What the added variance decays towards."""


class CEMRLState(NamedTuple):
    distribution: cem.CEMState
    generation: int


def trained_mask(size: int, trained_fraction: float) -> np.ndarray:
    """Member 0 (the mean) is never trained; the first share of the samples is."""
    samples = size - 1
    mask = np.zeros(size, bool)
    mask[1 : 1 + round(samples * trained_fraction)] = True
    return mask


def generations(config, samples: int):
    """(actors_from, next_generation) of the CEM over flat actor parameters (`config`: a
    `CEMRLConfig`): actors_from(optimizer, distribution, unravel, key) -> (actors, their fresh
    optimizer moments): the mean as member 0, then `samples` mirrored draws; next_generation(
    optimizer, distribution, actors, fitness, key) -> (the distribution refitted to the
    samples' fitness, the next generation's actors_from), jitted."""

    def actors_from(optimizer, distribution, unravel, key):
        drawn = cem.ask(distribution, key, samples)
        flat = jnp.concatenate([distribution.mean[None], drawn])
        actors = jax.vmap(unravel)(flat)
        return actors, jax.vmap(optimizer.init)(actors)

    @functools.partial(jax.jit, static_argnums=0)
    def next_generation(optimizer, distribution, actors, fitness, key):
        flat = jax.vmap(lambda actor: ravel_pytree(actor)[0])(actors)
        unravel = ravel_pytree(population.member(actors, 0))[1]
        distribution = cem.tell(
            distribution,
            flat[1:],
            fitness,
            config.elite_fraction,
            config.noise_decay,
            config.noise_floor,
        )
        return distribution, actors_from(optimizer, distribution, unravel, key)

    return actors_from, next_generation


def generation_scalars(evaluation: Evaluation, distribution, generation: int) -> dict:
    """What a generation's end logs: the mean's return, the best sample's, the distribution's
    mean variance and added noise, and the generation."""
    sample_returns = np.asarray(evaluation.returns[1:], np.float64)
    finite = sample_returns[np.isfinite(sample_returns)]
    return {
        "cemrl/mean_return": float(evaluation.returns[MEAN_MEMBER]),
        "cemrl/best_sample_return": float(finite.max()) if finite.size else float("nan"),
        "cemrl/mean_variance": float(jnp.mean(distribution.variance)),
        "cemrl/noise": float(distribution.noise),
        "cemrl/generation": generation,
    }


def make_cemrl(size: int, config, evaluation_interval: int):
    """`config`: a `CEMRLConfig`; `size`: 1 (the mean) + an even number of samples."""
    samples = size - 1
    if size < 3 or samples % 2:
        raise ValueError(
            f"cemrl needs population.size = 1 (the CEM mean) + an even number of mirrored "
            f"samples, e.g. 11; got {size}"
        )
    trained = trained_mask(size, config.trained_fraction)
    actors_from, next_generation = generations(config, samples)

    def init_states(agent, key, hparams):
        # One program, not the ~50 small ones its operations made run one by one (~0.4 s of
        # a warm CPU start); its targets are separate buffers (copy_tree) as before.
        initial = rarely_run_jit(functools.partial(initial_arrays, agent))
        states, distribution = initial(key, hparams)
        return states, CEMRLState(distribution, 0)

    def initial_arrays(agent, key, hparams):
        init_key, sample_key = jax.random.split(key)
        states = shared_critic.init(agent, init_key, hparams, trained)
        mean, unravel = ravel_pytree(population.member(states.actors, MEAN_MEMBER))
        distribution = cem.init(mean, config.initial_variance, config.initial_noise)
        actors, opts = actors_from(agent.internals.optimizer, distribution, unravel, sample_key)
        states = states._replace(
            actors=actors, target_actors=population.copy_tree(actors), actor_opts=opts
        )
        return states, distribution

    def make_update(plan):
        return shared_critic.make_update(plan)

    def step(agent, state: CEMRLState, evaluation: Evaluation, states, observations, key):
        del observations
        returns = jnp.asarray(evaluation.returns, jnp.float32)
        distribution, (actors, opts) = next_generation(
            agent.internals.optimizer, state.distribution, states.actors, returns[1:], key
        )
        # Copies: the update donates the state, and one buffer cannot be donated twice.
        states = states._replace(
            actors=actors, target_actors=population.copy_tree(actors), actor_opts=opts
        )
        scalars = generation_scalars(evaluation, distribution, state.generation + 1)
        return CEMRLState(distribution, state.generation + 1), states, scalars, []

    return shared_critic.strategy("cemrl", evaluation_interval, init_states, make_update, step)


def check_size(r, c) -> None:
    """1 (the CEM mean) + an even number of mirrored samples."""
    size = c.population.size
    if size < 3 or size % 2 == 0:
        r.fail(
            "population.size",
            f"cemrl needs 1 (the CEM mean) + an even number of mirrored samples, e.g. 11; "
            f"got {size}",
        )


ENTRY = StrategyEntry(
    name="cemrl",
    make=lambda setting: make_cemrl(
        setting.population.size, setting.section, setting.section.generation_steps
    ),
    config_type=CEMRLConfig,
    check=check_size,
    shared_critic=True,
    replayable=False,
    mean_member=MeanMember(MEAN_MEMBER, "CEM mean"),
    devices_note=" (cemrl's size is 1 + an even number: use an odd device count)",
)
