"""The learner: all device state of a run (member states, hparams, replay) and the host-side
bookkeeping around it (rate limiter, update counter, the strategy's state).

`Run` (fastpop.run.loop) drives it: `insert` collected rows, `update` when `can_update`,
`policy_leaves` for the workers, `strategy_step` after each evaluation round. How members are
trained and changed between rounds is the strategy's `Training` (update_protocol.py); where rows
live is the `ReplayStore`: the learner itself does not depend on either's kind.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import config as config_lib
from fastpop import population, strategies
from fastpop.collect.segments import memory_order_problem
from fastpop.collect.sources import env_state_bytes
from fastpop.config.build import build_agent, build_env_spec, build_replay_spec
from fastpop.learn import update_protocol
from fastpop.learn.rate_limiter import InProgramLimiter, RateLimiter
from fastpop.learn.replay_store import ReplayStore, layout_for
from fastpop.population import sharding
from fastpop.strategies.base import Evaluation
from fastpop.strategies.codec import join_strategy_state, split_strategy_state


def prepare(config: config_lib.Config):
    """Everything that can refuse a config, checked before any process or file exists:
    (env spec, agent)."""
    processes = config_lib.collection_mode(config) == "processes"
    if processes and (problem := memory_order_problem()) is not None:
        raise config_lib.ConfigError(f"{problem} (or step brax envs with collect.mode: device)")
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    estimate = config_lib.memory_estimate(config, spec)
    if not estimate.fits:
        raise config_lib.ConfigError(estimate.message)
    env_bytes = env_state_bytes(config)  # device mode: env states live beside the replay
    if estimate.bytes_needed + env_bytes > estimate.bytes_available:
        raise config_lib.ConfigError(
            f"{estimate.message}, and the device environments' states need "
            f"{env_bytes / 2**20:,.1f} MiB more: lower population.size or "
            "collect.envs_per_member"
        )
    sharding.device_count(config)  # population.devices: enough devices, an even split
    return spec, agent


def initial_hparams(config: config_lib.Config, agent):
    """Stacked hparams of every member: the config's values and the strategy's overrides."""
    overrides = strategies.member_overrides(config)
    return population.broadcast_hparams(
        config_lib.default_member_hparams(config, agent),
        config.population.size,
        **{name: [o[name] for o in overrides] for name in (overrides[0] if overrides else {})},
    )


def make_training(config: config_lib.Config, spec, agent, strategy, sample_batch, mesh=None):
    """The strategy's `Training` under the config's execution and replay layout, with its
    members split over `mesh` (population.devices > 1)."""
    updates = config.train.updates_per_call
    unroll = population.scan_unroll(spec.obs_shape, updates)
    return update_protocol.make_training(
        agent,
        strategy,
        config.population.execution,
        sample_batch,
        updates,
        config.replay.shared,
        unroll,
        mesh,
    )


def make_limiter(config: config_lib.Config, agent) -> RateLimiter:
    """Device mode keeps samples_per_insert exactly inside its one program per chunk; process
    mode lets collection and learning drift apart by the tolerance."""
    kind = InProgramLimiter if config_lib.collection_mode(config) == "device" else RateLimiter
    return kind(
        config.replay.samples_per_insert,
        config.replay.min_size,
        config.replay.tolerance,
        samples_per_call=config.train.updates_per_call * agent.batch_size,
        insert_size=config.collect.chunk_len * config.collect.envs_per_member,
    )


def fused_iteration(
    training,
    add_rows,
    collect,
    lanes,
    buffers,
    states,
    key,
    collect_key,
    hparams,
    member_hparams,
    joins,
    env_steps,
    calls,
):
    """One chunk of device collection, its insert and `calls` update calls as one program:
    collect(lanes, key, states, hparams, env_steps) -> (lanes, rows) acts with the states as
    they are before this chunk's updates (what process mode's collectors do with the last
    published params). The update keys are split from `key` as `Learner.update` splits them,
    so the numbers equal the same calls made one at a time. Metrics: the last call's (NaN
    when there was none)."""
    lanes, rows = collect(lanes, collect_key, states, hparams, env_steps)
    buffers = add_rows(buffers, rows, joins)

    def one_call(_, carry):
        states, key, _ = carry
        key, update_key = jax.random.split(key)
        states, metrics = update_protocol.update(states, buffers, member_hparams, update_key)
        return states, key, metrics

    shapes = jax.eval_shape(update_protocol.update, states, buffers, member_hparams, key)[1]
    metrics = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), shapes)
    states, key, metrics = jax.lax.fori_loop(0, calls, one_call, (states, key, metrics))
    return lanes, buffers, states, key, metrics


class Learner:
    """Device state (member states, replay) and the host-side bookkeeping around it."""

    def __init__(self, config: config_lib.Config, spec, agent):
        self.config = config
        self.agent, self.agent_spec = agent, spec
        size = config.population.size
        self.hparams = initial_hparams(config, agent)
        self.replay_spec = build_replay_spec(config, spec)
        layout = layout_for(config.replay.shared, config.population.execution)
        self.mesh = sharding.mesh_for(config)  # None: one device
        self.replay = ReplayStore(self.replay_spec, layout, size, agent.batch_size, self.mesh)
        self.strategy = strategies.make_strategy(config)
        self.training = make_training(
            config, spec, agent, self.strategy, self.replay.sample_batch, self.mesh
        )
        self.key, init_key = jax.random.split(jax.random.key(config.seed))
        self.states, self.strategy_state = self.training.init(init_key, self.hparams)
        self.member_hparams = self.training.adopt(self.hparams)
        self.limiter = make_limiter(config, agent)
        self.updates = 0
        self._metrics: dict | None = None
        self._fused: dict = {}  # collect function -> its compiled fused iteration

    @property
    def buffers(self):
        return self.replay.buffers

    # --- checkpoints ---

    def saved_tree(self, with_replay: bool) -> dict:
        """Every array of the learner's state, for a checkpoint (see fastpop.run.run_state)."""
        strategy_arrays, _ = split_strategy_state(self.strategy_state)
        tree = {
            "states": self.training.release(self.states),  # stacked, whatever the layout
            "hparams": self.hparams,
            "key": self.key,
            "strategy": strategy_arrays,
        }
        if with_replay:
            tree["buffers"] = self.replay.save()
        return tree

    def saved_counters(self) -> dict:
        """The learner's plain-number state: update count, rate limiter, strategy state."""
        return {
            "updates": self.updates,
            "inserted": self.limiter.inserted,
            "sampled": self.limiter.sampled,
            "inserted_at_start": self.limiter.inserted_at_start,
            "refill_from": self.limiter.refill_from,
            "strategy": split_strategy_state(self.strategy_state)[1],
            "replay": self.replay.counters(),
        }

    def restore(self, tree: dict, counters: dict) -> None:
        """Continue from a checkpoint's `saved_tree` / `saved_counters`. Without saved buffers
        the replay starts empty and learning waits for replay.min_size new transitions."""
        to_device = lambda tree: jax.tree.map(jnp.asarray, tree)
        self.states = self.training.adopt(to_device(tree["states"]))
        self.hparams = to_device(tree["hparams"])
        self.member_hparams = self.training.adopt(self.hparams)
        self.key = tree["key"]
        self.strategy_state = join_strategy_state(
            self.strategy_state, [jnp.asarray(a) for a in tree["strategy"]], counters["strategy"]
        )
        self.updates = counters["updates"]
        limiter = self.limiter
        limiter.inserted, limiter.sampled = counters["inserted"], counters["sampled"]
        limiter.inserted_at_start = counters["inserted_at_start"]
        limiter.refill_from = counters["refill_from"]
        self.replay.restore(tree.get("buffers"), counters.get("replay"))
        if "buffers" not in tree:  # refill: the limiter starts over from the empty buffers
            limiter.inserted_at_start, limiter.sampled = None, 0
            limiter.refill_from = limiter.inserted

    # --- the loop's calls ---

    def policy_tree(self) -> tuple:
        """What collectors and the evaluator act with: stacked policy params and hparams, and
        the env steps per member so far (see `collect.collector.policy_template`)."""
        policy = self.training.policies(self.states)
        return policy, self.hparams, np.asarray(self.limiter.inserted, np.int32)

    def policy_leaves(self) -> list[np.ndarray]:
        """`policy_tree` as host arrays, in leaf order (shared memory, snapshots)."""
        return [np.asarray(leaf) for leaf in jax.tree.leaves(self.policy_tree())]

    def insert(self, rows) -> None:
        """rows: (population * envs_per_member, chunk_len, ...) numpy arrays, member-major."""
        self.replay.insert(rows)
        self.limiter.record_insert()

    def can_update(self) -> bool:
        """The rate limiter allows a call and every buffer holds a transition to sample."""
        return self.limiter.can_sample() and self.replay.ready()

    def update(self) -> None:
        self.key, update_key = jax.random.split(self.key)
        self.states, metrics = self.training.update(
            self.states, self.replay.buffers, self.member_hparams, update_key
        )
        self.limiter.record_sample()
        self.updates += self.config.train.updates_per_call
        self._metrics = metrics  # read (a device-to-host copy) only when logged

    def collect_and_update(self, collect, lanes, collect_key):
        """Device mode: the next chunk of rows, their insert and every update call they allow
        (`InProgramLimiter.calls_due`) in one compiled call (`fused_iteration`); env lanes and
        buffers are donated. Returns the lanes after the chunk."""
        limiter = self.limiter
        env_steps = np.int32(limiter.inserted)
        joins = self.replay.take_joins()
        limiter.record_insert()
        rows_per_lane = (
            limiter.inserted - limiter.refill_from
        ) // self.config.collect.envs_per_member
        calls = limiter.calls_due() if rows_per_lane >= 2 else 0  # a transition is two rows
        program = self._fused.get(collect)
        if program is None:
            fused = functools.partial(fused_iteration, self.training, self.replay.add_rows, collect)
            program = self._fused[collect] = jax.jit(fused, donate_argnums=(0, 1, 2))
        lanes, self.replay.buffers, self.states, self.key, metrics = program(
            lanes,
            self.replay.buffers,
            self.states,
            self.key,
            collect_key,
            self.hparams,
            self.member_hparams,
            joins,
            env_steps,
            np.int32(calls),
        )
        limiter.record_calls(calls)
        self.updates += calls * self.config.train.updates_per_call
        if calls:
            self._metrics = metrics
        return lanes

    @property
    def last_metrics(self) -> dict[str, float]:
        """The latest update call's metrics, averaged over members and updates."""
        metrics = self._metrics or {}
        return {f"learner/{k}": float(jnp.nanmean(v)) for k, v in metrics.items()}

    def member_hparams_values(self, member: int) -> dict:
        return self.all_member_hparams()[member]

    def all_member_hparams(self) -> list[dict]:
        return update_protocol.member_hparams_list(self.hparams)

    def finite_members(self) -> np.ndarray:
        """(P,) bool: the member's networks, targets and optimizer state are all finite."""
        return update_protocol.finite_members(self.training, self.states)

    def apply_selection(self, selection) -> None:
        """Apply a `strategies.base.Selection` now (what `strategy_step` does with a strategy's)."""
        self.states, self.hparams = update_protocol.apply_selection(
            self.training, self.states, self.hparams, selection, self.replay
        )
        self.member_hparams = self.training.adopt(self.hparams)

    def strategy_step(self, evaluation: Evaluation) -> tuple[list[dict], dict]:
        """Hand an evaluation round to the strategy's training: it applies the strategy's
        decision on device and resets members whose state is not finite.
        Returns the lineage events (with the hparams in force after them) and scalars to log."""
        finite = evaluation.finite
        if finite is None:
            finite = self.finite_members()
        returns = np.where(finite, evaluation.returns, np.nan)  # ranks last; PBT replaces it
        evaluation = evaluation._replace(returns=returns, finite=finite)
        self.key, key = jax.random.split(self.key)
        result = self.training.between_rounds(
            update_protocol.Round(
                evaluation, self.strategy_state, self.states, self.hparams, self.replay, key
            )
        )
        self.strategy_state, self.states, self.hparams = result[:3]
        self.member_hparams = self.training.adopt(self.hparams)
        return result.events, result.scalars
