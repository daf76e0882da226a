"""What a run checkpoint holds, and the rules for continuing a run from one.

    arrays.npz     learner: member states (stacked), hparams, PRNG key, the strategy's arrays
                   (CEM-RL's mean and variance), the replay buffers when checkpoint.replay;
                   pending: the policy snapshots handed to the evaluator whose results were not
                   in yet (resent on resume, so no evaluation row goes missing)
    manifest.json  metadata: the resolved config, the learner's counters (updates, rate
                   limiter), the strategy's plain-number state (PBT history, DvD bandit, ...),
                   the run's clock and counters, and the byte length of every log file

`capture` takes both from the parts of a run that save their state (`RunState`), `template` is
what restoring them needs, `restore` puts a not-yet-started run's parts where the checkpoint left
them: the learner and the collection restore their own state, the run's progress and pending
evaluations are restored in place (the loop's other parts hold them). Strategy states are
NamedTuples of plain numbers and arrays: `split_strategy_state` takes the arrays out (into the
npz) and leaves JSON-ready data; `join_strategy_state` puts them back against the state a fresh
run starts from, which supplies the types (both in `fastpop.strategies.codec`, imported here for
callers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from fastpop import config as config_lib
from fastpop.collect import snapshot
from fastpop.collect.sources import Collection
from fastpop.learn.learner import Learner
from fastpop.run.progress import PendingEvaluations, RunProgress
from fastpop.schema import ConfigError


class RunState(NamedTuple):
    """The parts of a run a checkpoint saves and restores (`fastpop.run.loop.Run`'s)."""

    config: config_lib.Config
    learner: Learner
    collection: Collection
    progress: RunProgress
    pending: PendingEvaluations  # the snapshots the evaluator has not answered yet


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


def capture(state: RunState, reason: str, log_lengths: dict) -> tuple[dict, dict]:
    """(tree, metadata) of a checkpoint of the run's `state` as it is now; `log_lengths`: the
    bytes written so far to each of its log files (`MetricsWriter.lengths`)."""
    config, learner = state.config, state.learner
    with_replay = config.checkpoint.replay
    pending_arrays, pending_data = state.pending.saved()
    tree = {
        "learner": learner.saved_tree(with_replay),
        "collection": state.collection.saved(),  # device mode: env states and their key
        "pending": pending_arrays,
    }
    counters = state.progress.saved() | {
        "reason": reason,
        "member_env_steps": learner.member_env_steps,
        "replay_saved": with_replay,
        "pending": pending_data,
    }
    metadata = {
        "config": config_lib.config_to_dict(config),
        "learner": learner.saved_counters(),
        "run": counters,
        "logs": log_lengths,
    }
    return tree, metadata


def template(state: RunState, metadata: dict) -> dict:
    """The tree a checkpoint of the run's config holds, given the checkpoint's metadata."""
    counters = metadata["run"]
    pending = snapshot.layout(state.learner.policy_leaves())
    return {
        "learner": state.learner.saved_tree(counters["replay_saved"]),
        "collection": state.collection.saved(),
        "pending": [pending] * len(counters["pending"]),
    }


def restore(state: RunState, tree: dict, metadata: dict) -> None:
    """Restores the run's `state` (not started yet) to where the checkpoint left it: its
    learner and collection, then its progress and pending evaluations, in place."""
    state.learner.restore(tree["learner"], metadata["learner"])
    state.collection.restore(tree.get("collection", {}))
    counters = metadata["run"]
    state.progress.continue_from(counters, state.learner.member_env_steps)
    state.pending.restore(tree["pending"], counters["pending"])


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
