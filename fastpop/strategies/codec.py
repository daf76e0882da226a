"""A strategy's state as checkpoint data: arrays for the npz, the rest as plain JSON data.

Strategy states are NamedTuples of plain numbers, tuples and arrays (PBT's history, DvD's
bandit, CEM-RL's mean and variance). `split_strategy_state` takes the arrays out, in field
order, and leaves JSON-ready data with None where each array was; `join_strategy_state` puts
them back against the state a fresh run starts from, which supplies the record types.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np


def _is_array(value: Any) -> bool:
    return isinstance(value, jax.Array | np.ndarray)


def _is_record(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


def split_strategy_state(state: Any) -> tuple[list, Any]:
    """(arrays in field order, the rest as plain JSON data with None where an array was)."""
    arrays: list = []

    def plain(value):
        if _is_array(value):
            arrays.append(value)
            return None
        if _is_record(value):
            return {name: plain(item) for name, item in zip(value._fields, value, strict=True)}
        if isinstance(value, tuple | list):
            return [plain(item) for item in value]
        if isinstance(value, np.generic):
            return value.item()
        return value

    return arrays, plain(state)


def join_strategy_state(template: Any, arrays: Sequence, data: Any) -> Any:
    """The inverse of `split_strategy_state`; `template` (a fresh strategy state) gives the
    record types and where the arrays go. Lists become tuples, as strategies keep them."""
    remaining = iter(arrays)

    def tuples(value):
        return tuple(tuples(v) for v in value) if isinstance(value, list) else value

    def build(template, value):
        if _is_array(template):
            return next(remaining)
        if _is_record(template):
            return type(template)(**{n: build(getattr(template, n), value[n]) for n in value})
        if isinstance(template, tuple):
            return tuples(value)
        if isinstance(template, float) and value is None:
            return math.nan
        return value

    return build(template, data)
