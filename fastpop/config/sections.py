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
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from fastpop.agents import registry
from fastpop.agents.networks import COMPUTE_DTYPES, TORSOS
from fastpop.config.env import (
    COLLECTION_MODES,
    EnvConfig,
    check_algo_fits_env,
    check_collection,
    check_env,
    collection_mode,
)
from fastpop.config.plugins import import_plugins
from fastpop.schema import (
    ConfigError,
    Loader,
    Reader,
    Specs,
    field,
    field_specs,
    read_fields,
    read_yaml,
)
from fastpop.strategies import registry as strategies
from fastpop.strategies.config import (
    BranchMergeConfig,
    CEMRLConfig,
    DvDConfig,
    HalvingConfig,
    PB2Config,
    PBTConfig,
    check_member_hparams,
    check_strategy,
)
from fastpop.strategies.schedule import ScheduleConfig

__all__ = ["Config", "ConfigError", "config_from_dict", "load_config", "save_config"]


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
    size: int = field(4, min=1)
    """Number of members, trained side by side in one program."""
    execution: str = field("vectorized", choices=("vectorized", "sequential"))
    """vectorized: one jit(vmap(scan)) updates all members; sequential: one member per call.
    An Atari agent on a CPU (one device) is always updated member by member (faster there)."""
    grid: dict = dataclasses.field(default_factory=dict)
    """hparam -> list of values: members take every combination (in the order written, the last
    hparam varying fastest). population.size follows, or is a multiple (repeats, other seeds)."""
    priors: dict = dataclasses.field(default_factory=dict)
    """hparam -> prior ({log_uniform: [lo, hi]}, {uniform: ...}, {int_uniform: ...}, {choice:
    [...]}): each member samples its initial value; PBT's explore stays inside the prior."""
    seeds: int = field(1, min=1)
    """Independent seeds of every configuration (a grid combination, one set of prior draws, or
    the config itself): member c * seeds + s is seed s of configuration c, with the same hparams
    and its own network init, environment and noise seeds; members.json records both indices.
    Given: population.size = configurations * seeds (size follows when not given; with priors
    every size / seeds members share one draw). Not given: 1 with priors (each member draws its
    own), else population.size / grid combinations (members with equal hparams are seeds of one
    configuration). pbt, branch_merge, cemrl, dvd: 1 (their members interact)."""
    devices: Any = 1
    """Devices the members are split over, population.size / devices on each (the shared
    replay and CEM-RL's and DvD's critic are replicated on every one): 1, an integer dividing
    population.size, or all (every device JAX sees); vectorized execution, either collection
    mode (device mode: each device steps its own members' envs)."""


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    capacity: int = field(100_000, min=1)
    """Transitions in one member's buffer (a shared buffer holds capacity * population.size)."""
    min_size: int = field(1_000, min=1)
    """Transitions a member's buffer holds before learning starts."""
    samples_per_insert: float = field(256.0, gt=0)
    """Sampled per inserted transition: batch_size * updates / inserts (batch_size: 1 per step)."""
    tolerance: float = field(0.2, min=0)
    """Fraction of samples_per_insert the learner may run ahead or behind before it is blocked."""
    shared: bool = False
    """One buffer filled by and sampled for all members instead of one buffer per member."""


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    num_collectors: int = field(2, min=1)
    """Collector processes; each steps at least one environment."""
    envs_per_member: int = field(1, min=1)
    """Environments (and replay lanes) per member."""
    warmup_steps: int = field(1_000, min=0)
    """Env steps per member taken with uniformly random actions before the policy acts
    (collector processes: rounded up to whole chunks per env)."""
    chunk_len: int = field(32, min=1)
    """Rows per transition chunk and environment sent from collectors to the learner."""
    ring_slots: int = field(64, min=2)
    """Chunks the shared-memory ring between collectors and the learner holds."""
    max_restarts: int = field(3, min=0)
    """Times a crashed collector is restarted before the run fails."""
    mode: str | None = field(None, choices=COLLECTION_MODES)
    """processes: collector processes step gymnasium envs; device: brax envs stepped inside the
    compiled loop on the device (num_collectors, ring_slots, max_restarts unused). null: device
    for brax ids, processes for the rest (each env runs in one mode only): `collection_mode`."""
    atari_vector: bool = True
    """Atari: collectors step ale_py's AtariVectorEnv (envs/atari_vector.py), else gymnasium."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    total_env_steps: int = field(20_000, min=1)
    """Env steps per member (warm-up included) after which training stops."""
    updates_per_call: int = field(50, min=1)
    """Updates per member in one update call (K of the scan; Atari frames on a CPU: K calls of
    a one-update program, `population.updates_per_program`)."""
    max_wall_seconds: float | None = field(None, gt=0)
    """Stop (with a checkpoint) after this many seconds; null: no limit."""
    compile_cache: bool = True
    """Keep compiled programs in JAX's persistent compilation cache (under ~/.cache/fastpop), so
    that a rerun starts in seconds; false: compile everything anew
    (fastpop/compilation/compile_cache.py)."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    interval: int = field(5_000, min=1)
    """Env steps per member between evaluations."""
    episodes: int = field(5, min=1)
    """Episodes per member and evaluation, acting without exploration."""


@dataclasses.dataclass(frozen=True)
class LogConfig:
    progress_interval_seconds: float = field(2.0, gt=0)
    """Seconds between progress lines on the terminal."""
    tensorboard: bool = True
    """Also write TensorBoard event files (metrics.jsonl is always written), and at the end one
    HParams session per member (initial hparams against final and best return) in <run>/hparams."""
    wandb: str | None = field(None, choices=("online", "offline"))
    """Mirror metrics, learner scalars, lineage and member hparams into one Weights & Biases run
    (pip install -e '.[wandb]'): online, or offline (files in <run>/wandb, `wandb sync` them
    later); null: no W&B. A resume continues the same W&B run (its id is in <run>/wandb.json)."""
    wandb_project: str = "fastpop"
    """W&B project of the run (log.wandb)."""
    wandb_entity: str | None = None
    """W&B team or user the run belongs to; null: the logged-in user's default entity."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    interval_seconds: float | None = field(600.0, gt=0)
    """Wall seconds between checkpoints; null: none on a timer."""
    interval_env_steps: int | None = field(None, min=1)
    """Env steps per member between checkpoints; null: none by steps. A checkpoint is written
    when either interval is due, and always when the run stops (completed, Ctrl-C, SIGTERM,
    a worker failing beyond its restarts)."""
    keep: int = field(3, min=1)
    """Newest complete checkpoints kept in <run>/checkpoints."""
    replay: bool = True
    """Save the replay buffers too: a resumed run then updates exactly as an uninterrupted one
    would; false: smaller, faster checkpoints, and the buffers refill after a resume."""


@dataclasses.dataclass(frozen=True)
class Config:
    plugins: tuple[str, ...] = ()
    """Python modules imported before the rest of the config is read, in every process of the
    run: each may register an algorithm, strategy or env family (config/plugins.py)."""
    name: str = "run"
    """Run name; outputs go to results/runs/<name> unless --out is given."""
    seed: int = field(0, min=0)
    """Seeds everything: networks, environments, action noise, replay sampling, strategies."""
    algo: str = field(registry.DEFAULT, choices=registry.NAMES)
    """Member algorithm."""
    strategy: str = field(strategies.DEFAULT, choices=strategies.NAMES)
    """What happens to members between evaluations: nothing (independent), pbt, pb2,
    halving, branch_merge, cemrl, dvd, schedule."""
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    """Environment every member trains and is evaluated on."""
    agent: dict = dataclasses.field(default_factory=dict)
    """Static fields of the algo's TD3Config/SACConfig/DQNConfig (network sizes, batch size)."""
    hparams: dict = dataclasses.field(default_factory=dict)
    """Initial values of the algo's HParams for every member; target_entropy null means -|A|."""
    population: PopulationConfig = dataclasses.field(default_factory=PopulationConfig)
    """Population size, executor and the hparams members start from (grid, priors)."""
    pbt: PBTConfig = dataclasses.field(default_factory=PBTConfig)
    """Population-based training (strategy: pbt; pb2 takes its rounds and selection too)."""
    pb2: PB2Config = dataclasses.field(default_factory=PB2Config)
    """PB2's GP-bandit explore (strategy: pb2)."""
    halving: HalvingConfig = dataclasses.field(default_factory=HalvingConfig)
    """Successive halving of trials inside the population (strategy: halving)."""
    branch_merge: BranchMergeConfig = dataclasses.field(default_factory=BranchMergeConfig)
    """Branch-and-merge rounds (strategy: branch_merge)."""
    cemrl: CEMRLConfig = dataclasses.field(default_factory=CEMRLConfig)
    """CEM over actors with a shared critic (strategy: cemrl)."""
    dvd: DvDConfig = dataclasses.field(default_factory=DvDConfig)
    """Diversity via determinants with a shared critic (strategy: dvd)."""
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    """A fixed hparam schedule every member follows (strategy: schedule; fastpop pbt-replay)."""
    replay: ReplayConfig = dataclasses.field(default_factory=ReplayConfig)
    """Replay buffers and the samples-per-insert rate limiter."""
    collect: CollectConfig = dataclasses.field(default_factory=CollectConfig)
    """Collector processes and environments."""
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    """Run length and update batching."""
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    """Periodic evaluation."""
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    """Terminal, TensorBoard and Weights & Biases output."""
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    """When the whole run is saved for `fastpop resume` and `fastpop eval`."""


_SCALARS = ("plugins", "name", "seed", "algo", "strategy")
_TABLES = ("agent", "hparams")  # sections whose keys depend on the algo
_TOP = {f.name: f.default_factory for f in dataclasses.fields(Config)}
_AGENT_RANGES = {
    "hidden_sizes": {"min": 1},
    "batch_size": {"min": 1},
    "torso": {"choices": TORSOS},
    "compute_dtype": {"choices": COMPUTE_DTYPES},
}
# HParams whose default depends on the environment; null in a config means that default.
_ENV_DEPENDENT_HPARAMS = frozenset({"target_entropy"})


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
        if name in _ENV_DEPENDENT_HPARAMS:
            specs[name] = (float | None, allowed, None)
        elif np.issubdtype(value.dtype, np.integer):
            specs[name] = (int, allowed, int(value))
        else:  # the shortest float32 repr: 3e-4, not 0.00030000001424923539
            specs[name] = (float, allowed, float(str(value)))
    return specs


def _build(raw: dict, r: Reader) -> Config:
    for key in raw:
        if key not in _TOP:
            r.unknown(str(key), list(_TOP))
    specs = field_specs(Config)
    # The plugins first: what they register is what `algo` and `strategy` may name.
    plugins = read_fields(
        r, "", {k: v for k, v in raw.items() if k == "plugins"}, {"plugins": specs["plugins"]}
    )["plugins"]
    import_plugins(r, plugins)
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
            values[name] = read_fields(r, name, raw.get(name), specs, f" for algo {algo}")
        elif name not in _SCALARS and name != "env":
            values[name] = factory(**read_fields(r, name, raw.get(name), field_specs(factory)))
    given = raw["population"] if isinstance(raw.get("population"), dict) else {}
    specs = _table_specs("hparams", algo)
    population, strategy = values["population"], values["strategy"]
    values["population"] = check_member_hparams(r, population, specs, set(given), strategy)
    if strategies.get(strategy).config_type is not None and strategy not in _TOP:
        r.fail(
            "strategy", f"{strategy}'s config section is no field of Config (config/sections.py)"
        )
    for entry in strategies.entries():  # every section is read, whether or not it runs
        if entry.resolve_section is not None:
            section = values[entry.name]
            values[entry.name] = entry.resolve_section(r, section, specs, Config(**values))
    config = Config(**values)
    check_collection(r, config)
    check_strategy(r, config)
    _check_consistency(r, config)
    return config


def _check_consistency(r: Reader, c: Config) -> None:
    lanes, capacity, chunk_len = c.collect.envs_per_member, c.replay.capacity, c.collect.chunk_len
    num_envs, min_capacity = c.population.size * lanes, max(chunk_len, 2) * lanes
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
    )  # fmt: skip
    for dotted, violated, problem in checks:
        if violated:
            r.fail(dotted, problem)


def _apply_override(raw: dict, text: str, origins: dict[str, str]) -> None:
    key, sep, value_text = text.partition("=")
    parts = (key := key.strip()).split(".")
    if not sep or len(parts) > 2 or not all(parts) or key in set(_TOP) - set(_SCALARS):
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
