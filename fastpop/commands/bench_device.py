"""`fastpop bench device`: its parser, its arguments checked against the env (device ids, a
physics backend, the algorithm's action kind, the process-mode row's env) before anything is
measured, and its handler.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fastpop.agents import ALGORITHMS, registry
from fastpop.commands.args import comma_list, fail, one_of, positive_int, positive_int_arg


def add_device_parser(benchmarks) -> None:
    device = benchmarks.add_parser(
        "device",
        help="device mode: JAX envs (brax, gymnax, Playground) and the population update on one "
        "device",
        description="env-steps/s and agent-updates/s of device-mode training (collect.mode: "
        "device, one update per env step and member) for each population size and envs per "
        "member, against the env stepped alone (the ceiling) and the update alone (bench "
        "update's measurement at the env's shapes) and the same training in process mode on "
        "the env's gymnasium counterpart; compile seconds. Writes "
        "results/bench/device_<env>_<device>.json and .png.",
    )
    device.add_argument(
        "--env", default="brax/halfcheetah", help="a brax/, gymnax/ or playground/ id"
    )
    device.add_argument(
        "--pop",
        type=comma_list(positive_int, "population size"),
        default=[1, 4, 16],
        help="population sizes P, comma-separated (default 1,4,16)",
    )
    device.add_argument(
        "--envs-per-member",
        type=comma_list(positive_int, "envs per member"),
        default=[1, 4],
        help="envs per member E, comma-separated (default 1,4)",
    )
    device.add_argument("--backend", default=None, help="brax backend (default: env.backend's)")
    device.add_argument(
        "--algo",
        type=one_of("algorithm", ALGORITHMS),
        default=None,
        help=f"default: {registry.default_for('discrete')} for discrete actions, else "
        f"{registry.default_for('continuous')}",
    )
    device.add_argument(
        "--seconds", type=float, default=6.0, help="timed seconds per measurement (default 6)"
    )
    device.add_argument(
        "--chunk-len", type=positive_int_arg("chunk length"), default=32, help="collect.chunk_len"
    )
    device.add_argument(
        "--updates-per-call",
        type=positive_int_arg("updates per call"),
        default=None,
        help="K of the update scan (default: the chunk length)",
    )
    device.add_argument(
        "--hidden-sizes",
        type=comma_list(positive_int, "hidden size"),
        default=None,
        help="agent.hidden_sizes, comma-separated (default: the algorithm's, 256,256)",
    )
    device.add_argument(
        "--process-env",
        default="auto",
        help="a gymnasium id trained in process mode beside each row (collector processes, "
        "same P, E, networks and update ratio); default auto: the env's gymnasium "
        "counterpart (brax/halfcheetah: HalfCheetah-v5, gymnax/CartPole-v1: CartPole-v1); "
        "none: leave it out",
    )
    device.add_argument("--out", type=Path, default=Path("results/bench"))


def device_command(args: argparse.Namespace) -> str:
    """The `fastpop bench device` command these arguments stand for."""
    import shlex

    joined = lambda values: ",".join(map(str, values))
    words = ["fastpop", "bench", "device", "--env", args.env, "--pop", joined(args.pop)]
    words += ["--envs-per-member", joined(args.envs_per_member), "--algo", args.algo]
    words += ["--seconds", f"{args.seconds:g}", "--chunk-len", str(args.chunk_len)]
    optional = (
        ("--backend", args.backend),
        ("--updates-per-call", args.updates_per_call),
        ("--hidden-sizes", args.hidden_sizes and joined(args.hidden_sizes)),
        ("--process-env", args.process_env != "auto" and args.process_env),
    )
    words += [word for flag, value in optional if value for word in (flag, str(value))]
    return shlex.join([*words, "--out", str(args.out)])


def run_device(args: argparse.Namespace) -> int:
    from fastpop.bench.common import DeviceBenchSettings
    from fastpop.bench.device import bench_device
    from fastpop.bench.device_report import table, write_results
    from fastpop.config import ConfigError
    from fastpop.envs import device_envs

    if not device_envs.is_device_id(args.env):
        return fail(
            f"--env {args.env}: device mode steps JAX environments ({device_envs.id_forms()})"
        )
    if args.backend is not None and not device_envs.takes_backend(args.env):
        names = device_envs.backend_family_names()
        return fail(f"--backend {args.backend}: only {names} environments have a physics backend")
    try:
        discrete = device_envs.discrete_actions(args.env)
    except ValueError as error:  # UnknownEnvironment, MissingExtra
        return fail(str(error))
    kind = "discrete" if discrete else "continuous"
    if args.algo is None:
        args.algo = registry.default_for(kind)
    if registry.get(args.algo).actions != kind:
        fits = " or ".join(registry.names_with(actions=kind))
        return fail(f"--algo {args.algo}: {args.env} has {kind} actions: use {fits}")
    agent = {} if args.hidden_sizes is None else {"hidden_sizes": args.hidden_sizes}
    settings = DeviceBenchSettings(
        args.env,
        args.backend,
        args.algo,
        args.seconds,
        args.chunk_len,
        args.updates_per_call,
        agent,
        process_env=None if args.process_env == "none" else args.process_env,
    )
    if args.process_env not in ("auto", "none"):  # refused before anything is measured
        from fastpop.bench.process_mode import process_config

        try:
            process_config(settings._replace(updates_per_call=1), 1, 1)
        except (ConfigError, ValueError) as error:
            return fail(f"--process-env {args.process_env}: {error}")
    try:
        device_envs.resolve_backend(args.env, args.backend)
        result = bench_device(settings, args.pop, args.envs_per_member, device_command(args))
    except (ConfigError, ValueError) as error:  # MissingExtra, UnknownEnvironment too
        return fail(str(error))
    json_path, png_path = write_results(result, args.out)
    print(table(result))
    print(f"wrote {json_path} and {png_path}")
    return 0
