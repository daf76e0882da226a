"""Run configuration: the frozen `Config` and its sections, each field with its docstring and
its allowed values (read from a preset by `loading.py`).

Counting conventions: env steps, replay sizes and warm-up are per member; `replay.capacity` is
one member's buffer, split into one ring lane per environment of that member. A shared buffer
(`replay.shared`) holds `capacity * population.size` transitions in `envs_per_member *
population.size` lanes, so sharing changes who samples what, not the memory of a run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastpop.agents import registry
from fastpop.config.env import COLLECTION_MODES, EnvConfig
from fastpop.schema import field
from fastpop.strategies import registry as strategies

__all__ = ["Config"]


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


def _default_sections() -> dict:
    """Every registered strategy's section at its defaults."""
    return {e.name: e.config_type() for e in strategies.entries() if e.config_type is not None}


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
    strategy_sections: dict = dataclasses.field(default_factory=_default_sections)
    """Every registered strategy's section, by strategy name (`section(name)`). A preset writes
    each at its top level under that name (`pbt:`, `halving:`, `cemrl:`, ...), so a strategy a
    plugin registers brings its own section with it."""
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

    def section(self, strategy: str):
        """The config section of a registered strategy (`pbt:` -> a `PBTConfig`)."""
        return self.strategy_sections[strategy]
