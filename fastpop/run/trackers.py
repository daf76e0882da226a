"""Trackers beside a run's files: TensorBoard's HParams view and Weights & Biases.

A `MetricsWriter` hands each of them what it writes (fastpop.run.metrics.Tracker); the JSONL files
stay the record of the run, and a tracker that fails is dropped without stopping it.

- `HParamsSessions` (log.tensorboard): whenever the run stops, one TensorBoard HParams session
  per member in <run>/hparams/member_<i>: its initial hparams (members.json; final ones as
  final_<name> where a strategy changed them) against its final and best return.
- `WandbRun` (log.wandb): one W&B run per fastpop run, its id kept in <run>/wandb.json so that a
  resume continues it. Every series is logged against `env_steps` (the population's, as in
  TensorBoard): member_<i>/return_mean and the rest of each evaluation row, member_<i>/hparams/*,
  population/best_return and median_return, the learner scalars, member_<i>/lineage/*. The run's
  config is the resolved fastpop config; when the run stops, `members` (the table above) and
  `lineage` (lineage.jsonl) are logged as tables and the headline numbers go to the summary.
  A W&B run started for a run directory that already has rows (W&B enabled on a resume, or a
  first attempt that could not start) is first sent everything logged so far.
"""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np

from fastpop import config as config_lib
from fastpop.run.metrics import Tracker, evaluation_scalars, lineage_scalars
from fastpop.run.run_files import (
    LINEAGE_FILE,
    MEMBERS_FILE,
    METRICS_FILE,
    SCALARS_FILE,
    evaluation_rounds,
    read_jsonl,
    read_metrics,
    summarize,
)
from fastpop.schema import ConfigError

HPARAMS_DIR = "hparams"  # <run>/hparams/member_<i>: TensorBoard HParams sessions
WANDB_FILE = "wandb.json"  # the W&B run id (and project, entity) a resume continues
RETURNS = ("final_return", "best_return")
LINEAGE_COLUMNS = ("wall_time", "env_steps", "strategy", "kind", "target", "source")
LINEAGE_COLUMNS += ("target_fitness", "source_fitness", "old_hparams", "new_hparams")
_NOT_IN_NAMES = "/\\#?%:"  # characters W&B refuses in project and entity names


def _installed(module: str) -> bool:
    if module in sys.modules:
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_trackers(log: config_lib.LogConfig) -> None:
    """Refuse (ConfigError) trackers of `log` that cannot run here, before a run starts."""
    if log.wandb is None:
        return
    if not _installed("wandb"):
        raise ConfigError(
            f"log.wandb: {log.wandb!r} needs the wandb package, which is not installed; "
            "pip install -e '.[wandb]' (or set log.wandb: null)"
        )
    names = {"log.wandb_project": log.wandb_project, "log.wandb_entity": log.wandb_entity}
    for dotted, name in names.items():
        if name is not None and (not name or len(name) > 128 or set(name) & set(_NOT_IN_NAMES)):
            raise ConfigError(
                f"{dotted}: must be a W&B name of 1 to 128 characters without any of "
                f"{' '.join(_NOT_IN_NAMES)}, got {name!r}"
            )


def open_trackers(config: config_lib.Config, run_dir: Path) -> list[Tracker]:
    """The trackers `config.log` asks for (see `check_trackers` for what is refused)."""
    trackers: list[Tracker] = []
    if config.log.tensorboard:
        trackers.append(HParamsSessions(run_dir))
    if config.log.wandb is not None:
        try:
            trackers.append(WandbRun(config, run_dir))
        except Exception as error:  # no API key, no network: the files are still written
            warnings.warn(
                f"W&B could not start ({error!r}); this run logs to its files only. A later "
                f"`fastpop resume {run_dir}` sends W&B everything logged so far",
                stacklevel=2,
            )
    return trackers


def member_results(run_dir: Path) -> list[dict]:
    """One flat row per evaluated member: `member` (and members.json's other indices, such as
    `config_index` and `seed_index`), its initial hparams, its hparams at its last evaluation as
    final_<name> where a strategy changed any member's, and `final_return` and `best_return`
    (the return of its last evaluation, its best one); [] before the first evaluation."""
    run_dir = Path(run_dir)
    rows = read_metrics(run_dir) if (run_dir / METRICS_FILE).exists() else []
    if not rows:
        return []
    final = {entry["member"]: entry for entry in summarize(rows)["ranking"]}
    members_file = run_dir / MEMBERS_FILE
    listed = json.loads(members_file.read_text())["members"] if members_file.exists() else []
    initial = {int(entry["member"]): entry for entry in listed}
    for row in rows:  # without members.json: a member's first evaluated hparams
        initial.setdefault(int(row["member"]), {"hparams": row["hparams"]})
    changed = any(final[m]["hparams"] != initial[m]["hparams"] for m in final)
    results = []
    for member in sorted(final):
        entry = initial[member]
        flat = {k: v for k, v in entry.items() if k != "hparams"} | {"member": member}
        flat |= {name: _shortest(v) for name, v in entry["hparams"].items()}
        if changed:
            final_hparams = final[member]["hparams"].items()
            flat |= {f"final_{name}": _shortest(v) for name, v in final_hparams}
        flat |= {name: final[member][name] for name in RETURNS}
        results.append(flat)
    return results


def _shortest(value):
    """A float32 hparam as its shortest spelling (3e-4, not 0.0003000000142492354)."""
    if isinstance(value, float) and math.isfinite(value) and float(np.float32(value)) == value:
        return float(str(np.float32(value)))
    return value


class HParamsSessions:
    """TensorBoard's HParams view of the population, rewritten whenever the run stops."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def log_evaluation(self, rows: list[dict]) -> None:
        pass

    def log_scalars(self, step: int, values: dict) -> None:
        pass

    def log_lineage(self, events: list[dict]) -> None:
        pass

    def close(self, failed: bool) -> None:
        write_hparams_sessions(self.run_dir)


def write_hparams_sessions(run_dir: Path) -> list[Path]:
    """<run>/hparams/member_<i> for each evaluated member (replacing earlier ones): one HParams
    session with `member_results` as hparams and hparam/final_return, hparam/best_return as
    metrics. Nothing without tensorboardX (the MetricsWriter has warned) or evaluations."""
    try:
        from tensorboardX import SummaryWriter
        from tensorboardX.summary import hparams
    except ImportError:
        return []
    results = member_results(run_dir)
    root = Path(run_dir) / HPARAMS_DIR
    if root.exists():
        shutil.rmtree(root)
    paths = []
    for flat in results:
        values = {k: v for k, v in flat.items() if k not in RETURNS and _session_value(v)}
        metrics = {f"hparam/{name}": _float(flat[name]) for name in RETURNS}
        path = root / f"member_{flat['member']}"
        with SummaryWriter(logdir=str(path)) as writer:
            for summary in hparams(values, metrics):
                writer.file_writer.add_summary(summary)
            for tag, value in metrics.items():
                writer.add_scalar(tag, value, 0)
        paths.append(path)
    return paths


def _session_value(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, bool | int | str)


def _float(value) -> float:
    return math.nan if value is None else float(value)


class WandbRun:
    """One Weights & Biases run mirroring a fastpop run (see the module docstring)."""

    def __init__(self, config: config_lib.Config, run_dir: Path):
        import wandb

        self.run_dir, log = Path(run_dir), config.log
        id_file = self.run_dir / WANDB_FILE
        saved = json.loads(id_file.read_text()) if id_file.exists() else None
        self.run = wandb.init(
            project=log.wandb_project,
            entity=log.wandb_entity,
            mode=log.wandb,
            id=saved["id"] if saved else None,  # None: W&B draws one
            resume="allow",
            name=config.name,
            dir=str(self.run_dir),  # offline runs: <run>/wandb/offline-run-*
            config=config_lib.config_to_dict(config),
        )
        try:
            self.run.define_metric("env_steps")
            self.run.define_metric("*", step_metric="env_steps")
            if saved is None:
                self._send_logged_so_far()
        except BaseException:
            self.run.finish(exit_code=1)
            raise
        record = {"id": self.run.id, "project": log.wandb_project, "entity": log.wandb_entity}
        id_file.write_text(json.dumps(record) + "\n")  # after the backfill: it is complete

    def _send_logged_so_far(self) -> None:
        if (self.run_dir / METRICS_FILE).exists():
            for rows in evaluation_rounds(read_metrics(self.run_dir)):
                self.log_evaluation(rows)
        if (self.run_dir / SCALARS_FILE).exists():
            for row in read_jsonl(self.run_dir / SCALARS_FILE):
                self.log_scalars(row.pop("step"), row)
        if (self.run_dir / LINEAGE_FILE).exists():
            self.log_lineage(read_jsonl(self.run_dir / LINEAGE_FILE))

    def log_evaluation(self, rows: list[dict]) -> None:
        step, scalars = evaluation_scalars(rows)
        wall_time = max(float(row["wall_time"]) for row in rows)
        self.run.log({"env_steps": step, "wall_time": wall_time, **scalars})

    def log_scalars(self, step: int, values: dict) -> None:
        numbers = {k: float(v) for k, v in values.items() if isinstance(v, int | float)}
        self.run.log({"env_steps": int(step), **numbers})

    def log_lineage(self, events: list[dict]) -> None:
        by_step: dict[int, dict] = {}
        for event in events:
            step, scalars = lineage_scalars(event)
            by_step.setdefault(step, {}).update(scalars)
        for step, scalars in sorted(by_step.items()):
            self.run.log({"env_steps": step, **scalars})

    def close(self, failed: bool) -> None:
        import wandb

        try:
            tables = {}
            if results := member_results(self.run_dir):
                columns = list(dict.fromkeys(name for flat in results for name in flat))
                data = [[flat.get(name) for name in columns] for flat in results]
                tables["members"] = wandb.Table(columns=columns, data=data)
                summary = summarize(read_metrics(self.run_dir))
                for name in ("best_member", "best_return", "median_return", "evaluations"):
                    self.run.summary[name] = summary[name]
            if (self.run_dir / LINEAGE_FILE).exists() and (
                events := read_jsonl(self.run_dir / LINEAGE_FILE)
            ):
                data = [[_cell(event.get(name)) for name in LINEAGE_COLUMNS] for event in events]
                tables["lineage"] = wandb.Table(columns=list(LINEAGE_COLUMNS), data=data)
            if tables:
                self.run.log(tables)
        finally:
            self.run.finish(exit_code=1 if failed else 0)


def _cell(value):
    """A lineage table cell: hparams as JSON text (W&B tables want one type per column)."""
    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value
