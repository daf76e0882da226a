"""Small shared fixtures: tiny agents, random replay buffers, runs trained in this process."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import jax
import numpy as np

from fastpop import population
from fastpop.agents import make_agent
from fastpop.bench.random_replay import random_rows
from fastpop.population import replay
from fastpop.types import EnvSpec

TINY_SPECS = {
    "td3": EnvSpec(obs_shape=(5,), action_dim=2, action_low=-2.0, action_high=2.0),
    "sac": EnvSpec(obs_shape=(5,), action_dim=2, action_low=-2.0, action_high=2.0),
    "dqn": EnvSpec(obs_shape=(5,), num_actions=3),
    "dqn_atari": EnvSpec(
        obs_shape=(84, 84, 4), obs_dtype=np.dtype(np.uint8), num_actions=4, frame_stack=4
    ),
}


# Static agent options the equivalence tests run with too: the recipe's critic (FastTD3's C51
# on a support the random rewards' returns fit in, with fastpop's LayerNorm), a dueling DQN head.
TINY_OPTIONS = {
    "distributional": {
        "critic": "distributional",
        "num_atoms": 11,
        "v_min": -10.0,
        "v_max": 10.0,
        "layer_norm": True,
    },
    "dueling": {"dueling": True},
}


def run_bench(argv: list[str]) -> int:
    """`fastpop bench ARGV...` through the command line's own parser and handler."""
    import argparse

    from fastpop.commands import bench as commands

    parser = argparse.ArgumentParser(prog="fastpop")
    commands.add_parser(parser.add_subparsers(dest="command"))
    return commands.run(parser.parse_args(["bench", *argv]))


def tiny_agent(name: str, **config_fields):
    """16-16 networks, batches of 8; `config_fields`: other fields of the algo's config."""
    algo = "dqn" if name.startswith("dqn") else name
    fields = {"hidden_sizes": (16, 16), "batch_size": 8, **config_fields}
    return make_agent(algo, TINY_SPECS[name], **fields)


def random_buffers(name: str, population_size: int, rows: int = 64, seed: int = 0):
    """Per-member buffers of random rows and a sample function for `agent.batch_size`."""
    env_spec = TINY_SPECS[name]
    spec = replay.make_replay_spec(env_spec, capacity=rows, lanes=1, chunk_len=rows)
    keys = jax.random.split(jax.random.key(seed), population_size)
    chunks = jax.vmap(lambda k: random_rows(spec, env_spec, k))(keys)
    buffers = jax.vmap(partial(replay.add, spec))(
        replay.init_population(spec, population_size), chunks
    )
    return spec, buffers


def sampler(spec, batch_size: int, n_step: int = 1):
    return replay.Sampler(spec, batch_size, n_step)


def tiny_update_bench():
    """`fastpop bench update`'s settings at tiny sizes: TD3 on 16-16 networks, batches of 8, two
    updates per call, a few calls, a small reference matmul and bandwidth pass."""
    from fastpop.bench.update import UpdateBenchSettings

    return UpdateBenchSettings(
        "td3",
        updates_per_call=2,
        batch_size=8,
        min_seconds=0.01,
        matmul_size=64,
        agent={"hidden_sizes": (16, 16)},
        memory_megabytes=1,
    )


def leaves_allclose(a, b, atol=1e-5) -> bool:
    return all(
        np.allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol=atol, rtol=1e-5)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def stacked_hparams(agent, size, **per_member):
    return population.broadcast_hparams(agent.default_hparams(), size, **per_member)


QUIET = ["log.tensorboard=false", "checkpoint.interval_seconds=null"]


def train_here(tmp_path: Path, preset: Path, *overrides: str):
    """A run of `preset` trained in this process (no `fastpop train` subprocess) into
    tmp_path/run: the finished `fastpop.run.loop.Run`."""
    from fastpop import config as config_lib
    from fastpop.run import loop
    from fastpop.run.parts import build_run
    from fastpop.run.startup import local_pieces

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = config_lib.load_config(preset, [*QUIET, *overrides])
    parts, log = build_run(config), lambda message: None
    pieces = local_pieces(parts, run_dir / loop.CHECKPOINTS_DIR, log, collectors_ahead=True)
    trained = loop.Run(parts, run_dir, log=log, pieces=pieces)
    trained.run()
    return trained


def refused_train(tmp_path: Path, capsys, preset: Path, *overrides: str) -> str:
    """`fastpop train preset --set ...` must exit 2 leaving no run directory: its stderr."""
    from fastpop.commands.cli import main

    run_dir = tmp_path / "run"
    sets = [arg for override in overrides for arg in ("--set", override)]
    assert main(["train", str(preset), "--out", str(run_dir), *sets]) == 2
    assert not run_dir.exists()
    return capsys.readouterr().err


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def program_names(event: str) -> list[str]:
    """A list that from now on receives the name of every program JAX reports `event` for
    (`compile_stats.TRACE`: traced; `compile_stats.BACKEND`: compiled, or loaded from the
    cache). Clear it to count from a point."""
    names: list[str] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda name, seconds, **fields: (
            names.append(fields.get("fun_name")) if name == event else None
        )
    )
    return names
