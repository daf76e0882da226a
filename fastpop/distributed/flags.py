"""The command line's `--distributed` flags: the arguments of jax.distributed.initialize from
`--coordinator HOST:PORT --num-processes N --process-id I`, or detected from the environment
(Slurm, Open MPI, ...); and what a distributed run cannot be. Flags that cannot start a run are
refused (ConfigError, exit 2) before any process starts."""

from __future__ import annotations

import os
import socket

from fastpop.schema import ConfigError

DEFAULT_HEARTBEAT_SECONDS = 10  # a process silent this long is lost (`--heartbeat-seconds`)
MIN_HEARTBEAT_SECONDS = 2  # fewer would take a busy process for a lost one

DETECTION_HELP = (
    "pass --coordinator HOST:PORT --num-processes N --process-id I to every process (the "
    "coordinator is process 0's host and a free port), or start the processes with srun (Slurm) "
    "or mpirun (Open MPI), whose environment jax.distributed reads"
)


def free_port() -> int:
    """A TCP port free on this host now, for a coordinator on one machine (several local
    processes: the tests, `results/scaling/local_processes.py`)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def add_arguments(parser) -> None:
    group = parser.add_argument_group("several processes (hosts): jax.distributed")
    group.add_argument(
        "--distributed",
        action="store_true",
        help="train one population over the devices of several processes (hosts); see "
        "docs/devices-and-hosts.md",
    )
    group.add_argument("--coordinator", default=None, metavar="HOST:PORT", help=DETECTION_HELP)
    group.add_argument("--num-processes", type=int, default=None, metavar="N")
    group.add_argument("--process-id", type=int, default=None, metavar="I")
    group.add_argument(
        "--heartbeat-seconds",
        type=int,
        default=None,
        metavar="S",
        help=f"a process silent this long is lost; the others stop and name it (default "
        f"{DEFAULT_HEARTBEAT_SECONDS}; longer on a network that stalls)",
    )


def _detected() -> bool:
    """An environment jax.distributed can read the coordinator from (Slurm, Open MPI, ...)."""
    from jax._src import clusters

    if os.environ.get("JAX_COORDINATOR_ADDRESS"):
        return True
    for cluster in clusters.ClusterEnv._cluster_types:
        try:
            if cluster.opt_in_only_method:
                continue
            if cluster.is_env_present():
                return True
        except Exception:  # a detector that cannot even look is not a detection
            continue
    return False


def resolve(args) -> dict | None:
    """The arguments of jax.distributed.initialize from the flags (None without --distributed);
    ConfigError for flags that cannot start a run."""
    flags = {"--coordinator": args.coordinator, "--num-processes": args.num_processes}
    flags["--process-id"] = args.process_id
    given = [name for name, value in flags.items() if value is not None]
    if not args.distributed:
        if given or args.heartbeat_seconds is not None:
            first = given[0] if given else "--heartbeat-seconds"
            raise ConfigError(f"{first} belongs to --distributed; add --distributed")
        return None
    if args.coordinator is not None:
        missing = [name for name, value in flags.items() if value is None]
        if missing:
            raise ConfigError(f"--coordinator needs {' and '.join(missing)} too; {DETECTION_HELP}")
        host, _, port = args.coordinator.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"--coordinator {args.coordinator}: expected HOST:PORT")
        if args.num_processes < 1 or not 0 <= args.process_id < args.num_processes:
            raise ConfigError(
                f"--process-id {args.process_id} --num-processes {args.num_processes}: the "
                "process ids are 0 .. N-1 and N >= 1"
            )
    elif given:
        raise ConfigError(f"{given[0]} without --coordinator; {DETECTION_HELP}")
    elif not _detected():
        raise ConfigError(f"--distributed: no coordinator given or detected; {DETECTION_HELP}")
    heartbeat = args.heartbeat_seconds
    if heartbeat is None:
        heartbeat = DEFAULT_HEARTBEAT_SECONDS
    elif heartbeat < MIN_HEARTBEAT_SECONDS:
        raise ConfigError(
            f"--heartbeat-seconds {heartbeat}: expected {MIN_HEARTBEAT_SECONDS} or more "
            f"(default {DEFAULT_HEARTBEAT_SECONDS})"
        )
    return {
        "coordinator_address": args.coordinator,
        "num_processes": args.num_processes,
        "process_id": args.process_id,
        "heartbeat_timeout_seconds": heartbeat,
    }


def check_parts(parts) -> None:
    """What a distributed run cannot be (exit 2 before anything starts); `parts` is the run's
    `fastpop.run.parts.RunParts`. Every strategy, collection mode and replay layout runs: the
    member axis (and a shared critic or replay, replicated) spans every process's devices."""
    config = parts.config
    if config.population.devices == 1:
        raise ConfigError(
            "population.devices: 1, but --distributed spreads the members over every "
            "process's devices; set population.devices: all"
        )
