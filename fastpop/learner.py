"""The learner: all device state of a run (member states, hparams, replay) and the host-side
bookkeeping around it (rate limiter, update counter, the strategy's state).

`Run` (fastpop.train) drives it: `insert` collected rows, `update` when the limiter allows,
`policy_leaves` for the workers, `strategy_step` after each evaluation round.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import config as config_lib
from fastpop import population, replay, run_state, strategies
from fastpop.agents import make_agent
from fastpop.envs import env_spec
from fastpop.strategies.base import Evaluation, Selection, reset_events, reset_indices


def prepare(config: config_lib.Config):
    """Everything that can refuse a config, checked before any process or file exists."""
    atari = config_lib.atari_options(config)
    spec = env_spec(config.env.id, atari)
    try:
        agent = make_agent(config.algo, spec, **config.agent)
    except ValueError as error:
        raise config_lib.ConfigError(f"algo {config.algo!r} on {config.env.id}: {error}") from None
    estimate = config_lib.memory_estimate(config, spec)
    if not estimate.fits:
        raise config_lib.ConfigError(estimate.message)
    return spec, agent


class Learner:
    """Device state (member states, replay) and the host-side bookkeeping around it."""

    def __init__(self, config: config_lib.Config, spec, agent):
        self.config = config
        self.agent = agent
        size = config.population.size
        overrides = strategies.member_overrides(config)
        self.hparams = population.broadcast_hparams(
            config_lib.default_member_hparams(config, agent),
            size,
            **{name: [o[name] for o in overrides] for name in (overrides[0] if overrides else {})},
        )
        capacity, lanes = config_lib.replay_layout(config)
        self.replay_spec = replay.make_replay_spec(spec, capacity, lanes, config.collect.chunk_len)
        shared = config.replay.shared
        add = functools.partial(replay.add, self.replay_spec)
        if shared:
            self.buffers = replay.init(self.replay_spec)
            self.add = jax.jit(add, donate_argnums=0)
        else:
            self.buffers = replay.init_population(self.replay_spec, size)
            self.add = jax.jit(jax.vmap(add), donate_argnums=0)
        updates = config.train.updates_per_call
        sample = lambda buffer, key: replay.sample(self.replay_spec, buffer, key, agent.batch_size)
        unroll = population.scan_unroll(spec.obs_shape, updates)
        self.strategy = strategies.make_strategy(config)
        self.learning = self.strategy.learning  # shared-critic strategies own state and update
        self.key, init_key = jax.random.split(jax.random.key(config.seed))
        if self.learning is not None:
            update = self.learning.make_update(agent, sample, updates, unroll)
            identity = lambda tree: tree
            self.executor = population.Executor("shared_critic", update, identity, identity)
            self.states, self.strategy_state = self.learning.init_states(
                agent, init_key, self.hparams
            )
            self._sample = jax.jit(sample)
        else:
            self.executor = population.make_executor(
                config.population.execution, agent, sample, updates, shared, unroll
            )
            self.states = self.executor.adopt(
                population.init_population(agent, init_key, self.hparams)
            )
            self.strategy_state = self.strategy.init()
        self.member_hparams = self.executor.adopt(self.hparams)
        if self.executor.name == "sequential" and not shared:
            # Kept as one buffer per member: slicing a stacked buffer per call would copy it.
            self.buffers = self.executor.adopt(self.buffers)
            self.add = jax.jit(add, donate_argnums=0)
        transitions_per_chunk = config.collect.chunk_len * config.collect.envs_per_member
        self.limiter = replay.RateLimiter(
            config.replay.samples_per_insert,
            config.replay.min_size,
            config.replay.tolerance,
            samples_per_call=updates * agent.batch_size,
            insert_size=transitions_per_chunk,
        )
        self.updates = 0
        self.last_metrics: dict[str, float] = {}

    # --- checkpoints ---

    def saved_tree(self, with_replay: bool) -> dict:
        """Every array of the learner's state, for a checkpoint (see fastpop.run_state)."""
        states = self.executor.release(self.states)  # stacked, whatever the executor
        strategy_arrays, _ = run_state.split_strategy_state(self.strategy_state)
        tree = {"states": states, "hparams": self.hparams, "key": self.key}
        tree["strategy"] = strategy_arrays
        if with_replay:
            tree["buffers"] = self.buffers
        return tree

    def saved_counters(self) -> dict:
        """The learner's plain-number state: update count, rate limiter, strategy state."""
        limiter = self.limiter
        return {
            "updates": self.updates,
            "inserted": limiter.inserted,
            "sampled": limiter.sampled,
            "inserted_at_start": limiter.inserted_at_start,
            "refill_from": limiter.refill_from,
            "strategy": run_state.split_strategy_state(self.strategy_state)[1],
        }

    def restore(self, tree: dict, counters: dict) -> None:
        """Continue from a checkpoint's `saved_tree` / `saved_counters`. Without saved buffers
        the replay starts empty and learning waits for replay.min_size new transitions."""
        to_device = lambda tree: jax.tree.map(jnp.asarray, tree)
        self.states = self.executor.adopt(to_device(tree["states"]))
        self.hparams = to_device(tree["hparams"])
        self.member_hparams = self.executor.adopt(self.hparams)
        self.key = tree["key"]
        self.strategy_state = run_state.join_strategy_state(
            self.strategy_state, [jnp.asarray(a) for a in tree["strategy"]], counters["strategy"]
        )
        self.updates = counters["updates"]
        limiter = self.limiter
        limiter.inserted, limiter.sampled = counters["inserted"], counters["sampled"]
        limiter.inserted_at_start = counters["inserted_at_start"]
        limiter.refill_from = counters["refill_from"]
        if "buffers" in tree:
            # Free the empty buffers first: at no time two replays' worth of device memory.
            per_member = isinstance(self.buffers, list)
            self.buffers = None
            buffers = tree["buffers"]
            self.buffers = [to_device(b) for b in buffers] if per_member else to_device(buffers)
        else:  # refill: the limiter starts over from the empty buffers, counting from here
            limiter.inserted_at_start, limiter.sampled = None, 0
            limiter.refill_from = limiter.inserted

    def policy_leaves(self) -> list[np.ndarray]:
        """What collectors and the evaluator act with: stacked policy params and hparams, and
        the env steps per member so far (see `collect.collector.policy_template`)."""
        if self.learning is not None:
            policy = self.learning.policies(self.states)
        elif isinstance(self.states, list):  # sequential: stack the policies only
            policy = population.stack([self.agent.policy_params(s) for s in self.states])
        else:
            policy = population.member_policies(self.agent, self.states)
        member_steps = np.asarray(self.limiter.inserted, np.int32)
        return [np.asarray(leaf) for leaf in jax.tree.leaves((policy, self.hparams, member_steps))]

    def insert(self, rows: replay.Rows) -> None:
        """rows: (population * envs_per_member, chunk_len, ...) numpy arrays, member-major."""
        size, lanes = self.config.population.size, self.config.collect.envs_per_member
        if self.config.replay.shared:
            self.buffers = self.add(self.buffers, jax.tree.map(jnp.asarray, rows))
        elif isinstance(self.buffers, list):
            for member in range(size):
                member_rows = jax.tree.map(
                    lambda x, m=member: jnp.asarray(x[m * lanes : (m + 1) * lanes]), rows
                )
                self.buffers[member] = self.add(self.buffers[member], member_rows)
        else:
            chunk = jax.tree.map(lambda x: jnp.asarray(x).reshape(size, lanes, *x.shape[1:]), rows)
            self.buffers = self.add(self.buffers, chunk)
        self.limiter.record_insert()

    def update(self) -> None:
        self.key, update_key = jax.random.split(self.key)
        self.states, metrics = self.executor.update(
            self.states, self.buffers, self.member_hparams, update_key
        )
        self.limiter.record_sample()
        self.updates += self.config.train.updates_per_call
        self.last_metrics = {f"learner/{k}": float(jnp.nanmean(v)) for k, v in metrics.items()}

    def member_hparams_values(self, member: int) -> dict:
        return {
            name: np.asarray(value[member]).item() for name, value in self.hparams._asdict().items()
        }

    def all_member_hparams(self) -> list[dict]:
        return [self.member_hparams_values(m) for m in range(self.config.population.size)]

    def finite_members(self) -> np.ndarray:
        """(P,) bool: the member's networks, targets and optimizer state are all finite."""
        if self.learning is not None:
            return np.asarray(population.finite_members(self.learning.member_trees(self.states)))
        return np.asarray(population.finite_members(self.executor.release(self.states)))

    def strategy_step(self, evaluation: Evaluation) -> tuple[list[dict], dict]:
        """Hand an evaluation round to the strategy and apply what it decides on device; then
        reset any member whose state is still not finite from the best finite one.
        Returns the lineage events (with the hparams in force after them) and scalars to log."""
        finite = evaluation.finite
        if finite is None:
            finite = self.finite_members()
        returns = np.where(finite, evaluation.returns, np.nan)  # ranks last; PBT replaces it
        evaluation = evaluation._replace(returns=returns, finite=finite)
        if self.learning is not None:  # it resets members itself where that makes sense
            self.key, key = jax.random.split(self.key)
            observations = lambda key: self._sample(self.buffers, key).obs
            self.strategy_state, self.states, scalars, events = self.learning.step(
                self.agent, self.strategy_state, evaluation, self.states, observations, key
            )
            return events, scalars
        self.strategy_state, selection = self.strategy.step(
            self.strategy_state, evaluation, self.all_member_hparams()
        )
        sources, events = np.arange(len(finite)), []
        if selection is not None:
            self.apply_selection(selection)
            sources, events = selection.sources, selection.events
        events = events + self._reset_non_finite(evaluation, finite[sources], returns[sources])
        in_force = self.all_member_hparams()  # as stored: float32, int32
        return [{**e, "new_hparams": in_force[e["target"]]} for e in events], {}

    def _reset_non_finite(self, evaluation: Evaluation, finite, returns) -> list[dict]:
        """Members whose state is not finite continue from the best finite member's state,
        keeping their own hparams (a sweep keeps its configurations); the rest are untouched."""
        indices = reset_indices(finite, returns)
        events = reset_events(self.strategy.name, evaluation, indices, returns)
        if events:
            stacked = self.executor.release(self.states)
            self.states = self.executor.adopt(population.gather(stacked, jnp.asarray(indices)))
        return events

    def apply_selection(self, selection: Selection) -> None:
        """A strategy's decision on device: whole member states (and optionally replay buffers)
        gathered from their sources, hparams replaced; nothing recompiles."""
        size = self.config.population.size
        if selection.moves_state:
            indices = jnp.asarray(selection.sources)
            self.states = self.executor.adopt(
                population.gather(self.executor.release(self.states), indices)
            )
            if selection.copy_replay and not self.config.replay.shared:
                self._copy_buffers(selection.sources)
        self.hparams = population.broadcast_hparams(
            population.member(self.hparams, 0),
            size,
            **{name: [h[name] for h in selection.hparams] for name in self.hparams._fields},
        )
        self.member_hparams = self.executor.adopt(self.hparams)

    def _copy_buffers(self, sources: np.ndarray) -> None:
        targets = {t for t, s in enumerate(sources) if s != t}
        if targets & set(sources.tolist()) and not isinstance(self.buffers, list):
            # A source is overwritten too: copy out of an untouched original.
            self.buffers = population.gather(self.buffers, jnp.asarray(sources))
            return
        originals = list(self.buffers) if isinstance(self.buffers, list) else None
        for target, source in enumerate(int(s) for s in sources):
            if source == target:
                continue
            if isinstance(self.buffers, list):
                self.buffers[target] = population.copy_tree(originals[source])
            else:
                self.buffers = population.copy_member(self.buffers, target, source)
