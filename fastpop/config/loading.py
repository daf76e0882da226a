"""A preset read into a `Config`, and a `Config` written back: YAML plus `--set section.key=value`
overrides, validated.

`load_config` turns them into a frozen `Config` or raises `ConfigError` (the CLI exits with code 2)
naming the file or `--set`, the dotted field, what was wrong and what is allowed. The resolved
config (`save_config`) lists every field, defaults filled in, and loads back to an equal `Config`.
The agent's and hparams' fields are the algo's (its registry entry); each registered strategy's
section is read at the top level under the strategy's name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fastpop.agents import registry
from fastpop.agents.critics import ACTOR_QS, CRITICS
from fastpop.agents.mlp_kernels import MLP_KERNELS, PALLAS_LAYERS, tiles_problem
from fastpop.agents.networks import COMPUTE_DTYPES, NETWORKS, TORSOS
from fastpop.config.env import (
    EnvConfig,
    check_algo_fits_env,
    check_collection,
    check_env,
    collection_mode,
)
from fastpop.config.plugins import import_plugins
from fastpop.config.sections import Config
from fastpop.schema import (
    ConfigError,
    Loader,
    Reader,
    Specs,
    field_specs,
    read_fields,
    read_yaml,
)
from fastpop.strategies import registry as strategies
from fastpop.strategies.config import check_member_hparams, check_strategy

__all__ = ["config_from_dict", "config_to_dict", "load_config", "save_config"]


_SCALARS = ("plugins", "name", "seed", "algo", "strategy")
_TABLES = ("agent", "hparams")  # sections whose keys depend on the algo
_STRATEGY_SECTIONS = "strategy_sections"  # written as one top-level section per strategy
_TOP = {f.name: f.default_factory for f in dataclasses.fields(Config)}
_AGENT_RANGES = {
    "hidden_sizes": {"min": 1},
    "actor_hidden_sizes": {"min": 1},
    "batch_size": {"min": 1},
    "n_step": {"min": 1},
    "torso": {"choices": TORSOS},
    "compute_dtype": {"choices": COMPUTE_DTYPES},
    "critic": {"choices": CRITICS},
    "num_atoms": {"min": 2},
    "v_min": {},  # any return; v_max above it (`_check_consistency`)
    "v_max": {},
    "network": {"choices": NETWORKS},
    "mlp_kernel": {"choices": MLP_KERNELS},
    "mlp_kernel_tiles": {"min": 1},
    "weight_decay": {"min": 0.0},
    "actor_q": {"choices": ACTOR_QS},
    "exploration_std_min": {"min": 0.0},
    "actor_output_init_std": {"min": 0.0},
}
# HParams whose default depends on the environment; null in a config means that default.
_ENV_DEPENDENT_HPARAMS = frozenset({"target_entropy"})
# A member's n of n-step returns: null means agent.n_step, the window the replay gathers and
# the most any member may take.
_N_STEP = "n_step"
# A distributional critic's support per member: null means agent.v_min / v_max for every
# member, a constant of the program (the HParams field is None).
_SUPPORT_ENDS = ("v_min", "v_max")


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
            for name, (tp, _, default) in field_specs(registry.get(algo).config_type).items()
        }
    from fastpop.agents import make_agent
    from fastpop.types import EnvSpec

    # Any spec gives the defaults that do not depend on the environment.
    discrete = registry.get(algo).actions == "discrete"
    probe = EnvSpec((1,), num_actions=2) if discrete else EnvSpec((1,), action_dim=1)
    specs = {}
    for name, value in make_agent(algo, probe).default_hparams()._asdict().items():
        value, allowed = np.asarray(value), _hparam_range(name)
        if name in _ENV_DEPENDENT_HPARAMS or name in _SUPPORT_ENDS:
            specs[name] = (float | None, allowed, None)
        elif name == _N_STEP:
            specs[name] = (int | None, {"min": 1}, None)  # `_with_agent_ranges`
        elif np.issubdtype(value.dtype, np.integer):
            specs[name] = (int, allowed, int(value))
        else:  # the shortest float32 repr: 3e-4, not 0.00030000001424923539
            specs[name] = (float, allowed, float(str(value)))
    return specs


def _with_agent_ranges(specs: Specs, agent: dict) -> Specs:
    """The hparams' specs where the agent's config bounds them: a member's n_step is at most
    agent.n_step (its replay gathers that many rows; a member takes the first n_step)."""
    if _N_STEP not in specs:
        return specs
    most = agent.get(_N_STEP, 1)
    return {**specs, _N_STEP: (int | None, {"min": 1, "max": most}, None)}


def _section_types() -> dict[str, type]:
    """The registered strategies' section types by name: the top-level sections they add."""
    return {e.name: e.config_type for e in strategies.entries() if e.config_type is not None}


def _top_level_keys() -> list[str]:
    """What a preset may hold at its top level, in the order a saved config writes it."""
    keys = []
    for name in _TOP:
        keys.extend(_section_types() if name == _STRATEGY_SECTIONS else [name])
    return keys


def _read_section(r: Reader, name: str, raw: Any, section_type: type):
    """One section of the preset, validated into its frozen dataclass."""
    return section_type(**read_fields(r, name, raw, field_specs(section_type)))


def _build(raw: dict, r: Reader) -> Config:
    specs = field_specs(Config)
    # The plugins first: what they register is what `algo`, `strategy` and the sections name.
    plugins = read_fields(
        r, "", {k: v for k, v in raw.items() if k == "plugins"}, {"plugins": specs["plugins"]}
    )["plugins"]
    import_plugins(r, plugins)
    allowed = _top_level_keys()
    for key in raw:
        if key not in allowed:
            r.unknown(str(key), allowed)
    scalars = {name: spec for name, spec in specs.items() if name in _SCALARS}
    values = read_fields(r, "", {k: v for k, v in raw.items() if k in _SCALARS}, scalars)
    if "/" in values["name"] or values["name"] in ("", ".", ".."):
        r.fail("name", f"must be a non-empty name without '/', got {values['name']!r}")
    algo = values["algo"]
    # The env first: whether it suits the algorithm says more than the hparams' keys would.
    env = EnvConfig(**read_fields(r, "env", raw.get("env"), field_specs(EnvConfig)))
    values["env"] = check_env(r, env)
    check_algo_fits_env(r, algo, values["env"].id)
    for name, factory in _TOP.items():
        if name in _TABLES:
            specs = _table_specs(name, algo)
            if name == "hparams":
                specs = _with_agent_ranges(specs, values["agent"])
            values[name] = read_fields(r, name, raw.get(name), specs, f" for algo {algo}")
        elif name == _STRATEGY_SECTIONS:
            values[name] = {
                strategy: _read_section(r, strategy, raw.get(strategy), section_type)
                for strategy, section_type in _section_types().items()
            }
        elif name not in _SCALARS and name != "env":
            values[name] = _read_section(r, name, raw.get(name), factory)
    given = raw["population"] if isinstance(raw.get("population"), dict) else {}
    specs = _with_agent_ranges(_table_specs("hparams", algo), values["agent"])
    population, strategy = values["population"], values["strategy"]
    values["population"] = check_member_hparams(r, population, specs, set(given), strategy)
    sections = values[_STRATEGY_SECTIONS]
    for entry in strategies.entries():  # every section is read, whether or not it runs
        if entry.resolve_section is not None:
            section = sections[entry.name]
            sections[entry.name] = entry.resolve_section(r, section, specs, Config(**values))
    config = Config(**values)
    check_collection(r, config)
    check_strategy(r, config)
    _check_consistency(r, config)
    return config


def _check_consistency(r: Reader, c: Config) -> None:
    lanes, capacity, chunk_len = c.collect.envs_per_member, c.replay.capacity, c.collect.chunk_len
    num_envs, min_capacity = c.population.size * lanes, max(chunk_len, 2) * lanes
    tiles = tiles_problem(c.agent.get("mlp_kernel_tiles"))
    checks = (
        ("collect.num_collectors",
         collection_mode(c) == "processes" and c.collect.num_collectors > num_envs,
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
        ("agent.v_max", c.agent.get("v_max", 1.0) <= c.agent.get("v_min", 0.0),
         f"must be > agent.v_min ({c.agent.get('v_min')}): the distributional critic's "
         f"support runs from v_min to v_max, got {c.agent.get('v_max')}"),
        ("agent.mlp_kernel",
         c.agent.get("mlp_kernel") == "pallas"
         and (c.agent.get("layer_norm") or c.agent.get("network", "mlp") != "mlp"),
         f"{PALLAS_LAYERS}, got agent.network "
         f"{c.agent.get('network', 'mlp')} and agent.layer_norm "
         f"{str(bool(c.agent.get('layer_norm'))).lower()}"),
        ("agent.mlp_kernel_tiles", tiles is not None, tiles),
        *(
            (f"agent.{name}",
             c.agent.get("network") in ("residual", "simbav2")
             and len(set(c.agent.get(name) or ())) > 1,
             f"must be equal widths with agent.network: {c.agent.get('network')} (the width of "
             "each residual block, whose output is added to its input), got "
             f"{list(c.agent.get(name) or ())}")
            for name in ("hidden_sizes", "actor_hidden_sizes")
        ),
    )  # fmt: skip
    for dotted, violated, problem in checks:
        if violated:
            r.fail(dotted, problem)
    _check_member_supports(r, c)


def _support_end_range(c: Config, end: str) -> tuple[str, float, float] | None:
    """(where it is set, lowest, highest) of a member's v_min or v_max over its possible values
    (hparams, grid or prior); None where every member keeps the agent's."""
    from fastpop.strategies.priors import parse_prior

    if (prior := c.population.priors.get(end)) is not None:
        prior = parse_prior(end, prior)
        values = prior.values or (prior.low, prior.high)
        return f"population.priors.{end}", min(values), max(values)
    if values := c.population.grid.get(end):
        return f"population.grid.{end}", min(values), max(values)
    if c.hparams.get(end) is not None:
        return f"hparams.{end}", c.hparams[end], c.hparams[end]
    return None


def _check_member_supports(r: Reader, c: Config) -> None:
    """v_min and v_max per member: only for a distributional critic, and every member's below
    its v_max whatever the strategy draws (PBT's explore stays inside the priors)."""
    ranges = {end: _support_end_range(c, end) for end in _SUPPORT_ENDS if end in c.hparams}
    named = {end: found for end, found in ranges.items() if found is not None}
    if named and c.agent.get("critic") != "distributional":
        where = next(iter(named.values()))[0]
        r.fail(
            where,
            "sets a distributional critic's support per member: needs agent.critic: "
            f"distributional (got {c.agent.get('critic')!r})",
        )
    if not named:
        return
    lows = named.get("v_min") or ("agent.v_min", c.agent["v_min"], c.agent["v_min"])
    highs = named.get("v_max") or ("agent.v_max", c.agent["v_max"], c.agent["v_max"])
    if lows[2] >= highs[1]:
        r.fail(
            lows[0] if "v_min" in named else highs[0],
            f"lets v_min ({lows[0]}) reach {lows[2]}, not below the lowest v_max "
            f"({highs[1]}, {highs[0]}): every member's support must run from its v_min up "
            "to its v_max",
        )


def _apply_override(raw: dict, text: str, origins: dict[str, str]) -> None:
    key, sep, value_text = text.partition("=")
    parts = (key := key.strip()).split(".")
    sections = set(_top_level_keys()) - set(_SCALARS)
    if not sep or len(parts) > 2 or not all(parts) or key in sections:
        raise ConfigError(f"--set {key or text}: expected section.key=value (or seed=value)")
    try:
        value = yaml.load(value_text, Loader=Loader)
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
    return _build(raw, Reader(source, origins))


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """The preset at `path` (defaults where None) with `--set` overrides applied, validated."""
    raw = {} if path is None else read_yaml(Path(path))
    return config_from_dict(raw, None if path is None else str(path), overrides)


def config_to_dict(config: Config) -> dict:
    """The resolved config as plain data (every field, tuples as lists), each strategy's
    section at the top level, as a preset writes it."""
    fields = json.loads(json.dumps(dataclasses.asdict(config)))
    data = {}
    for name, value in fields.items():
        data.update(value if name == _STRATEGY_SECTIONS else {name: value})
    return data


class _Dumper(yaml.SafeDumper):
    """Block style, except lists (hidden_sizes) on one line."""


_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, True)
)


def save_config(config: Config, path: str | Path) -> None:
    """Write the resolved config as YAML; `load_config(path)` reads back an equal Config."""
    text = yaml.dump(config_to_dict(config), Dumper=_Dumper, sort_keys=False)
    Path(path).write_text(f"# resolved fastpop config (all defaults filled in)\n{text}")
