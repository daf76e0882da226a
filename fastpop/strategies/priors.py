"""Hyperparameter priors: where sweeps sample from and where PBT's explore must stay."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

KINDS = ("log_uniform", "uniform", "choice", "int_uniform")


class Prior(NamedTuple):
    """One hparam's prior. `low`/`high` bound uniform kinds (inclusive for int_uniform);
    `values` lists the options of a choice."""

    kind: str
    low: float = 0.0
    high: float = 0.0
    values: tuple = ()

    @property
    def integer(self) -> bool:
        return self.kind == "int_uniform" or (
            self.kind == "choice" and all(float(v).is_integer() for v in self.values)
        )

    def sample(self, rng: np.random.Generator) -> float:
        if self.kind == "log_uniform":
            return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))
        if self.kind == "uniform":
            return float(rng.uniform(self.low, self.high))
        if self.kind == "int_uniform":
            return int(rng.integers(int(self.low), int(self.high) + 1))
        return self.values[int(rng.integers(len(self.values)))]

    def clip(self, value: float):
        """Inside the prior's bounds, integer where the prior is (choices: the nearest)."""
        if self.kind == "choice":
            return min(self.values, key=lambda option: abs(float(option) - value))
        value = min(max(value, self.low), self.high)
        return round(value) if self.integer else float(value)


def parse_prior(name: str, spec: dict) -> Prior:
    """{"log_uniform": [3e-5, 3e-3]} | {"uniform": [a, b]} | {"int_uniform": [1, 5]} |
    {"choice": [...]}; raises ValueError naming the hparam and what is allowed."""
    if not isinstance(spec, dict) or len(spec) != 1:
        raise ValueError(
            f"prior of {name!r}: expected one of {', '.join(KINDS)} with its "
            f"arguments, e.g. {{log_uniform: [3e-5, 3e-3]}}, got {spec!r}"
        )
    ((kind, args),) = spec.items()
    if kind not in KINDS:
        raise ValueError(
            f"prior of {name!r}: unknown kind {kind!r}; choose from {', '.join(KINDS)}"
        )
    if kind == "choice":
        if not isinstance(args, list | tuple) or not args:
            raise ValueError(f"prior of {name!r}: choice needs a non-empty list")
        return Prior(kind, values=tuple(args))
    if not isinstance(args, list | tuple) or len(args) != 2:
        raise ValueError(f"prior of {name!r}: {kind} needs [low, high], got {args!r}")
    low, high = float(args[0]), float(args[1])
    if not low < high or (kind == "log_uniform" and low <= 0):
        raise ValueError(
            f"prior of {name!r}: need {'0 < ' if kind == 'log_uniform' else ''}"
            f"low < high, got [{low}, {high}]"
        )
    return Prior(kind, low, high)


def parse_priors(written: dict) -> dict[str, Prior]:
    """`population.priors` as written in a config (hparam -> {kind: ...}), parsed."""
    return {name: parse_prior(name, spec) for name, spec in written.items()}
