"""What a run checkpoint holds, and the rules for continuing a run from one.

    arrays.npz     learner: member states (stacked), hparams, PRNG key, the strategy's arrays
                   (CEM-RL's mean and variance), the replay buffers when checkpoint.replay;
                   pending: the policy snapshots handed to the evaluator whose results were not
                   in yet (resent on resume, so no evaluation row goes missing)
    manifest.json  metadata: the resolved config, the learner's counters (updates, rate
                   limiter), the strategy's plain-number state (PBT history, DvD bandit, ...),
                   the run's clock and counters, and the byte length of every log file

Strategy states are NamedTuples of plain numbers and arrays. `split_strategy_state` takes the
arrays out (into the npz) and leaves JSON-ready data; `join_strategy_state` puts them back
against the state a fresh run starts from, which supplies the types.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.schema import ConfigError

# Fields a resume may change with --set: they change how long and how observably the run goes
# on, never the shape or meaning of the saved state.
SAFE_ON_RESUME = (
    "train.total_env_steps",
    "train.max_wall_seconds",
    "checkpoint.interval_seconds",
    "checkpoint.interval_env_steps",
    "checkpoint.keep",
    "checkpoint.replay",
    "collect.num_collectors",
    "collect.max_restarts",
    "log.progress_interval_seconds",
    "log.tensorboard",
)


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


def resume_config(saved: dict, overrides: Sequence[str], source: str) -> config_lib.Config:
    """The saved config with the --set changes a resume allows; a --set of any other field is
    refused with a ConfigError naming it and what may change."""
    for text in overrides:
        name = text.partition("=")[0].strip()
        if name not in SAFE_ON_RESUME:
            raise ConfigError(
                f"--set {name}: cannot change on resume (the checkpoint's state was made for "
                f"its value). A resume may change: {', '.join(SAFE_ON_RESUME)}"
            )
    return config_lib.config_from_dict(saved, source, overrides)


def with_small_replay(config: config_lib.Config) -> config_lib.Config:
    """The config with the smallest replay it accepts: for loading member states only (eval),
    without allocating the run's buffers."""
    lanes = config.collect.envs_per_member
    capacity = max(config.collect.chunk_len, 2) * lanes
    replay = dataclasses.replace(config.replay, capacity=capacity, min_size=1)
    return dataclasses.replace(config, replay=replay)
