"""Seconds a spawned worker (the evaluator; a collector acting through JAX) takes to have its
agent and the layout of what the learner publishes, imports included, each in a fresh
interpreter: from its `AgentRecipe` and the published hparams' layout (what workers are sent)
against from the whole config (what they were sent before: the config re-read and validated,
the env made again for its shapes, the learner's starting hparams traced for the layout).
Alternating rounds; medians.

    python results/startup/worker_agent.py [PRESET] [--rounds N]

Everything heavy is imported inside `main`.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

FROM_RECIPE = """
import time; start = time.perf_counter()
import pickle, sys
from fastpop.collect.collector import rebuild_agent
given = pickle.load(open(sys.argv[1], "rb"))
agent, treedef = rebuild_agent(given["recipe"], given["hparams"])
print(time.perf_counter() - start)
"""

FROM_CONFIG = """
import time; start = time.perf_counter()
import pickle, sys
import jax
from fastpop import config as config_lib
from fastpop.collect.collector import policy_template
from fastpop.config.build import build_agent, initial_hparams
given = pickle.load(open(sys.argv[1], "rb"))
config = config_lib.config_from_dict(given["config"])
agent = build_agent(config)
hparams = jax.eval_shape(lambda: initial_hparams(config, agent))
treedef = jax.tree.structure(policy_template(agent, hparams))
print(time.perf_counter() - start)
"""


def inputs(preset: str, folder: Path) -> Path:
    """What each way is given, written by the learner's side, as a run makes it."""
    from fastpop.collect.collector import hparams_layout
    from fastpop.config import config_to_dict, load_config
    from fastpop.config.build import build_agent, build_env_spec
    from fastpop.run.parts import config_policy_template, process_parts

    config = load_config(REPO / "configs" / f"{preset}.yaml")
    spec = build_env_spec(config)
    template = config_policy_template(build_agent(config, spec), config)
    given = {
        "recipe": process_parts(config, spec).agent,
        "hparams": hparams_layout(template[1]),
        "config": config_to_dict(config),
    }
    path = folder / "given.pkl"
    path.write_bytes(pickle.dumps(given))
    return path


def seconds(script: str, given: Path) -> float:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script, str(given)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        cwd=tempfile.gettempdir(),
    )
    return float(done.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", default="td3_pbt_halfcheetah")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        given = inputs(args.preset, Path(folder))
        rounds = {"recipe": [], "config": []}
        for _ in range(args.rounds):  # alternating: drifting load touches both alike
            rounds["config"].append(seconds(FROM_CONFIG, given))
            rounds["recipe"].append(seconds(FROM_RECIPE, given))
    medians = {way: round(statistics.median(times), 3) for way, times in rounds.items()}
    all_rounds = {way: [round(t, 3) for t in times] for way, times in rounds.items()}
    print(json.dumps({"preset": args.preset, "median_seconds": medians, "rounds": all_rounds}))


if __name__ == "__main__":
    main()
