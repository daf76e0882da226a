"""`fastpop train --distributed` and `fastpop resume --distributed`: start jax.distributed, build
the run on every process, let process 0 own the run directory, and end every process in
bounded time whatever happens to the others (fastpop.distributed.lockstep)."""

from __future__ import annotations

import os
from pathlib import Path

from fastpop.commands.args import fail
from fastpop.distributed import flags, lockstep
from fastpop.run.checkpoint import CheckpointError, complete_checkpoints
from fastpop.schema import ConfigError


def sharded_hint(run_dir: Path) -> str | None:
    """For a single-process resume: the run's newest checkpoint is a distributed one."""
    newest = complete_checkpoints(Path(run_dir) / "checkpoints")
    if newest and (newest[0] / "manifest").is_dir():
        return (
            f"{newest[0]} was written by a distributed run; resume it with --distributed on "
            "the same number of processes and devices"
        )
    return None


def launch(arguments: dict, body) -> int:
    """Initialize jax.distributed, run `body()` -> exit code, end this process (`finish`)."""
    import jax

    lockstep.initialize(arguments)
    lockstep.WATCHDOG.start()
    code, lost = 1, False
    try:
        code = body()
    except lockstep.ProcessLost as error:
        code, lost = fail(f"stopping: {error}", code=1), True
    except jax.errors.JaxRuntimeError as error:
        if (converted := lockstep.lost_from(error)) is None:
            raise
        code, lost = fail(f"stopping: {converted}", code=1), True
    finally:
        lockstep.finish(lost, code)
    return code


def _execute_here(run, execute, lock: int | None) -> int:
    """Process 0: `execute` (summary, ranking, plots); the others run and report their end.
    `lock`: process 0's descriptor holding the run directory, released at the end."""
    try:
        return _execute_in_process(run, execute)
    finally:
        if lock is not None:
            os.close(lock)


def _execute_in_process(run, execute) -> int:
    import jax

    if jax.process_index() == 0:
        return execute(run, run.run_dir)
    from fastpop.collect.workers import WorkerFailed
    from fastpop.run import metrics
    from fastpop.run.loop import StopRequested, TrainError

    try:
        summary = run.run()
    except (WorkerFailed, TrainError) as error:
        return fail(str(error), code=1)
    except (KeyboardInterrupt, StopRequested) as stop:
        return 143 if isinstance(stop, StopRequested) else 130
    metrics.write_summary(run.run_dir, summary)  # its own, beside its own files
    return {"interrupted": 130, "terminated": 143}.get(summary["stopped_by"], 0)


def _owner_verdict(run, run_dir: Path, overwrite: bool):
    """Process 0 prepares the run directory as `fastpop train` does; every process gets its
    verdict: (None or the error, process 0's lock descriptor)."""
    import jax

    from fastpop.commands import run_directory

    problem, descriptor = None, None
    if jax.process_index() == 0:
        try:
            run_directory.check(run_dir, overwrite, resume_hint=" --distributed")
            descriptor = run_directory.hold(run_dir, overwrite)  # never replace a live run
            descriptor = run_directory.replace(run_dir, descriptor)
        except ConfigError as error:
            run_directory.release(descriptor)
            descriptor, problem = None, str(error)
    return run.lockstep.exchange(problem)[0], descriptor


def train(args, arguments: dict, execute) -> int:
    """`fastpop train CONFIG --distributed` on this process (args: the command line's)."""

    def body() -> int:
        from fastpop.config import load_config
        from fastpop.distributed.multihost import DistributedRun
        from fastpop.run.parts import build_run

        try:
            config = load_config(args.config, args.overrides)
            parts = build_run(config)  # population.devices checked here too
            flags.check_parts(parts)
            run_dir = args.out or Path("results/runs") / config.name
            run = DistributedRun(parts, run_dir)
        except ConfigError as error:  # not any ValueError: JAX's own are not the user's input
            return fail(str(error))
        problem, descriptor = _owner_verdict(run, run_dir, args.overwrite)
        if problem is not None:
            return fail(problem)
        return _execute_here(run, execute, descriptor)

    return launch(arguments, body)


def resume(run_dir: Path, overrides: list[str], arguments: dict, execute) -> int:
    def body() -> int:
        import jax

        from fastpop.run.resume import lock_run_directory

        descriptor = lock_run_directory(run_dir) if jax.process_index() == 0 else None
        try:
            run = _resumed_run(run_dir, overrides)
        except (CheckpointError, ConfigError) as error:
            return fail(str(error))
        return _execute_here(run, execute, descriptor)

    return launch(arguments, body)


def _resumed_run(run_dir: Path, overrides: list[str]):
    from fastpop.distributed.checkpoint_sharded import ShardedCheckpoints
    from fastpop.distributed.multihost import DistributedRun
    from fastpop.run import run_state
    from fastpop.run.loop import CHECKPOINTS_DIR, CONFIG_FILE
    from fastpop.run.parts import build_run
    from fastpop.run.resume import _check_config_file

    directory = Path(run_dir) / CHECKPOINTS_DIR
    checkpoints = ShardedCheckpoints(directory, 1, agree=lambda value: [value])
    try:
        steps = checkpoints.steps()
        if not steps:
            hint = "" if not complete_checkpoints(directory) else " written with --distributed"
            raise CheckpointError(f"{run_dir}: no checkpoint{hint} to resume from ({directory})")
        manifest = checkpoints.manifest(steps[0])  # another topology: refused here
    finally:
        checkpoints.close()
    saved = manifest["metadata"]["config"]
    _check_config_file(Path(run_dir) / CONFIG_FILE, saved)
    config = run_state.resume_config(saved, overrides, str(checkpoints.path(steps[0])))
    parts = build_run(config)
    flags.check_parts(parts)
    run = DistributedRun(parts, Path(run_dir))
    run.checkpoints.restore_latest(run.log)
    if run.member_env_steps >= config.train.total_env_steps:
        raise ConfigError(
            f"{run_dir} is complete: {run.member_env_steps:,} of train.total_env_steps="
            f"{config.train.total_env_steps:,} env steps per member; to train on, resume with "
            "--set train.total_env_steps=<more>"
        )
    return run
