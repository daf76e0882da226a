"""A plugin as a user would write one: a module of its own, named in a config's `plugins:`, that
registers an algorithm fastpop does not have (`plugin_toy`: TD3 under another name, with its
own config field). Importing it registers it; tests/test_plugins.py takes it out again."""

from __future__ import annotations

import dataclasses

from fastpop.agents import TD3Config, make_td3, registry
from fastpop.agents.base import AlgorithmEntry
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
