"""One registry of algorithms (`fastpop/agents/registry.py`): code outside fastpop/agents/ asks
it and never names an algorithm, so an algorithm registered at run time is a first-class one."""

from __future__ import annotations

import dataclasses
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from fastpop.agents import TD3Config, make_agent, make_td3, registry
from fastpop.agents.base import AlgorithmEntry
from fastpop.collect.acting import numpy_policy_for
from fastpop.commands import export
from fastpop.config import ConfigError, load_config
from fastpop.types import EnvSpec
from tests.dependencies import require
from tests.source_scan import name_literals, names_outside

BUILT_IN = {"td3", "sac", "dqn"}
# Where naming an algorithm is allowed: the registry and the algorithms' own modules, and the
# benchmarks, whose per-algorithm PyTorch baselines and paper shapes are what they measure
# (fastpop/bench/, its command line commands/bench.py, and doctor's smoke test of TD3's update on
# the benchmark's shapes).
ALLOWED = ("agents/", "bench/", "commands/bench.py", "commands/doctor.py")


def test_no_code_outside_the_registry_names_an_algorithm():
    found = names_outside(BUILT_IN, ALLOWED)
    assert not found, "ask fastpop.agents.registry instead:\n" + "\n".join(found)


def test_the_scan_sees_an_algorithm_named_in_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""About td3."""\n\ndef f(algo):\n    return algo == "dqn"  # "sac"\n')
    assert name_literals(probe, BUILT_IN) == [f"{probe}:4: 'dqn'"]


def test_the_built_ins_are_registered_and_an_unknown_name_lists_them():
    assert set(registry.NAMES) >= BUILT_IN and registry.DEFAULT in registry.NAMES
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; choose one of td3, sac, dqn"):
        make_agent("ppo", EnvSpec((3,), action_dim=1))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.get("td3"))


@dataclasses.dataclass(frozen=True)
class ToyConfig(TD3Config):
    """TD3's static fields and one of the toy's own."""

    toy_width: int = 3


def make_toy(spec: EnvSpec, config: ToyConfig):
    """TD3 under another name, with hidden layers of the toy's width."""
    td3 = TD3Config(hidden_sizes=(config.toy_width,), batch_size=config.batch_size)
    return make_td3(spec, td3)._replace(name="toy")


TOY = AlgorithmEntry(
    name="toy",
    make=make_toy,
    config_type=ToyConfig,
    actions="continuous",
    numpy_policy="deterministic",
    deterministic_action="the toy's actor",
)


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)


def test_an_algorithm_registered_at_run_time_is_configured_built_and_exported(toy):
    config = load_config(None, ["algo=toy", "agent.toy_width=4", "hparams.actor_lr=1e-3"])
    assert config.algo == "toy" and config.agent["toy_width"] == 4
    spec = EnvSpec((3,), action_dim=2, action_low=-2.0, action_high=2.0)
    agent = make_agent(config.algo, spec, **config.agent)
    assert agent.name == "toy"
    state = agent.init(jax.random.key(0), agent.default_hparams())
    policy = agent.policy_params(state)
    published = jax.tree.map(lambda leaf: np.stack([leaf, leaf]), (policy, agent.default_hparams()))
    plan = numpy_policy_for("toy", spec, published, 2, 1)
    assert plan is not None and plan.kind == "deterministic"
    weights, function = export.export_policy(agent, policy, agent.default_hparams(), spec)
    assert weights and function
    loaded = types.SimpleNamespace(metadata={}, path=Path("/run/checkpoints/1000"))
    described = export.describe(config, spec, loaded, 0, "", Path("/run"), agent.default_hparams())
    assert described["algo"] == "toy" and described["deterministic"].endswith("the toy's actor")


def test_a_registered_algorithm_is_refused_where_its_entry_says(toy):
    with pytest.raises(ConfigError, match=r"deterministic actor and twin critics \(td3\)"):
        load_config(None, ["algo=toy", "strategy=cemrl", "replay.shared=true"])
    registry.unregister(toy.name)
    with pytest.raises(ConfigError, match="algo: must be one of td3, sac, dqn, got 'toy'"):
        load_config(None, ["algo=toy"])


def test_a_registered_algorithm_is_refused_the_other_action_kind(toy):
    require("gymnax")  # the test extra installs it: missing is a failure
    with pytest.raises(ConfigError, match="algo: toy needs continuous actions, and gymnax/Cart"):
        load_config(None, ["algo=toy", "env.id=gymnax/CartPole-v1"])
