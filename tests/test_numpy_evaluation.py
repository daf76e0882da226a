"""The evaluator acts in numpy where the collectors can (MLP policies on vector observations),
with the agents' deterministic action (`act(..., explore=False)`), and imports no JAX there:
its returns are those of the agent's jitted `act` (`evaluate_population`) to float rounding,
for TD3, SAC (with observation normalization) and DQN (dueling)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.collect.acting import numpy_policy_for
from fastpop.collect.evaluator import evaluate_population, numpy_evaluation
from fastpop.collect.numpy_policy import NumpyPolicy
from fastpop.config.build import build_agent, build_env_spec
from tests.runs import with_this_checkout

CASES = {
    "td3": ["env.id=Pendulum-v1"],
    "sac": ["env.id=Pendulum-v1", "agent.observation_norm=true"],
    "dqn": ["env.id=CartPole-v1", "agent.dueling=true"],
}

# In a fresh process: the numpy evaluation of the saved snapshot, and whether JAX came in.
EVALUATE = """
import json, sys
from pathlib import Path
import numpy as np
from fastpop.collect.evaluator import numpy_evaluation
from fastpop.collect.numpy_policy import NumpyPolicy

here = Path(sys.argv[1])
fields = json.loads((here / "policy.json").read_text())
fields["log_std_bounds"] = tuple(fields["log_std_bounds"])
fields["leaf_paths"] = tuple(tuple(path) for path in fields["leaf_paths"])
policy = NumpyPolicy(**fields)
with np.load(here / "leaves.npz", allow_pickle=False) as saved:
    leaves = [saved[f"leaf_{i}"] for i in range(len(saved.files))]
mean, std = numpy_evaluation(policy, sys.argv[2], 2)(leaves, 11)
print(json.dumps({"mean": mean.tolist(), "jax": "jax" in sys.modules}))
"""


def published_snapshot(algo: str):
    """(agent, env spec, env id, published tree) of two freshly initialized members of `algo`, their
    observation statistics (where kept) unlike the initial ones."""
    overrides = CASES[algo]
    config = config_lib.load_config(
        None, [f"algo={algo}", *overrides, "population.size=2", "agent.hidden_sizes=[16,16]"]
    )
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    hparams = config_lib.initial_hparams(config, agent)
    states = population.init_population(agent, jax.random.key(3), hparams)
    if states.observation_norm is not None:
        rng = np.random.default_rng(0)
        shape = states.observation_norm.mean.shape
        states = states._replace(
            observation_norm=states.observation_norm._replace(
                mean=rng.standard_normal(shape).astype(np.float32),
                var=rng.uniform(0.5, 2.0, shape).astype(np.float32),
            )
        )
    clocks = (np.zeros(2, np.int32), np.zeros(2, np.int32))
    published = (population.member_policies(agent, states), hparams, clocks)
    return agent, spec, config.env.id, jax.tree.map(np.asarray, published)


@pytest.mark.parametrize("algo", sorted(CASES))
def test_numpy_evaluation_returns_the_jitted_acts_without_jax(algo, tmp_path):
    agent, spec, env_id, published = published_snapshot(algo)
    policy = numpy_policy_for(algo, spec, published, 2, 1)
    assert isinstance(policy, NumpyPolicy)
    leaves = jax.tree.leaves(published)
    expected, _ = evaluate_population(agent, published[0], published[1], env_id, 2, 11)
    (tmp_path / "policy.json").write_text(json.dumps(policy._asdict()))
    np.savez(tmp_path / "leaves.npz", **{f"leaf_{i}": leaf for i, leaf in enumerate(leaves)})
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", EVALUATE, str(tmp_path), env_id],
        env=with_this_checkout(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    evaluated = json.loads(result.stdout.splitlines()[-1])
    assert evaluated["jax"] is False
    np.testing.assert_allclose(evaluated["mean"], expected, rtol=1e-4)
    # and in this process, the same numbers
    mean, _ = numpy_evaluation(policy, env_id, 2)(leaves, 11)
    np.testing.assert_allclose(mean, evaluated["mean"], rtol=1e-6)
