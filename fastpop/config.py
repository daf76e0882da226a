"""Run configuration: a YAML preset plus `--set section.key=value` overrides, validated.

`load_config` turns them into a frozen `Config` or raises `ConfigError` (the CLI exits with code 2)
naming the file or `--set`, the dotted field, what was wrong and what is allowed. The resolved
config (`save_config`) lists every field, defaults filled in, and loads back to an equal `Config`.

Counting conventions: env steps, replay sizes and warm-up are per member; `replay.capacity` is
one member's buffer, split into one ring lane per environment of that member. A shared buffer
(`replay.shared`) holds `capacity * population.size` transitions in `envs_per_member *
population.size` lanes, so sharing changes who samples what, not the memory of a run.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fastpop.agents import ALGORITHMS, DQNConfig, SACConfig, TD3Config


class ConfigError(ValueError):
    """A problem in a user's config: the message says where, what was wrong, what is allowed."""


def _f(default: Any, **metadata):
    """A field with its allowed values: min/max inclusive, gt exclusive, choices."""
    return dataclasses.field(default=default, metadata=metadata)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    id: str = "Pendulum-v1"
    """gymnasium id (MuJoCo v5, classic control) or Atari game (`ALE/Pong-v5`, `Pong`)."""
    atari_terminal_on_life_loss: bool = False
    """Atari training only: a lost life is a terminal step (Mnih et al.; not Machado et al.)."""


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
    size: int = _f(4, min=1)
    """Number of members, trained side by side in one program."""
    execution: str = _f("vectorized", choices=("vectorized", "sequential"))
    """vectorized: one jit(vmap(scan)) updates all members; sequential: one member per call."""


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    capacity: int = _f(100_000, min=1)
    """Transitions in one member's buffer (a shared buffer holds capacity * population.size)."""
    min_size: int = _f(1_000, min=1)
    """Transitions a member's buffer holds before learning starts."""
    samples_per_insert: float = _f(256.0, gt=0)
    """Sampled per inserted transition: batch_size * updates / inserts (batch_size: 1 per step)."""
    tolerance: float = _f(0.2, min=0)
    """Fraction of samples_per_insert the learner may run ahead or behind before it is blocked."""
    shared: bool = False
    """One buffer filled by and sampled for all members instead of one buffer per member."""


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    num_collectors: int = _f(2, min=1)
    """Collector processes; each steps at least one environment."""
    envs_per_member: int = _f(1, min=1)
    """Environments (and replay lanes) per member."""
    warmup_steps: int = _f(1_000, min=0)
    """Env steps per member taken with uniformly random actions before the policy acts."""
    chunk_len: int = _f(32, min=1)
    """Rows per transition chunk and environment sent from collectors to the learner."""
    ring_slots: int = _f(64, min=2)
    """Chunks the shared-memory ring between collectors and the learner holds."""
    max_restarts: int = _f(3, min=0)
    """Times a crashed collector is restarted before the run fails."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    total_env_steps: int = _f(20_000, min=1)
    """Env steps per member (warm-up included) after which training stops."""
    updates_per_call: int = _f(50, min=1)
    """Updates per member in one compiled call (K of the scan)."""
    max_wall_seconds: float | None = _f(None, gt=0)
    """Stop (with a checkpoint) after this many seconds; null: no limit."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    interval: int = _f(5_000, min=1)
    """Env steps per member between evaluations."""
    episodes: int = _f(5, min=1)
    """Episodes per member and evaluation, acting without exploration."""


@dataclasses.dataclass(frozen=True)
class LogConfig:
    progress_interval_seconds: float = _f(2.0, gt=0)
    """Seconds between progress lines on the terminal."""
    tensorboard: bool = True
    """Also write TensorBoard event files (metrics.jsonl is always written)."""


@dataclasses.dataclass(frozen=True)
class Config:
    name: str = "run"
    """Run name; outputs go to results/runs/<name> unless --out is given."""
    seed: int = _f(0, min=0)
    """Seeds everything: networks, environments, action noise, replay sampling, strategies."""
    algo: str = _f("td3", choices=ALGORITHMS)
    """Member algorithm."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Environment every member trains and is evaluated on."""
    agent: dict = dataclasses.field(default_factory=dict)
    """Static fields of the algo's TD3Config/SACConfig/DQNConfig (network sizes, batch size)."""
    hparams: dict = dataclasses.field(default_factory=dict)
    """Initial values of the algo's HParams for every member; target_entropy null means -|A|."""
    population: PopulationConfig = dataclasses.field(default_factory=PopulationConfig)
    """Population size and executor."""
    replay: ReplayConfig = dataclasses.field(default_factory=ReplayConfig)
    """Replay buffers and the samples-per-insert rate limiter."""
    collect: CollectConfig = dataclasses.field(default_factory=CollectConfig)
    """Collector processes and environments."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Run length and update batching."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Periodic evaluation."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Terminal and TensorBoard output."""


_AGENT_CONFIGS = {"td3": TD3Config, "sac": SACConfig, "dqn": DQNConfig}
_SCALARS = ("name", "seed", "algo")
_TABLES = ("agent", "hparams")  # sections whose keys depend on the algo
_TOP = {f.name: f.default_factory for f in dataclasses.fields(Config)}
_AGENT_RANGES = {"hidden_sizes": {"min": 1}, "batch_size": {"min": 1}}
# HParams whose default depends on the environment; null in a config means that default.
_ENV_DEPENDENT_HPARAMS = frozenset({"target_entropy"})
Specs = dict[str, tuple[Any, Any, Any]]  # field name -> (type, allowed values, default)


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-3` (no dot) as a string; here it is a float, as users mean."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
_NUMBER = re.compile(r"^\s*[-+]?(?:[0-9][0-9_]*\.?[0-9_]*|\.[0-9_]+)(?:[eE][-+]?[0-9]+)?\s*$")


def _specs(cls: type) -> Specs:
    hints = typing.get_type_hints(cls)
    return {f.name: (hints[f.name], f.metadata, f.default) for f in dataclasses.fields(cls)}


def _hparam_range(name: str) -> dict:
    if name.endswith("_lr") or name == "learning_rate" or "noise" in name:
        return {"min": 0.0}  # a zero learning rate freezes a member, e.g. as a control
    if name.endswith(("_steps", "_period", "_delay")):
        return {"min": 1}
    unit = {"min": 0.0, "max": 1.0}
    return {"discount": unit, "tau": unit, "epsilon_start": unit, "epsilon_end": unit}.get(
        name, {"gt": 0.0} if name == "reward_scale" else {}
    )


@functools.cache
def _table_specs(section: str, algo: str) -> Specs:
    """The agent or hparams fields of `algo`."""
    if section == "agent":
        return {
            name: (tp, _AGENT_RANGES.get(name, {"gt": 0.0} if tp is float else {}), default)
            for name, (tp, _, default) in _specs(_AGENT_CONFIGS[algo]).items()
        }
    from fastpop.agents import make_agent
    from fastpop.types import EnvSpec

    # Any spec gives the defaults that do not depend on the environment.
    probe = EnvSpec((1,), num_actions=2) if algo == "dqn" else EnvSpec((1,), action_dim=1)
    specs = {}
    for name, value in make_agent(algo, probe).default_hparams()._asdict().items():
        value, allowed = np.asarray(value), _hparam_range(name)
        if name in _ENV_DEPENDENT_HPARAMS:
            specs[name] = (float | None, allowed, None)
        elif np.issubdtype(value.dtype, np.integer):
            specs[name] = (int, allowed, int(value))
        else:  # the shortest float32 repr: 3e-4, not 0.00030000001424923539
            specs[name] = (float, allowed, float(str(value)))
    return specs


class _Reader:
    """Where each raw value came from (the file or a --set), for error messages."""

    def __init__(self, source: str | None, origins: dict[str, str]):
        self.source, self.origins = source, origins

    def origin(self, dotted: str) -> str | None:
        for key, origin in reversed(self.origins.items()):  # the last --set touching it
            if dotted in (key, key.split(".")[0]) or key in (dotted, dotted.split(".")[0]):
                return origin
        return self.source

    def fail(self, dotted: str, problem: str) -> typing.NoReturn:
        origin = self.origin(dotted)
        if origin is not None:
            problem += f" ({'from' if origin.startswith('--set') else 'in'} {origin})"
        raise ConfigError(f"{dotted}: {problem}")

    def unknown(self, dotted: str, valid: Sequence[str], context: str = "") -> typing.NoReturn:
        section, _, key = dotted.rpartition(".")
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"valid keys{context}: {', '.join(valid)}"
        if close:
            hint = f"did you mean {(f'{section}.' if section else '') + close[0]!r}?"
        origin = self.origin(dotted)
        raise ConfigError(f"unknown key {dotted!r}{f' in {origin}' if origin else ''}; {hint}")


def _show(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return str(value).lower().replace("none", "null")
    return repr(value)


def _coerce(r: _Reader, dotted: str, value: Any, tp: Any, allowed: Any) -> Any:
    """The value as type `tp`, checked against `allowed` (min, max, gt, choices)."""
    if typing.get_origin(tp) is types.UnionType:  # X | None
        if value is None:
            return None
        tp = next(arg for arg in typing.get_args(tp) if arg is not type(None))
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, list | tuple) or not value:
            r.fail(
                dotted, f"expected a non-empty list of integers like [256, 256], got {_show(value)}"
            )
        return tuple(_coerce(r, dotted, item, int, allowed) for item in value)
    if tp is bool and not isinstance(value, bool):
        r.fail(dotted, f"expected true or false, got {_show(value)}")
    if tp is str and not isinstance(value, str):
        r.fail(dotted, f"expected a string, got {_show(value)}")
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 1e6
        if isinstance(value, bool) or not isinstance(value, int):
            r.fail(dotted, f"expected an integer, got {_show(value)}")
    if tp is float:
        if isinstance(value, str) and _NUMBER.match(value):
            value = float(value.replace("_", ""))  # '3e-4' from plain YAML 1.1
        if isinstance(value, bool) or not isinstance(value, int | float):
            r.fail(dotted, f"expected a number, got {_show(value)}")
        if not math.isfinite(value := float(value)):
            r.fail(dotted, f"expected a finite number, got {value}")
    if "choices" in allowed and value not in allowed["choices"]:
        r.fail(dotted, f"must be one of {', '.join(allowed['choices'])}, got {value!r}")
    low, high = allowed.get("min"), allowed.get("max")
    if low is not None and high is not None and not low <= value <= high:
        r.fail(dotted, f"must be in [{low:g}, {high:g}], got {value}")
    if low is not None and value < low:
        r.fail(dotted, f"must be >= {low:g}, got {value}")
    if "gt" in allowed and value <= allowed["gt"]:
        r.fail(dotted, f"must be > {allowed['gt']:g}, got {value}")
    return value


def _fields(r: _Reader, section: str, raw: Any, specs: Specs, context: str = "") -> dict:
    prefix, raw = f"{section}." if section else "", {} if raw is None else raw
    if not isinstance(raw, dict):
        r.fail(section, f"expected a mapping of keys to values, got {_show(raw)}")
    for key in raw:
        if key not in specs:
            r.unknown(f"{prefix}{key}", list(specs), context)
    return {
        name: _coerce(r, f"{prefix}{name}", raw[name], tp, allowed) if name in raw else default
        for name, (tp, allowed, default) in specs.items()
    }


def _build(raw: dict, r: _Reader) -> Config:
    for key in raw:
        if key not in _TOP:
            r.unknown(str(key), list(_TOP))
    scalars = {name: spec for name, spec in _specs(Config).items() if name in _SCALARS}
    values = _fields(r, "", {k: v for k, v in raw.items() if k in _SCALARS}, scalars)
    if "/" in values["name"] or values["name"] in ("", ".", ".."):
        r.fail("name", f"must be a non-empty name without '/', got {values['name']!r}")
    algo = values["algo"]
    for name, factory in _TOP.items():
        if name in _TABLES:
            specs = _table_specs(name, algo)
            values[name] = _fields(r, name, raw.get(name), specs, f" for algo {algo}")
        elif name not in _SCALARS:
            values[name] = factory(**_fields(r, name, raw.get(name), _specs(factory)))
    values["env"] = dataclasses.replace(values["env"], id=_check_env(r, values["env"].id))
    config = Config(**values)
    _check_consistency(r, config)
    return config


def _check_env(r: _Reader, env_id: str) -> str:
    from fastpop import envs

    try:
        return envs.check_env_id(env_id)
    except ValueError as error:  # UnknownEnvironment, MissingExtra: their messages say it all
        r.fail("env.id", str(error))


def _check_consistency(r: _Reader, c: Config) -> None:
    lanes, capacity, chunk_len = c.collect.envs_per_member, c.replay.capacity, c.collect.chunk_len
    num_envs, min_capacity = c.population.size * lanes, max(chunk_len, 2) * lanes
    checks = (
        ("collect.num_collectors", c.collect.num_collectors > num_envs,
         f"must be <= population.size * collect.envs_per_member = {num_envs} (each collector "
         f"steps at least one environment), got {c.collect.num_collectors}"),
        ("replay.capacity", capacity % lanes,
         f"must be a multiple of collect.envs_per_member ({lanes}, one replay lane per "
         f"environment), got {capacity}; e.g. {max(capacity // lanes, 1) * lanes}"),
        ("replay.capacity", capacity < min_capacity,
         f"must be >= collect.chunk_len * collect.envs_per_member = {min_capacity} "
         f"(one chunk per lane), got {capacity}"),
        ("replay.min_size", c.replay.min_size > capacity,
         f"must be <= replay.capacity ({capacity}), got {c.replay.min_size}"),
    )  # fmt: skip
    for field, violated, problem in checks:
        if violated:
            r.fail(field, problem)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        siblings = [str(p) for p in path.parent.glob("*.y*ml")] if path.parent.is_dir() else []
        close = difflib.get_close_matches(str(path), siblings, n=1, cutoff=0.6)
        raise ConfigError(
            f"config file {path} does not exist{f'; did you mean {close[0]}?' if close else ''}"
        )
    try:
        raw = yaml.load(path.read_text(), Loader=_Loader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if raw is not None and not isinstance(raw, dict):
        raise ConfigError(
            f"{path}: expected a mapping of sections (algo, env, ...), got {_show(raw)}"
        )
    return raw or {}


def _apply_override(raw: dict, text: str, origins: dict[str, str]) -> None:
    key, sep, value_text = text.partition("=")
    parts = (key := key.strip()).split(".")
    if not sep or len(parts) > 2 or not all(parts) or key in set(_TOP) - set(_SCALARS):
        raise ConfigError(f"--set {key or text}: expected section.key=value (or seed=value)")
    try:
        value = yaml.load(value_text, Loader=_Loader)
    except yaml.YAMLError as error:
        raise ConfigError(f"--set {text}: the value is not valid YAML: {error}") from None
    origins[key] = f"--set {text}"
    if len(parts) == 1:
        raw[key] = value
    elif isinstance(raw.setdefault(parts[0], {}) or {}, dict):  # else validation reports it
        raw[parts[0]] = {**(raw[parts[0]] or {}), parts[1]: value}


def config_from_dict(
    data: dict, source: str | None = None, overrides: Sequence[str] = ()
) -> Config:
    """Validate plain data (as in a YAML file) into a Config; `source` names it in errors."""
    raw, origins = dict(data), {}
    for text in overrides:
        _apply_override(raw, text, origins)
    return _build(raw, _Reader(source, origins))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """The preset at `path` (defaults where None) with `--set` overrides applied, validated."""
    raw = {} if path is None else _read_yaml(Path(path))
    return config_from_dict(raw, None if path is None else str(path), overrides)


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data (every field, tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(config)))


class _Dumper(yaml.SafeDumper):
    """Block style, except lists (hidden_sizes) on one line."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, True)
)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config(path)` reads back an equal Config."""
    text = yaml.dump(config_to_dict(config), Dumper=_Dumper, sort_keys=False)
    Path(path).write_text(f"# resolved fastpop config (all defaults filled in)\n{text}")


def agent_config(config: Config) -> TD3Config | SACConfig | DQNConfig:
    """The algo's static config dataclass (pass it to make_td3/make_sac/make_dqn)."""
    return _AGENT_CONFIGS[config.algo](**config.agent)


def default_member_hparams(config: Config, agent) -> Any:
    """One member's HParams: the agent's defaults with the config's values (dtypes kept)."""
    import jax.numpy as jnp

    defaults = agent.default_hparams()
    values = {
        name: jnp.asarray(value, getattr(defaults, name).dtype)
        for name, value in config.hparams.items()
        if value is not None  # null: the agent's environment-dependent default
    }
    return defaults._replace(**values)


def atari_options(config: Config):
    """The `AtariOptions` of this config's training environments (None for other envs)."""
    from fastpop.envs import AtariOptions

    if not config.env.id.startswith("ALE/"):
        return None
    return AtariOptions(terminal_on_life_loss=config.env.atari_terminal_on_life_loss)


def replay_layout(config: Config) -> tuple[int, int]:
    """(capacity, lanes) of one replay buffer: per member, or the one shared by all members."""
    size, lanes = config.population.size, config.collect.envs_per_member
    if config.replay.shared:
        return config.replay.capacity * size, lanes * size
    return config.replay.capacity, lanes


def memory_estimate(config: Config, env_spec, available_bytes: int | None = None):
    """`fastpop.replay.memory_estimate` of this config's buffers (see `replay_layout`)."""
    from fastpop import replay

    capacity, lanes = replay_layout(config)
    size, shared = config.population.size, config.replay.shared
    return replay.memory_estimate(env_spec, capacity, lanes, size, shared, available_bytes)
