"""A plugin as a user would write one: a module of its own, named in a config's `plugins:`, that
registers an algorithm and a strategy fastpop does not have (`plugin_toy`: TD3 under another
name, with its own config field; `plugin_toy_strategy`: the worst members continue from the
best, with a config section of its own). Importing it registers them; tests/test_plugins.py
takes them out again."""

from __future__ import annotations

import dataclasses

import numpy as np

from fastpop.agents import TD3Config, make_td3, registry
from fastpop.agents.base import AlgorithmEntry
from fastpop.strategies import registry as strategies
from fastpop.strategies.base import Selection, Strategy, StrategyEntry
from fastpop.types import EnvSpec

NAME = "plugin_toy"


@dataclasses.dataclass(frozen=True)
class PluginToyConfig(TD3Config):
    """TD3's static fields and one of the toy's own."""

    toy_width: int = 8
    """Width of the toy's one hidden layer (hidden_sizes is ignored)."""


def make_plugin_toy(spec: EnvSpec, config: PluginToyConfig):
    td3 = TD3Config(hidden_sizes=(config.toy_width,), batch_size=config.batch_size)
    return make_td3(spec, td3)._replace(name=NAME)


ENTRY = AlgorithmEntry(
    name=NAME,
    make=make_plugin_toy,
    config_type=PluginToyConfig,
    actions="continuous",
    numpy_policy="deterministic",
    deterministic_action="the plugin toy's actor",
)
if NAME not in registry.NAMES:
    registry.register(ENTRY)


STRATEGY = "plugin_toy_strategy"


@dataclasses.dataclass(frozen=True)
class PluginToyStrategyConfig:
    """The strategy's section: `plugin_toy_strategy:` at a preset's top level."""

    replaced: int = 1
    """Members, the worst first, that continue from the best one's state each round."""


def make_plugin_toy_strategy(setting) -> Strategy:
    """Every round the worst members continue from the best one's state: PBT without explore."""
    size, replaced = setting.population.size, setting.section.replaced

    def step(state, evaluation, hparams):
        returns = np.nan_to_num(np.asarray(evaluation.returns, float), nan=-np.inf)
        order = np.argsort(returns, kind="stable")
        sources = np.arange(size)
        sources[order[:replaced]] = order[-1]
        return state + 1, Selection(sources, hparams, [])

    return Strategy(STRATEGY, setting.evaluation_interval, True, lambda: 0, step)


STRATEGY_ENTRY = StrategyEntry(
    name=STRATEGY,
    make=make_plugin_toy_strategy,
    config_type=PluginToyStrategyConfig,
    replayable=False,
)
if STRATEGY not in strategies.NAMES:
    strategies.register(STRATEGY_ENTRY)
