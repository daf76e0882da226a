"""How a run on this process starts: its learner and its collection made, with what can be made
ahead of the learner made beside it (`local_pieces`). The config was turned into parts before
this (fastpop.run.parts.build_run); nothing here reads the config.

    device mode     the env lanes made and the chunk's programs traced from the learner's
                    shapes and compiled, each in a thread, while the learner is made in
                    another (`DeviceCollection.make_ahead`)
    process mode    a fresh run's collector processes started before the learner is made, to
                    step their warm-up while it is (`ProcessCollection.start_ahead`), unless
                    they outnumber the cores
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from fastpop.collect.device_collection import DeviceCollection
from fastpop.collect.sources import Collection, ProcessCollection
from fastpop.learn.learner import Learner
from fastpop.machine import usable_cores
from fastpop.run.checkpoint import CheckpointStore, LocalCheckpoints
from fastpop.run.parts import RunParts
from fastpop.run.stop_signals import StopSignals


class RunPieces(NamedTuple):
    """What a run on one process and a run on one of several (fastpop.distributed) differ in."""

    learner: Learner
    collection: Collection
    signals: StopSignals
    checkpoints: CheckpointStore


def make_collection(parts: RunParts, learner: Learner, log=print) -> Collection:
    """The parts' collection for `learner`, nothing made ahead: collector processes, or envs
    stepped on the device, which decode evaluation snapshots to `learner`'s policy template."""
    if parts.device is None:
        return process_collection(parts, log)
    return DeviceCollection(parts.device, learner.policy_template())


def process_collection(parts: RunParts, log=print) -> ProcessCollection:
    """Process mode's collection, of the parts' `processes`, nothing started yet."""
    waits = parts.learner.strategy.waits_for_evaluation  # its evaluator starts early
    return ProcessCollection(parts.processes, parts.learner.replay_spec, log, waits)


def start_device(parts: RunParts) -> tuple[Learner, DeviceCollection]:
    """Device mode: the learner made in a thread while the chunk's programs are traced and
    compiled (where a run can: one device, one process), then given to the collection."""
    collection = DeviceCollection(parts.device)
    learner_ahead = collection.make_ahead(parts.learner)
    learner = Learner(parts.learner) if learner_ahead is None else learner_ahead.result()
    collection.set_policy_template(learner.policy_template())
    return learner, collection


def start_processes(
    parts: RunParts, log=print, collectors_ahead: bool = False
) -> tuple[Learner, ProcessCollection]:
    """Process mode: with `collectors_ahead`, the collectors step their warm-up while the
    learner is made, unless they outnumber the cores (16 collectors on 2 cores put the paper
    preset's first env step at 10-15 s, against 8.5-9.3 s made after the learner)."""
    collection = process_collection(parts, log)
    if collectors_ahead and parts.processes.collect.num_collectors <= usable_cores():
        collection.start_ahead(parts.learner.agent, parts.learner.hparams)
    return Learner(parts.learner), collection


def local_pieces(
    parts: RunParts, checkpoint_dir: Path, log=print, collectors_ahead: bool = False
) -> RunPieces:
    """A run on this process alone: its learner, its collection, Ctrl-C and SIGTERM acted on at
    once, checkpoints in `checkpoint_dir` (<run>/checkpoints). `collectors_ahead`: a fresh run
    (never one to restore), whose collector processes may start before the learner is made."""
    if parts.device is not None:
        learner, collection = start_device(parts)
    else:
        learner, collection = start_processes(parts, log, collectors_ahead)
    checkpoints = LocalCheckpoints(checkpoint_dir, parts.checkpoints_kept)
    return RunPieces(learner, collection, StopSignals(), checkpoints)
