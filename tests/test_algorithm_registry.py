"""One registry of algorithms (`fastpop/agents/registry.py`): code outside fastpop/agents/ asks
it and never names an algorithm, so an algorithm registered at run time is a first-class one."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import jax
import numpy as np
import pytest

from fastpop.agents import TD3Config, make_agent, make_td3, registry
from fastpop.agents.base import NUMPY_POLICY_HPARAMS, AlgorithmEntry
from fastpop.collect import numpy_policy
from fastpop.collect.acting import numpy_policy_for
from fastpop.collect.numpy_policy import NumpyActing
from fastpop.commands import cli, export
from fastpop.config import ConfigError, load_config
from fastpop.types import EnvSpec
from tests.dependencies import require
from tests.runs import TD3_PENDULUM
from tests.source_scan import name_literals, names_outside

BUILT_IN = {entry.name for entry in registry.BUILT_IN}
# Where naming an algorithm is allowed: the registry and the algorithms' own modules (each
# exports its name, `td3.NAME`, for what is a twin of that one algorithm: the benchmarks'
# PyTorch baselines, floors and plans).
ALLOWED = ("agents/",)


def test_no_code_outside_the_registry_names_an_algorithm():
    found = names_outside(BUILT_IN, ALLOWED)
    assert not found, "ask fastpop.agents.registry instead:\n" + "\n".join(found)


def test_the_scan_sees_an_algorithm_named_in_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""About td3."""\n\ndef f(algo):\n    return algo == "dqn"  # "sac"\n')
    assert name_literals(probe, BUILT_IN) == [f"{probe}:4: 'dqn'"]


def test_the_built_ins_are_registered_and_an_unknown_name_lists_them():
    assert set(registry.NAMES) >= BUILT_IN and registry.DEFAULT in registry.NAMES
    known = ", ".join(registry.NAMES)
    with pytest.raises(
        ValueError, match=re.escape(f"unknown algorithm 'ppo'; choose one of {known}")
    ):
        make_agent("ppo", EnvSpec((3,), action_dim=1))
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.get(registry.DEFAULT))
    assert registry.default_for("continuous") == registry.DEFAULT
    assert registry.get(registry.default_for("discrete")).actions == "discrete"


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
    known = ", ".join(registry.NAMES)
    with pytest.raises(ConfigError, match=re.escape(f"algo: must be one of {known}, got 'toy'")):
        load_config(None, ["algo=toy"])


def test_a_registered_algorithm_is_refused_the_other_action_kind(toy):
    require("gymnax")  # the test extra installs it: missing is a failure
    with pytest.raises(ConfigError, match="algo: toy needs continuous actions, and gymnax/Cart"):
        load_config(None, ["algo=toy", "env.id=gymnax/CartPole-v1"])


def test_every_registered_numpy_policy_finds_what_it_reads_in_its_agent():
    # the kinds an entry may claim are those the collectors act
    assert set(NUMPY_POLICY_HPARAMS) == set(numpy_policy.KINDS)
    for entry in registry.entries():
        assert registry.numpy_policy_problem(entry) is None, entry.name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"numpy_hparams": {"exploration_noise": "noise_std"}},
            "algorithm 'toy': its numpy policy (deterministic) reads its exploration_noise from "
            "hparam 'noise_std', which its default hparams do not have (they have: actor_lr, ",
        ),
        (
            {"policy_torso": "Torso"},
            "algorithm 'toy': its numpy policy (deterministic) reads its MLP's Dense layers "
            "from its policy params' ['params']['Torso'], which hold none (['params'] has: "
            "MLP_0); set AlgorithmEntry.policy_torso to the module that holds them, or "
            "numpy_policy=None",
        ),
        (
            {"numpy_hparams": {"epsilon_start": "actor_lr"}},
            "numpy_hparams names 'epsilon_start', not a role of the hparams its numpy policy "
            "(deterministic) reads (its roles: exploration_noise)",
        ),
        (
            {"numpy_policy": "ppo"},
            "numpy_policy must be one of deterministic, squashed_gaussian, epsilon_greedy or "
            "None (its jitted act), got 'ppo'",
        ),
    ],
)
def test_an_entry_whose_numpy_policy_would_not_find_what_it_reads_is_refused(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.register(TOY._replace(**fields))
    assert TOY.name not in registry.NAMES


MISNAMED_PLUGIN = """
from fastpop.agents import TD3Config, make_td3, registry
from fastpop.agents.base import AlgorithmEntry

registry.register(
    AlgorithmEntry(
        name="misnamed",
        make=make_td3,
        config_type=TD3Config,
        actions="continuous",
        numpy_policy="deterministic",
        deterministic_action="the actor",
        numpy_hparams={"exploration_noise": "noise_std"},
    )
)
"""


def test_a_plugin_whose_numpy_policy_misnames_an_hparam_is_refused_with_exit_2(
    tmp_path, monkeypatch, capsys
):
    """In the learner's process, as the config is read: not in a collector, once spawned."""
    (tmp_path / "misnamed_plugin.py").write_text(MISNAMED_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "misnamed_plugin", raising=False)
    sets = ["--set", "plugins=[misnamed_plugin]", "--set", "algo=misnamed"]
    assert cli.main(["train", str(TD3_PENDULUM), *sets, "--out", str(tmp_path / "run")]) == 2
    message = capsys.readouterr().err
    assert (
        "plugins: cannot import 'misnamed_plugin': ValueError: algorithm 'misnamed': its numpy "
        "policy (deterministic) reads its exploration_noise from hparam 'noise_std', which its "
        "default hparams do not have" in message
    )
    assert not (tmp_path / "run").exists() and "misnamed" not in registry.NAMES


def test_a_numpy_policy_reads_the_hparam_and_the_mlp_its_entry_names():
    """TD3 whose exploration noise is its hparam policy_noise: the collectors' numpy policy
    reads that one (0: no noise, whatever exploration_noise says); an MLP under another name
    is found where the policy says."""
    renamed = TOY._replace(name="toy_renamed", numpy_hparams={"exploration_noise": "policy_noise"})
    spec = EnvSpec((3,), action_dim=2)
    registry.register(renamed)
    try:
        agent = make_agent(renamed.name, spec)
        state = agent.init(jax.random.key(0), agent.default_hparams())
        hparams = agent.default_hparams()._replace(
            policy_noise=np.float32(0.0), exploration_noise=np.float32(5.0)
        )
        published = jax.tree.map(
            lambda leaf: np.stack([leaf, leaf]), (agent.policy_params(state), hparams)
        )
        plan = numpy_policy_for(renamed.name, spec, published, 2, 1)
    finally:
        registry.unregister(renamed.name)
    assert plan.hparam_names == {"exploration_noise": "policy_noise"} and plan.torso == "MLP_0"
    params, slot_hparams = numpy_policy.slots_policy(plan, np.arange(2))(jax.tree.leaves(published))
    obs = np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(2, 3)

    def actions(plan, params, seed: int) -> np.ndarray:
        acting = NumpyActing(plan, np.random.default_rng(seed))
        acting.set_policy(params, slot_hparams)
        return acting(obs, 0)

    noiseless = actions(plan, params, 0)
    np.testing.assert_array_equal(noiseless, actions(plan, params, 1))
    moved = {"params": {"Torso": params["params"]["MLP_0"]}}
    np.testing.assert_array_equal(noiseless, actions(plan._replace(torso="Torso"), moved, 1))
