"""What a run checkpoint holds, and the rules for continuing a run from one.

    arrays.npz     learner: member states (stacked), hparams, PRNG key, the strategy's arrays
                   (CEM-RL's mean and variance), the replay buffers when checkpoint.replay;
                   pending: the policy snapshots handed to the evaluator whose results were not
                   in yet (resent on resume, so no evaluation row goes missing)
    manifest.json  metadata: the resolved config, the learner's counters (updates, rate
                   limiter), the strategy's plain-number state (PBT history, DvD bandit, ...),
                   the run's clock and counters, and the byte length of every log file

`capture` takes both from a Run, `template` is what restoring one needs, `apply` puts a
not-yet-started Run where the checkpoint left it. Strategy states are NamedTuples of plain
numbers and arrays: `split_strategy_state` takes the arrays out (into the npz) and leaves
JSON-ready data; `join_strategy_state` puts them back against the state a fresh run starts
from, which supplies the types (both in `fastpop.strategies.codec`, imported here for callers).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from fastpop import config as config_lib
from fastpop.collect.evaluator import META_FIELD
from fastpop.schema import ConfigError
from fastpop.strategies.codec import join_strategy_state, split_strategy_state  # noqa: F401

if TYPE_CHECKING:
    from fastpop.train import Run

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


def capture(run: Run, reason: str) -> tuple[dict, dict]:
    """(tree, metadata) of a checkpoint of `run` as it is now."""
    pending = sorted(run.pending_evals)
    with_replay = run.config.checkpoint.replay
    tree = {
        "learner": run.learner.saved_tree(with_replay),
        "pending": [run.pending_evals[index][0] for index in pending],
    }
    counters = {
        "reason": reason,
        "member_env_steps": run.member_env_steps,
        "elapsed": run.elapsed(),
        "eval_index": run.eval_index,
        "next_eval": run.next_eval,
        "snapshot_env_steps": run.snapshot_env_steps,
        "learning_started_at": run.learning_started_at,
        "latest_returns": run.latest_returns.tolist(),
        "training_returns": [list(returns) for returns in run.training_returns],
        "timers": run.timers,
        "resumes": run.resumes,
        "replay_saved": with_replay,
        "pending": [{"eval_index": i, "hparams": run.pending_evals[i][1]} for i in pending],
    }
    metadata = {
        "config": config_lib.config_to_dict(run.config),
        "learner": run.learner.saved_counters(),
        "run": counters,
        "logs": run.metrics.lengths(),
    }
    return tree, metadata


def template(run: Run, metadata: dict) -> dict:
    """The tree a checkpoint of `run`'s config holds, given the checkpoint's metadata."""
    snapshot = {f"leaf_{i}": leaf for i, leaf in enumerate(run.learner.policy_leaves())}
    snapshot[META_FIELD] = np.zeros(4, np.float64)
    counters = metadata["run"]
    return {
        "learner": run.learner.saved_tree(counters["replay_saved"]),
        "pending": [snapshot] * len(counters["pending"]),
    }


def apply(run: Run, tree: dict, metadata: dict) -> None:
    """Put `run` (not started yet) where the checkpoint left it."""
    run.learner.restore(tree["learner"], metadata["learner"])
    counters = metadata["run"]
    run.start = time.monotonic() - counters["elapsed"]  # wall time continues from the total
    run.last_progress = run.start
    run.eval_index, run.next_eval = counters["eval_index"], counters["next_eval"]
    run.snapshot_env_steps = counters["snapshot_env_steps"]
    run.learning_started_at = counters["learning_started_at"]
    run.latest_returns = np.array(counters["latest_returns"], np.float64)
    run.training_returns = [deque(r, maxlen=10) for r in counters["training_returns"]]
    run.timers |= counters["timers"]
    run.resumes = counters["resumes"] + 1
    run.pending_evals = {
        entry["eval_index"]: (arrays, entry["hparams"])
        for entry, arrays in zip(counters["pending"], tree["pending"], strict=True)
    }
    run.last_checkpoint = (counters["elapsed"], run.member_env_steps)


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
