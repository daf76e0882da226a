"""What a run checkpoint holds, and the rules for continuing a run from one.

    arrays.npz     learner: member states (stacked), hparams, PRNG key, the strategy's arrays
                   (CEM-RL's mean and variance), the replay buffers when checkpoint.replay;
                   pending: the policy snapshots handed to the evaluator whose results were not
                   in yet (resent on resume, so no evaluation row goes missing)
    manifest.json  metadata: the resolved config, the learner's counters (updates, rate
                   limiter), the strategy's plain-number state (PBT history, DvD bandit, ...),
                   the run's clock and counters, and the byte length of every log file

`capture` takes both from a Run, `template` is what restoring one needs, `restore` puts a
not-yet-started Run's learner and collection where the checkpoint left them and returns the
progress and pending evaluations the Run adopts. Strategy states are NamedTuples of plain
numbers and arrays: `split_strategy_state` takes the arrays out (into the npz) and leaves
JSON-ready data; `join_strategy_state` puts them back against the state a fresh run starts
from, which supplies the types (both in `fastpop.strategies.codec`, imported here for callers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Protocol

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.collect.sources import Collection
from fastpop.learn.learner import Learner
from fastpop.run.evaluation_rounds import EvaluationRounds
from fastpop.run.metrics import MetricsWriter
from fastpop.run.progress import PendingEvaluations, RunProgress
from fastpop.schema import ConfigError


class Run(Protocol):
    """What a checkpoint reads from and restores into (`fastpop.run.loop.Run`)."""

    config: config_lib.Config
    learner: Learner
    collection: Collection
    progress: RunProgress
    evaluations: EvaluationRounds  # its `pending` snapshots are saved
    metrics: MetricsWriter
    member_env_steps: int


# Fields a resume may change with --set: they change how long and how observably the run goes
# on, never the shape or meaning of the saved state.
SAFE_ON_RESUME = (
    "train.total_env_steps",
    "train.max_wall_seconds",
    "train.compile_cache",
    "checkpoint.interval_seconds",
    "checkpoint.interval_env_steps",
    "checkpoint.keep",
    "checkpoint.replay",
    "collect.num_collectors",
    "collect.max_restarts",
    "log.progress_interval_seconds",
    "log.tensorboard",
    "log.wandb",
    "log.wandb_project",
    "log.wandb_entity",
    "population.devices",  # checkpoints hold plain stacked arrays: any device count resumes
)


def capture(run: Run, reason: str) -> tuple[dict, dict]:
    """(tree, metadata) of a checkpoint of `run` as it is now."""
    with_replay = run.config.checkpoint.replay
    pending_arrays, pending_data = run.evaluations.pending.saved()
    tree = {
        "learner": run.learner.saved_tree(with_replay),
        "collection": run.collection.saved(),  # device mode: env states and their key
        "pending": pending_arrays,
    }
    counters = run.progress.saved() | {
        "reason": reason,
        "member_env_steps": run.member_env_steps,
        "replay_saved": with_replay,
        "pending": pending_data,
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
    counters = metadata["run"]
    pending = snapshot.layout(run.learner.policy_leaves())
    return {
        "learner": run.learner.saved_tree(counters["replay_saved"]),
        "collection": run.collection.saved(),
        "pending": [pending] * len(counters["pending"]),
    }


class Restored(NamedTuple):
    """The run's own state as a checkpoint left it (what `RunCheckpoints.restore` adopts)."""

    progress: RunProgress
    pending: PendingEvaluations


def restore(run: Run, tree: dict, metadata: dict) -> Restored:
    """Restores `run`'s learner and collection (not started yet) to where the checkpoint left
    them; returns the run's progress and pending evaluations as they were."""
    run.learner.restore(tree["learner"], metadata["learner"])
    run.collection.restore(tree.get("collection", {}))
    counters = metadata["run"]
    size = run.config.population.size
    progress = RunProgress.restored(counters, size, run.member_env_steps)
    return Restored(progress, PendingEvaluations.restored(tree["pending"], counters["pending"]))


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
