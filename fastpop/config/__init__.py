"""The run configuration: sections (frozen dataclasses, `sections.py`), YAML loading, `--set`
overrides, validation and the resolved YAML written back (`loading.py`), the env section
(`env.py`) and the one front door that turns a config into a run's parts (`build.py`).

Callers import the package (`from fastpop import config as config_lib`); this face re-exports
what they use.
"""

from fastpop.config.build import (
    atari_options,
    build_strategy,
    default_member_hparams,
    initial_hparams,
    member_overrides,
    memory_estimate,
    replay_layout,
    strategy_setting,
)
from fastpop.config.env import (
    COLLECTION_MODES,
    EnvConfig,
    collection_mode,
)
from fastpop.config.loading import config_from_dict, config_to_dict, load_config, save_config
from fastpop.config.sections import (
    CheckpointConfig,
    CollectConfig,
    Config,
    EvalConfig,
    LogConfig,
    PopulationConfig,
    ReplayConfig,
    TrainConfig,
)
from fastpop.schema import (
    ConfigError,
)

__all__ = [
    "COLLECTION_MODES",
    "CheckpointConfig",
    "CollectConfig",
    "Config",
    "ConfigError",
    "EnvConfig",
    "EvalConfig",
    "LogConfig",
    "PopulationConfig",
    "ReplayConfig",
    "TrainConfig",
    "atari_options",
    "build_strategy",
    "collection_mode",
    "config_from_dict",
    "config_to_dict",
    "default_member_hparams",
    "initial_hparams",
    "load_config",
    "member_overrides",
    "memory_estimate",
    "replay_layout",
    "save_config",
    "strategy_setting",
]
