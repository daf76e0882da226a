"""Population-based training (Jaderberg et al., 2017): truncation selection, exploit, explore.

Selection and exploration are host-side arithmetic on a handful of numbers per member; exploit
is one index gather over the whole stacked member state on device (networks, targets,
optimizer moments, step counters), so a copied member is the source member, not just its actor.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fastpop import population
from fastpop.strategies.priors import Prior


class Exploit(NamedTuple):
    target: int
    source: int


def rank(fitness: np.ndarray) -> np.ndarray:
    """Members from best to worst; non-finite fitness ranks last; ties keep member order."""
    fitness = np.asarray(fitness, np.float64)
    keyed = np.where(np.isfinite(fitness), -fitness, np.inf)
    return np.argsort(keyed, kind="stable")


def selection_sizes(size: int, bottom_fraction: float, top_fraction: float) -> tuple[int, int]:
    """(members replaced, members copied from); refuses fractions that select nobody."""
    if size < 2:
        raise ValueError(f"PBT needs a population of at least 2 members, got {size}")
    bottom, top = math.floor(bottom_fraction * size), math.floor(top_fraction * size)
    if bottom < 1 or top < 1:
        raise ValueError(
            f"pbt.bottom_fraction {bottom_fraction} and pbt.top_fraction {top_fraction} of "
            f"{size} members select {bottom} to replace and {top} to copy from; both must be "
            f">= 1 member (raise the fractions to at least {1 / size:.3g})"
        )
    if bottom + top > size:
        raise ValueError(
            f"pbt.bottom_fraction + pbt.top_fraction must be <= 1, got "
            f"{bottom_fraction} + {top_fraction}"
        )
    return bottom, top


def truncation_selection(
    fitness: np.ndarray, bottom_fraction: float, top_fraction: float, rng: np.random.Generator
) -> list[Exploit]:
    """The bottom members each copy a member drawn uniformly from the top ones.

    A member with non-finite fitness is always replaced, even beyond the bottom fraction.
    """
    fitness = np.asarray(fitness, np.float64)
    order = rank(fitness)
    bottom, top = selection_sizes(len(fitness), bottom_fraction, top_fraction)
    broken = int(np.sum(~np.isfinite(fitness)))
    targets = order[len(order) - max(bottom, broken) :]
    sources = [member for member in order[:top] if np.isfinite(fitness[member])]
    if not sources:
        return []  # nobody to copy from: every member is broken
    picks = rng.integers(len(sources), size=len(targets))
    return [Exploit(int(t), int(sources[p])) for t, p in zip(targets, picks, strict=True)]


def explore(
    values: dict[str, float],
    priors: dict[str, Prior],
    rng: np.random.Generator,
    perturb_factors: tuple[float, float] = (0.8, 1.2),
    resample_probability: float = 0.25,
) -> dict[str, float]:
    """Each hparam with a prior is resampled (with `resample_probability`) or multiplied by one
    of `perturb_factors`; results stay inside the prior and integers stay integers."""
    explored = dict(values)
    for name, prior in priors.items():
        if rng.uniform() < resample_probability:
            explored[name] = prior.sample(rng)
        else:
            factor = perturb_factors[int(rng.integers(len(perturb_factors)))]
            perturbed = values[name] * factor
            if prior.integer and round(perturbed) == values[name]:
                # x0.8 / x1.2 of a small integer rounds back to itself: move by one instead.
                perturbed = values[name] + (1 if factor > 1 else -1)
            explored[name] = prior.clip(perturbed)
        if prior.integer:
            explored[name] = int(explored[name])
    return explored


def exploit_indices(size: int, exploits: list[Exploit]) -> jnp.ndarray:
    """indices[i] = the member whose state member i takes (itself unless it is a target)."""
    indices = np.arange(size)
    for exploit in exploits:
        indices[exploit.target] = exploit.source
    return jnp.asarray(indices)


def apply_exploits(stacked_tree, exploits: list[Exploit]):
    """Every leaf of each target member replaced by its source's; others untouched."""
    if not exploits:
        return stacked_tree
    size = population.population_size(stacked_tree)
    return population.gather(stacked_tree, exploit_indices(size, exploits))
