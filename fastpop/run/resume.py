"""Continuing a run: `fastpop resume` finds the newest usable checkpoint, checks the --set
changes, and builds a `Run` standing where the checkpoint left it; a lock keeps two processes
from writing one run directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from fastpop import config as config_lib
from fastpop.run import checkpoint, run_files, run_state
from fastpop.run.loop import CHECKPOINTS_DIR, CONFIG_FILE, Run
from fastpop.run.parts import build_run


def is_run_directory(path: Path) -> bool:
    """`path` holds a run fastpop started: its config and its metrics or checkpoints."""
    return (path / CONFIG_FILE).is_file() and (
        (path / run_files.METRICS_FILE).is_file() or (path / CHECKPOINTS_DIR).is_dir()
    )


def lock_run_directory(run_dir: Path) -> int:
    """Hold `run_dir` for this process (until it exits: the kernel drops the lock even on
    SIGKILL), so that a second train --overwrite or resume cannot write into a live run.
    Returns the descriptor that holds the lock; raises ConfigError when another process does."""
    descriptor = os.open(run_dir, os.O_RDONLY)  # not inherited by the worker processes
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise config_lib.ConfigError(
            f"run directory {run_dir} is in use by another fastpop process (train or resume); "
            "stop it first (Ctrl-C writes a checkpoint), then resume"
        ) from None
    return descriptor


def _flat(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key not in ("grid", "priors"):  # those are values
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _check_config_file(path: Path, saved: dict) -> None:
    """A resume continues the checkpoint's config; an edit of the run's config.yaml would be
    ignored without a word, so one outside what a resume may change is refused instead."""
    if not path.exists():
        return
    edited = _flat(config_lib.config_to_dict(config_lib.load_config(path)))
    for name, value in _flat(saved).items():
        if edited.get(name) != value and name not in run_state.SAFE_ON_RESUME:
            raise config_lib.ConfigError(
                f"{path} was edited after the checkpoint ({name}: {value!r} there, "
                f"{edited.get(name)!r} here); a resume continues the checkpoint's config. Undo "
                f"the edit; a resume may change only {', '.join(run_state.SAFE_ON_RESUME)}, "
                "with --set"
            )


def resume_run(run_dir: Path, overrides: list[str], log=print) -> Run:
    """A Run continuing `run_dir` from its newest usable checkpoint, with the --set changes a
    resume allows. Raises CheckpointError (nothing usable) or ConfigError (a refused change, or
    nothing left to do), before any file is touched."""
    directory = Path(run_dir) / CHECKPOINTS_DIR
    candidates = checkpoint.complete_checkpoints(directory)
    if not candidates:
        raise checkpoint.CheckpointError(
            f"{run_dir}: no checkpoint to resume from ({directory} has none; a run writes one "
            "every checkpoint.interval_seconds / interval_env_steps and when it stops)"
        )
    config = None
    for path in candidates:  # the config of the newest readable manifest
        try:
            saved = checkpoint.read_manifest(path)["metadata"]["config"]
        except checkpoint.CheckpointError as error:
            log(f"skipping checkpoint: {error}")
            continue
        _check_config_file(Path(run_dir) / CONFIG_FILE, saved)
        config = run_state.resume_config(saved, overrides, str(path / checkpoint.MANIFEST))
        break
    if config is None:
        raise checkpoint.CheckpointError(f"{directory}: no checkpoint has a readable manifest")
    run = Run(build_run(config), Path(run_dir), log)
    run.checkpoints.restore_latest(log)
    train = config.train
    if run.member_env_steps >= train.total_env_steps:
        raise config_lib.ConfigError(
            f"{run_dir} is complete: {run.member_env_steps:,} of train.total_env_steps="
            f"{train.total_env_steps:,} env steps per member; to train on, resume with --set "
            "train.total_env_steps=<more>"
        )
    if train.max_wall_seconds is not None and run.elapsed() >= train.max_wall_seconds:
        raise config_lib.ConfigError(
            f"{run_dir} used its train.max_wall_seconds={train.max_wall_seconds:g} "
            f"({run.elapsed():.0f}s so far); resume with --set train.max_wall_seconds=<more>"
        )
    return run
