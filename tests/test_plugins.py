"""`plugins:` a config names the modules that register what fastpop does not have, and every
process of the run imports them: an algorithm and a strategy defined only in
tests/toy_plugin.py train in process mode (its collectors read the same config), and the
algorithm is exported."""

from __future__ import annotations

import json
import sys

import pytest

from fastpop.agents import registry
from fastpop.commands import cli
from fastpop.config import ConfigError, load_config
from fastpop.strategies import registry as strategies
from tests.runs import FAST, TD3_PENDULUM, read_jsonl

PLUGIN = "tests.toy_plugin"
SHORT = [
    *FAST,
    f"plugins=[{PLUGIN}]",
    "algo=plugin_toy",
    "strategy=plugin_toy_strategy",
    "agent.toy_width=12",
    "population.size=2",
    "collect.num_collectors=1",
    "train.total_env_steps=640",
    "eval.interval=320",
    "log.tensorboard=false",
]


@pytest.fixture
def plugin():
    """The plugin imported by the run and taken out afterwards (other tests list the names)."""
    yield
    sys.modules.pop(PLUGIN, None)
    if "plugin_toy" in registry.NAMES:
        registry.unregister("plugin_toy")
    if "plugin_toy_strategy" in strategies.NAMES:
        strategies.unregister("plugin_toy_strategy")


def test_a_plugin_that_cannot_be_imported_is_refused_with_exit_2(tmp_path, capsys):
    sets = ["--set", "plugins=[tests.no_such_plugin]", "--set", "algo=plugin_toy"]
    assert cli.main(["train", str(TD3_PENDULUM), *sets, "--out", str(tmp_path / "run")]) == 2
    message = capsys.readouterr().err
    assert "plugins: cannot import 'tests.no_such_plugin': ModuleNotFoundError" in message
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="algo: must be one of td3, sac, dqn, got 'plugin_toy'"):
        load_config(TD3_PENDULUM, ["algo=plugin_toy"])  # without the plugin: unknown


def test_a_plugin_algorithm_and_strategy_train_with_collector_processes(tmp_path, plugin):
    run_dir = tmp_path / "run"
    sets = [arg for override in SHORT for arg in ("--set", override)]
    assert cli.main(["train", str(TD3_PENDULUM), *sets, "--out", str(run_dir)]) == 0
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert {row["member"] for row in rows} == {0, 1}
    assert len({row["eval_index"] for row in rows}) >= 2  # the strategy's rounds
    assert max(row["member_env_steps"] for row in rows) >= 640
    config = load_config(run_dir / "config.yaml")
    assert (config.algo, config.strategy) == ("plugin_toy", "plugin_toy_strategy")
    assert (config.plugins, config.agent["toy_width"]) == ((PLUGIN,), 12)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["updates_per_member"] > 0
    out = tmp_path / "export"
    assert cli.main(["export", str(run_dir), "--out", str(out)]) == 0
    described = json.loads((out / "policy.json").read_text())
    assert described["algo"] == "plugin_toy"
