"""The run directory of `fastpop train` / `pbt-replay`: refused when it holds something, and with
--overwrite replaced only when fastpop wrote everything in it (never a user's files, never a live
run, never the working directory)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from fastpop.analysis.lineage import HPARAMS_PLOT
from fastpop.analysis.plot import STEPS_PLOT, WALLTIME_PLOT
from fastpop.analysis.plot_aggregate import (
    AGGREGATE_STEPS_PLOT,
    AGGREGATE_WALLTIME_PLOT,
    PROFILE_PLOT,
)
from fastpop.commands.pbt_replay import COMPARISON_PLOT
from fastpop.config import ConfigError
from fastpop.run import run_files
from fastpop.run.loop import CHECKPOINTS_DIR, CONFIG_FILE
from fastpop.run.resume import is_run_directory, lock_run_directory
from fastpop.run.trackers import HPARAMS_DIR, WANDB_FILE

TENSORBOARD_PREFIX = "events.out.tfevents."
# Everything fastpop writes at the top of a run directory (the run, its plots, its trackers).
RUN_ENTRIES = frozenset(
    {
        CONFIG_FILE,
        CHECKPOINTS_DIR,
        run_files.METRICS_FILE,
        run_files.SCALARS_FILE,
        run_files.EVENTS_FILE,
        run_files.LINEAGE_FILE,
        run_files.MEMBERS_FILE,
        run_files.SUMMARY_FILE,
        HPARAMS_DIR,
        WANDB_FILE,
        "wandb",  # W&B's own files (offline runs)
        "processes",  # a distributed run's other processes (multihost.PROCESSES_DIR)
        WALLTIME_PLOT,
        STEPS_PLOT,
        HPARAMS_PLOT,
        AGGREGATE_WALLTIME_PLOT,
        AGGREGATE_STEPS_PLOT,
        PROFILE_PLOT,
        COMPARISON_PLOT,
    }
)
RUN_MEANING = (
    f"a fastpop run directory holds {CONFIG_FILE} and {run_files.METRICS_FILE} or "
    f"{CHECKPOINTS_DIR}/, and only files fastpop writes there"
)


def foreign_entries(path: Path) -> list[str]:
    """The entries of `path` fastpop does not write in a run directory, sorted."""
    return sorted(
        entry.name
        for entry in path.iterdir()
        if entry.name not in RUN_ENTRIES and not entry.name.startswith(TENSORBOARD_PREFIX)
    )


def _named(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check(run_dir: Path, overwrite: bool, resume_hint: str = "") -> None:
    """Raise ConfigError (nothing touched) unless `run_dir` is absent, empty, or, with
    `overwrite`, a run directory that fastpop may replace (`RUN_MEANING`)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"run directory {run_dir} is a file; choose another --out")
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    cwd = Path.cwd().resolve()
    if overwrite and (run_dir.resolve() == cwd or run_dir.resolve() in cwd.parents):
        raise ConfigError(
            f"--overwrite: run directory {run_dir} is the working directory or holds it; "
            "nothing was deleted. Choose another --out"
        )
    if not is_run_directory(run_dir):
        raise ConfigError(
            f"run directory {run_dir} already exists and is not a fastpop run ({RUN_MEANING}); "
            f"it holds {_named(sorted(e.name for e in run_dir.iterdir()))}. Nothing was "
            "deleted; choose another --set name=... or --out"
        )
    if not overwrite:
        raise ConfigError(
            f"run directory {run_dir} already exists; choose another --set name=... or --out, "
            f"pass --overwrite, or continue it with `fastpop resume {run_dir}{resume_hint}`"
        )
    if foreign := foreign_entries(run_dir):
        raise ConfigError(
            f"--overwrite: run directory {run_dir} is a fastpop run but also holds "
            f"{_named(foreign)}, which fastpop did not write; nothing was deleted. Move "
            "them out of it, or choose another --out"
        )


def hold(run_dir: Path, overwrite: bool) -> int | None:
    """The lock of an existing run directory `overwrite` replaces (ConfigError when a live run
    holds it), taken before anything is built; None when there is none to replace."""
    if overwrite and run_dir.is_dir() and any(run_dir.iterdir()):
        return lock_run_directory(run_dir)
    return None


def replace(run_dir: Path, descriptor: int | None) -> int:
    """Empty the run directory `hold` locked (or make `run_dir`) and return the descriptor
    that locks it for the run. The directory itself stays, so the lock does too. Raises
    ConfigError, nothing deleted, if something fastpop does not write came in since `check`."""
    if descriptor is None:
        run_dir.mkdir(parents=True, exist_ok=True)
        return lock_run_directory(run_dir)
    check(run_dir, overwrite=True)  # again, under the lock: nothing new came in meanwhile
    for entry in run_dir.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return descriptor


def release(descriptor: int | None) -> None:
    if descriptor is not None:
        os.close(descriptor)
