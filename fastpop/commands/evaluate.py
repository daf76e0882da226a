"""`fastpop eval RUN_DIR`: evaluate one member of a run from its newest usable checkpoint.

The member acts as in the periodic evaluation (`collect.evaluator.evaluate_population`, the
agent's jitted `act`; a process-mode run's evaluator computes the same deterministic actions in
numpy where it can, equal to float rounding): no exploration, the policy held constant. Only the
member states and hparams are read from the checkpoint (never the replay buffers), and nothing
is written into the run directory; `--video` also records the first episode
(`fastpop.commands.video`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NamedTuple

from fastpop.commands import video
from fastpop.commands.args import fail, positive_int_arg, warn


class EvalError(ValueError):
    """Bad input to `fastpop eval`; the message says what and what would be right."""


class Loaded(NamedTuple):
    path: Path  # the checkpoint directory used
    config: Any  # fastpop.config.Config of the run
    metadata: dict  # the checkpoint's metadata ("config", "run", ...)
    agent: Any
    policy: Any  # stacked policy params, (P, ...) leaves
    hparams: Any  # stacked hparams, (P,) leaves


def add_parser(commands) -> argparse.ArgumentParser:
    """Add `eval` to the `fastpop` subcommands (`commands`: from add_subparsers)."""
    parser = commands.add_parser(
        "eval",
        help="evaluate one member of a run from its newest checkpoint",
        description="Evaluate one member of a run from its newest usable checkpoint, acting "
        "without exploration with the policy held constant (as the periodic evaluation does), "
        "and print the mean and std of its return. Reads the run directory only; --video "
        "writes an mp4 of the first episode.",
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="run directory (holds checkpoints/)"
    )
    parser.add_argument(
        "--member",
        default="best",
        metavar="best|N",
        help="member index, or best: the highest return of the checkpoint's latest evaluation "
        "round (for cemrl, member 0: the CEM mean) (default best)",
    )
    parser.add_argument(
        "--episodes",
        type=positive_int_arg("episodes"),
        default=None,
        metavar="E",
        help="episodes to average over (default: the run's eval.episodes)",
    )
    parser.add_argument(
        "--video",
        type=Path,
        default=None,
        metavar="OUT.mp4",
        help="also record the first episode as an mp4 (rendered offscreen on the CPU or GPU; "
        f"needs {video.VIDEO_INSTALL})",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        metavar="S",
        help="seed of the environments (default: the run's seed, that of its first "
        "evaluation round)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """The `fastpop eval` handler: 0 on success, 2 (with a message) on bad input."""
    try:
        return _run(args)
    except (EvalError, video.VideoError) as error:
        return fail(str(error))


def _run(args: argparse.Namespace) -> int:
    requested = parse_member(args.member)
    if args.video is not None:
        video.check_video_path(args.video)
        video.check_video_dependencies()
        video.choose_mujoco_gl()  # before the first MuJoCo render (the backend is read then)
    loaded = load_latest(args.run_dir, warn)
    config = loaded.config
    size = config.population.size
    member, reason = resolve_member(requested, loaded.metadata, config)
    if member >= size:
        raise EvalError(
            f"--member {member}: the run's population has {size} members (0..{size - 1})"
        )
    episodes = args.episodes or config.eval.episodes
    seed = config.seed if args.seed is None else args.seed
    steps = (loaded.metadata.get("run") or {}).get("member_env_steps", int(loaded.path.name))
    policy, hparams = one_member(loaded.policy, member), one_member(loaded.hparams, member)
    print(
        f"checkpoint {loaded.path} ({steps:,} env steps/member): {config.algo} on "
        f"{config.env.id}, strategy {config.strategy}, population {size}"
    )
    print(f"member {member}{f' ({reason})' if reason else ''}; hparams: {format_hparams(hparams)}")
    video_env = video.make_video_env(config, seed) if args.video is not None else None
    try:
        mean, std = evaluate_member(loaded.agent, policy, hparams, config, episodes, seed)
        print(
            f"member {member} (checkpoint {loaded.path.name}, {steps:,} env steps/member): "
            f"return {mean:.1f} +- {std:.1f} over {episodes} episode{'s' * (episodes != 1)}",
            flush=True,
        )
        if video_env is not None:
            print(f"recording the first episode to {args.video} ...", flush=True)
            frames, episode_return = video.record_episode(
                loaded.agent,
                policy,
                hparams,
                video_env,
                seed,
                args.video,
                video.video_fps(config, video_env),
            )
            print(
                f"wrote {args.video}: {frames} frames, the first episode (return "
                f"{episode_return:.1f})"
            )
    finally:
        if video_env is not None:
            video_env.close()
    return 0


def parse_member(text: str) -> str | int:
    """best, or a member index >= 0."""
    if text.strip() == "best":
        return "best"
    try:
        index = int(text)
    except ValueError:
        index = -1
    if index < 0:
        raise EvalError(f"--member {text!r}: expected best or a member index (0, 1, ...)")
    return index


def resolve_member(requested: str | int, metadata: dict, config) -> tuple[int, str]:
    """(member index, why it was chosen) for --member best|N."""
    import math

    if requested != "best":
        return int(requested), ""
    from fastpop.strategies import registry

    entry = registry.get(config.strategy)
    if entry.mean_member is not None:
        # cemrl's samples are redrawn after every evaluation round: the latest returns describe
        # actors no longer in the checkpoint; the refitted mean is the policy CEM-RL reports.
        mean = entry.mean_member
        return mean.index, f"best: {entry.name}'s {mean.label}"
    returns = (metadata.get("run") or {}).get("latest_returns") or []
    finite = [
        (value, index)
        for index, value in enumerate(returns)
        if isinstance(value, int | float) and math.isfinite(value)
    ]
    if not finite:
        raise EvalError(
            "--member best: no evaluation was recorded before the checkpoint (the run stopped "
            f"before its first evaluation round finished); pass --member N (0.."
            f"{config.population.size - 1})"
        )
    value, index = max(finite)
    return index, f"best: return {value:.1f} in the checkpoint's latest evaluation round"


def one_member(tree: Any, index: int) -> Any:
    """Member `index` of a stacked tree, keeping a member axis of 1 (a population of one)."""
    import jax

    return jax.tree.map(lambda leaf: leaf[index : index + 1], tree)


def format_hparams(hparams: Any) -> str:
    """name=value of a population-of-one's hparams."""
    import numpy as np

    from fastpop.agents.base import hparam_fields

    values = {name: np.asarray(value)[0].item() for name, value in hparam_fields(hparams).items()}
    return ", ".join(f"{name}={value:.4g}" for name, value in values.items())


# --- loading ---


def load_latest(run_dir: Path, warn) -> Loaded:
    """Member states and hparams of the newest checkpoint under `run_dir` that restores; each
    unusable newer one is reported through `warn`."""
    from fastpop.run import checkpoint

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise EvalError(f"run directory {run_dir} does not exist")
    directory = run_dir / "checkpoints"
    candidates = checkpoint.complete_checkpoints(directory)
    if not candidates:
        raise EvalError(
            f"{run_dir} has no checkpoint (looked for {directory}/<env steps>/); a run writes "
            "one when it stops and every checkpoint.interval_seconds"
        )
    built = {}  # checkpoints of one run share their config, so its template is built once

    def template(metadata: dict):
        config = _checkpoint_config(metadata)
        if built.get("config") != config:
            tree, agent, run_training = _template(config)
            built.update(config=config, template=tree, agent=agent, training=run_training)
        return built["template"]

    try:
        tree, metadata, path = checkpoint.restore_latest(directory, template, warn, partial=True)
    except checkpoint.CheckpointError as error:
        raise EvalError(str(error)) from None
    states, hparams = tree["learner"]["states"], tree["learner"]["hparams"]
    agent, run_training = built["agent"], built["training"]
    policy = run_training.policies(run_training.adopt(states))
    return Loaded(path, built["config"], metadata, agent, policy, hparams)


def _checkpoint_config(metadata: dict):
    """The run's Config from a checkpoint's metadata (a CheckpointError when unusable)."""
    from fastpop.config import config_from_dict
    from fastpop.run import checkpoint
    from fastpop.schema import ConfigError

    data = (metadata or {}).get("config")
    if not isinstance(data, dict):
        raise checkpoint.CheckpointError("no config in its metadata")
    try:
        return config_from_dict(data, "the checkpoint's config")
    except ConfigError as error:  # e.g. written by another fastpop version
        raise checkpoint.CheckpointError(f"its config is not valid: {error}") from None


def _template(config):
    """(template of the saved member states and hparams, agent, the run's Training). Shapes
    only, from the training's own init under `jax.eval_shape`: nothing is compiled or
    allocated, no replay either. Restoring reads only each leaf's shape and dtype from it."""
    import jax

    from fastpop.config import initial_hparams
    from fastpop.config.build import build_agent, build_env_spec, build_strategy
    from fastpop.learn import update_protocol
    from fastpop.run.parts import make_training, run_execution

    try:
        spec = build_env_spec(config)
        agent = build_agent(config, spec)
    except ValueError as error:  # ConfigError, MissingExtra: the environment cannot be built
        raise EvalError(str(error)) from None
    strategy = build_strategy(config)
    execution = run_execution(config, spec)
    run_training = make_training(config, spec, agent, strategy, None, execution)
    hparams = initial_hparams(config, agent)
    states = update_protocol.state_template(run_training, hparams)
    template = {"learner": {"states": states, "hparams": jax.eval_shape(lambda: hparams)}}
    return template, agent, run_training


# --- evaluation ---


def evaluate_member(agent, policy, hparams, config, episodes: int, seed: int):
    """(mean, std) of the return of a population of one, as the periodic evaluation does."""
    from fastpop import config as config_lib
    from fastpop.collect.evaluator import evaluate_population
    from fastpop.envs.device_envs import is_device_id

    if is_device_id(config.env.id):  # stepped on the device, whatever collected the run's rows
        from fastpop.collect.device_rollout import evaluate_on_device

        returns = evaluate_on_device(agent, policy, hparams, config.env, episodes, seed)[0]
        return float(returns.mean()), float(returns.std())
    mean, std = evaluate_population(
        agent,
        policy,
        hparams,
        config.env.id,
        episodes,
        seed,
        atari=config_lib.atari_options(config),
    )
    return float(mean[0]), float(std[0])
