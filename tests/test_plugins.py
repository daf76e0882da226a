"""`plugins:` a config names the modules that register what fastpop does not have, and every
process of the run imports them: an algorithm and a strategy (with a section of its own) defined
only in tests/toy_plugin.py train in process mode (its collectors read the same config) and in
device mode, where a stopped run resumed from its directory alone writes the rows of an
uninterrupted one; `fastpop eval`, `plot` and `export` read such a run."""

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


def forget_plugin() -> None:
    """As in a fresh process: the plugin neither imported nor registered."""
    sys.modules.pop(PLUGIN, None)
    if "plugin_toy" in registry.NAMES:
        registry.unregister("plugin_toy")
    if "plugin_toy_strategy" in strategies.NAMES:
        strategies.unregister("plugin_toy_strategy")


@pytest.fixture
def plugin():
    """The plugin imported by the run and taken out afterwards (other tests list the names)."""
    yield
    forget_plugin()


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


def test_a_plugin_trains_in_device_mode_resumes_and_is_evaluated_and_plotted(
    tmp_path, plugin, capsys
):
    """gymnax's Pendulum stepped on the device; between commands the plugin is forgotten, so
    each command finds it through the run's saved config alone."""
    from tests.test_device_mode import PRESET, SHORT, rows

    toy = ["algo=plugin_toy", "strategy=plugin_toy_strategy", "agent.toy_width=12"]
    toy += [f"plugins=[{PLUGIN}]", "plugin_toy_strategy.replaced=1", "eval.interval=256"]
    sets = [arg for override in [*SHORT, *toy] for arg in ("--set", override)]

    def train(name: str, steps: int):
        steps_set = ["--set", f"train.total_env_steps={steps}"]
        assert (
            cli.main(["train", str(PRESET), *sets, *steps_set, "--out", str(tmp_path / name)]) == 0
        )
        forget_plugin()
        return tmp_path / name

    whole, first = train("whole", 1024), train("resumed", 512)
    assert cli.main(["resume", str(first), "--set", "train.total_env_steps=1024"]) == 0
    forget_plugin()
    assert rows(first) == rows(whole) and len(rows(whole)) == 2 * 4  # 2 members, 4 rounds
    assert load_config(whole / "config.yaml").section("plugin_toy_strategy").replaced == 1
    forget_plugin()
    capsys.readouterr()
    assert cli.main(["eval", str(whole), "--member", "best", "--episodes", "2"]) == 0
    assert "1,024 env steps/member): return" in capsys.readouterr().out
    forget_plugin()
    assert cli.main(["plot", str(whole), "--out", str(tmp_path / "plots")]) == 0
    assert list((tmp_path / "plots").glob("*.png"))  # the returns drawn
