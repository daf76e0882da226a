"""One registry of strategies (`fastpop/strategies/registry.py`): code outside fastpop/strategies/
reads an entry's fields and never names a strategy, so a strategy registered at run time is a
first-class one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.config import ConfigError, load_config
from fastpop.run import progress
from fastpop.strategies import registry
from fastpop.strategies.base import Selection, Strategy, StrategyEntry
from tests.dependencies import require
from tests.helpers import QUIET, train_here
from tests.runs import FAST, TD3_PENDULUM
from tests.source_scan import name_literals, names_outside

BUILT_IN = {
    "independent",
    "pbt",
    "pb2",
    "mfpbt",
    "halving",
    "branch_merge",
    "cemrl",
    "dvd",
    "schedule",
}
# Where naming a strategy is allowed: the strategies' own package (each module, its entry, the
# registry, their config checks), and the GPU benchmark, whose "pbt" is the name of one of its
# measured phases (fastpop/bench/, its command line commands/bench_gpu.py), not a strategy.
ALLOWED = ("strategies/", "bench/", "commands/bench_gpu.py")


def test_no_code_outside_the_registry_names_a_strategy():
    found = names_outside(BUILT_IN, ALLOWED)
    assert not found, "ask fastpop.strategies.registry instead:\n" + "\n".join(found)


def test_the_scan_sees_a_strategy_named_in_code(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('"""About pbt."""\n\ndef f(s):\n    return s in ("pb2", "dvd x")  # "cemrl"\n')
    assert name_literals(probe, BUILT_IN) == [f"{probe}:4: 'pb2'"]


def test_the_built_ins_are_registered_with_their_sections():
    assert list(registry.NAMES) == sorted(BUILT_IN, key=list(registry.NAMES).index)
    assert set(registry.NAMES) == BUILT_IN and registry.DEFAULT == "independent"
    sections = config_lib.Config().strategy_sections
    for entry in registry.entries():  # each section is its strategy's config_type, by name
        if entry.config_type is not None:
            assert type(sections[entry.name]) is entry.config_type
    with pytest.raises(ValueError, match="unknown strategy 'ppo'; choose one of independent, pbt"):
        registry.get("ppo")
    with pytest.raises(ValueError, match="registered already"):
        registry.register(registry.get("pbt"))
    assert registry.find("ppo") is None and registry.find(None) is None


def make_toy(setting) -> Strategy:
    """Every round the worst member continues from the best one's state: a tiny PBT without
    explore, whose rounds the test counts."""
    size = setting.population.size
    rounds = []

    def step(state, evaluation, hparams):
        rounds.append(evaluation.eval_index)
        returns = np.nan_to_num(np.asarray(evaluation.returns, float), nan=-np.inf)
        sources = np.arange(size)
        sources[int(np.argmin(returns))] = int(np.argmax(returns))
        return state + 1, Selection(sources, hparams, [])

    TOY_ROUNDS[:] = [rounds]
    return Strategy("toy", setting.evaluation_interval, True, lambda: 0, step)


TOY_ROUNDS: list = []
TOY = StrategyEntry(name="toy", make=make_toy, replayable=False)


@pytest.fixture
def toy():
    registry.register(TOY)
    yield TOY
    registry.unregister(TOY.name)


def test_a_strategy_registered_at_run_time_is_configured_and_built(toy):
    config = load_config(None, ["strategy=toy", "population.size=3"])
    assert config.strategy == "toy" and registry.get(config.strategy) is toy
    built = config_lib.build_strategy(config)
    assert built.name == "toy" and built.waits_for_evaluation
    assert config_lib.member_overrides(config) == [{}, {}, {}]
    with pytest.raises(ConfigError, match=r"population\.size: strategy toy needs at least 2"):
        load_config(None, ["strategy=toy", "population.size=1"])
    registry.unregister(toy.name)
    with pytest.raises(ConfigError, match=r"strategy: must be one of independent, pbt, .*'toy'"):
        load_config(None, ["strategy=toy"])


def test_a_registered_strategy_is_checked_as_its_entry_says(toy):
    registry.register(toy._replace(needs_priors=True, devices_note=" (toy note)"), replace=True)
    with pytest.raises(ConfigError, match=r"population\.priors: strategy toy draws the hparams"):
        load_config(None, ["strategy=toy"])
    priors = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}"
    with pytest.raises(ConfigError, match=r"a divisor of 4 \(toy note\)"):
        load_config(None, ["strategy=toy", priors, "population.devices=3"])

    @dataclasses.dataclass(frozen=True)
    class ToySection:
        width: int = 1

    registry.register(toy._replace(config_type=ToySection), replace=True)
    config = load_config(None, ["strategy=toy", "toy.width=3"])  # its section, no Config field
    assert config.section("toy") == ToySection(3)
    assert config_lib.strategy_setting(config).section == ToySection(3)
    with pytest.raises(ConfigError, match=r"toy\.width: expected an integer, got 'wide'"):
        load_config(None, ["toy.width=wide"])
    registry.unregister(toy.name)
    with pytest.raises(ConfigError, match="unknown key 'toy' in --set"):
        load_config(None, ["toy.width=3"])  # without its strategy, no section of that name
    registry.register(toy)


def test_a_strategy_reads_its_flags_from_its_entry_alone(toy):
    """A strategy's flags are kept on its entry only: the built `Strategy` carries the entry
    (`make_strategy` sets it), so what the learner and device collection read of it cannot
    disagree with what progress lines read of the registry."""
    assert "acts_on_evaluations" not in Strategy._fields  # no second place to set it
    with pytest.raises(TypeError):
        Strategy("toy", 1, True, lambda: 0, lambda *a: a, acts_on_evaluations=False)
    config = load_config(None, ["strategy=toy"])
    built = config_lib.build_strategy(config)
    assert built.entry is toy and built.acts_on_evaluations  # the entry's default
    assert progress.late_evaluations_line(2, "toy").startswith("2 evaluation(s)")
    registry.register(toy._replace(acts_on_evaluations=False), replace=True)
    built = config_lib.build_strategy(config)
    assert built.entry is registry.get("toy") and not built.acts_on_evaluations
    assert progress.late_evaluations_line(2, "toy") is None
    for name in ("independent", "branch_merge"):  # the built-ins alike
        strategy = config_lib.build_strategy(load_config(None, [f"strategy={name}"]))
        assert strategy.entry is registry.get(name)
        assert strategy.acts_on_evaluations is registry.get(name).acts_on_evaluations
    assert not registry.get("independent").acts_on_evaluations


def test_a_registered_strategy_trains_in_process(toy, tmp_path):
    """On the device (gymnax): collector processes, spawned, would not know the toy (a plugin's
    strategy must be registered by a module every process imports)."""
    require("gymnax")  # the test extra installs it: missing is a failure
    short = ["train.total_env_steps=512", "eval.interval=256", "population.size=2"]
    device = ["env.id=gymnax/Pendulum-v1", "strategy=toy", *short]
    trained = train_here(tmp_path, TD3_PENDULUM, *QUIET, *FAST, *device)
    (rounds,) = TOY_ROUNDS
    assert rounds and trained.learner.strategy.name == "toy"
    assert (trained.run_dir / "metrics.jsonl").is_file()
