"""Where a run's rows come from: the one place the two collection modes differ.

    ProcessCollection   collector processes step CPU simulators (gymnasium); rows arrive through
                        shared-memory rings and are copied to the device (`Workers`)
    DeviceCollection    brax environments stepped on the device by the same policy the learner
                        trains; rows never leave it, no worker process is started

Both open a context with the interface the run loop uses: `feed(learner)` (rows into the learner;
device mode also runs the updates they allow, in the same compiled call), `chunks_per_pass`,
`publish_from(learner)`,
`evaluate(snapshot)`, `evaluations(timeout)`, `check()`, `stop()`, `evaluator_restarts`; and both
save and restore what they hold for a checkpoint (`saved()` / `restore(tree)`).
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

from fastpop import config as config_lib
from fastpop import population
from fastpop.collect import device_rollout, snapshot
from fastpop.population import sharding


class ProcessCollection:
    """Collector and evaluator processes (fastpop.collect.workers); nothing to checkpoint: a
    resumed run starts new processes with new seeds."""

    def __init__(self, config: config_lib.Config, learner):
        self.config, self.learner = config, learner

    def saved(self) -> dict:
        return {}

    def restore(self, tree: dict) -> None:
        pass

    def open(self, log, log_event, generation: int):
        from fastpop.collect.workers import Workers

        learner = self.learner
        leaves, spec = learner.policy_leaves(), learner.replay_spec
        return Workers(self.config, leaves, spec, log, log_event=log_event, generation=generation)


class DeviceCollection:
    """P members x E brax envs stepped on the device, one jitted call per chunk of rows (env
    states donated), acting with each member's current exploration; evaluation on a separate
    batch of envs with the snapshot's policy held constant. With population.devices > 1 each
    device steps the envs of its own members."""

    evaluator_restarts = 0  # nothing to restart
    chunks_per_pass = 1  # every call makes one: the loop checks signals and evaluations between

    def __init__(self, config: config_lib.Config, learner):
        from fastpop.envs.brax_envs import make_brax_env

        self.config, self.learner = config, learner
        self.env = make_brax_env(config.env.id, config.env.backend)
        self.episode_length = config.env.episode_length
        size, per_member = config.population.size, config.collect.envs_per_member
        key = jax.random.fold_in(jax.random.key(config.seed), 0xDE1)
        self.key, lanes_key = jax.random.split(key)
        init = functools.partial(device_rollout.init, self.env, lanes=size * per_member)
        # Lanes are member-major: split over the learner's mesh like the members they serve
        # (their scalars, a key, on every device).
        self._placement = None
        if learner.mesh is not None:
            split, everywhere = sharding.members(learner.mesh), sharding.replicated(learner.mesh)
            shapes = jax.eval_shape(init, lanes_key)
            self._placement = jax.tree.map(lambda s: split if s.ndim else everywhere, shapes)
        self.lanes = jax.jit(init, out_shardings=self._placement)(lanes_key)
        self._chunk = jax.jit(self._rollout_chunk, donate_argnums=0)
        self._evaluate = jax.jit(self._evaluate_members)
        self._evaluate_program: Future | None = None
        self._results: list[dict] = []
        # What an evaluation snapshot decodes to: host arrays of the policy tree's shapes.
        tree = jax.eval_shape(lambda: learner.policy_tree())
        self._snapshot = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
        self._treedef = jax.tree.structure(tree)

    # --- checkpoints ---

    def saved(self) -> dict:
        return {"lanes": self.lanes, "key": self.key}

    def restore(self, tree: dict) -> None:
        lanes = tree["lanes"]
        if self._placement is None:
            self.lanes = jax.tree.map(jnp.asarray, lanes)
        else:
            self.lanes = sharding.place(lanes, self._placement)
        self.key = tree["key"]

    # --- the run loop's interface ---

    def open(self, log, log_event, generation: int) -> DeviceCollection:
        """Starts compiling the evaluation program in a thread: the first evaluation would
        otherwise stop the loop for as long (~5 s for the inverted pendulum on the CPU)."""
        if self._evaluate_program is None:
            compiler = ThreadPoolExecutor(1, thread_name_prefix="fastpop-compile")
            self._evaluate_program = compiler.submit(self._compile_evaluation)
            compiler.shutdown(wait=False)  # the thread ends with the compilation
        return self

    def __enter__(self) -> DeviceCollection:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def check(self) -> None:
        pass

    def publish_from(self, learner) -> None:
        """Nothing to send: the next chunk acts with the learner's device state itself."""

    def feed(self, learner) -> list:
        """One chunk of every lane, inserted, and the updates it allows, as one compiled call
        (`Learner.collect_and_update`). No episodes are reported: their returns would have to
        cross to the host every chunk."""
        self.key, key = jax.random.split(self.key)
        self.lanes = learner.collect_and_update(self._rollout_chunk, self.lanes, key)
        return []

    def next_chunk(self):
        """The next `chunk_len` rows of every lane as device arrays, without inserting them
        (what `fastpop bench device` times as collection alone)."""
        learner = self.learner
        self.key, key = jax.random.split(self.key)
        steps = jnp.int32(learner.limiter.inserted)
        self.lanes, rows = self._chunk(self.lanes, key, learner.states, learner.hparams, steps)
        return rows, []

    def evaluate(self, arrays: dict) -> None:
        leaves, meta = snapshot.decode(arrays)
        policy, hparams, _ = jax.tree.unflatten(self._treedef, leaves)
        start = time.perf_counter()
        program = self._evaluation_program()
        returns = np.asarray(program(policy, hparams, self._evaluation_key(meta)), np.float64)
        self._results.append(
            {
                "eval_index": meta.eval_index,
                "env_steps": meta.env_steps,
                "updates": meta.updates,
                "wall_time": meta.wall_time,
                "return_mean": returns.mean(axis=1).tolist(),
                "return_std": returns.std(axis=1).tolist(),
                "seconds": time.perf_counter() - start,
            }
        )

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        results, self._results = self._results, []
        return results

    def stop(self) -> dict:
        return {}

    def _evaluation_key(self, meta: snapshot.SnapshotMeta):
        return jax.random.fold_in(jax.random.key(self.config.seed), 7919 * (meta.eval_index + 1))

    def _compile_evaluation(self):
        """The evaluation program for a decoded snapshot, as `evaluate` passes it (so it runs
        where the jitted call would). Shapes only: the learner's state is the loop's."""
        key = jax.eval_shape(lambda: self._evaluation_key(snapshot.SnapshotMeta(0, 0, 0, 0.0)))
        policy, hparams, _ = self._snapshot
        return self._evaluate.lower(policy, hparams, key).compile()

    def _evaluation_program(self):
        """The program compiled in the background, or, where that failed (or open() was not
        called), the jitted call, which raises the same error here in the loop."""
        if self._evaluate_program is not None:
            try:
                return self._evaluate_program.result()
            except Exception:  # the jitted call below raises it where the loop reports it
                pass
        return self._evaluate

    # --- compiled programs ---

    def _rollout_chunk(self, lanes, key, states, hparams, member_steps):
        config = self.config
        policy = self.learner.training.policies(states)  # inside the jit: no host work per chunk
        size, per_member = config.population.size, config.collect.envs_per_member
        act = population.population_act(self.learner.agent)
        warmup_env_steps = -(-config.collect.warmup_steps // per_member)
        spec = self.learner.agent_spec

        def lane_act(obs, step_key, index):
            env_steps = member_steps // per_member + index  # per env, as collectors count
            explore_key, random_key = jax.random.split(step_key)
            member_obs = obs.reshape(size, per_member, *obs.shape[1:])
            keys = jax.random.split(explore_key, size)
            actions = act(policy, member_obs, keys, hparams, True, env_steps * per_member)
            actions = actions.reshape(size * per_member, *actions.shape[2:])
            warmup = jax.random.uniform(
                random_key, actions.shape, minval=spec.action_low, maxval=spec.action_high
            )
            return jnp.where(env_steps < warmup_env_steps, warmup, actions).astype(jnp.float32)

        lanes, rows, _ = device_rollout.rollout(
            self.env, self.episode_length, lanes, lane_act, key, config.collect.chunk_len
        )
        return lanes, rows

    def _evaluate_members(self, policy, hparams, key):
        episodes = self.config.eval.episodes
        return _evaluate(
            self.env, self.episode_length, self.learner.agent, policy, hparams, key, episodes
        )


def _evaluate(env, episode_length: int, agent, policy, hparams, key, episodes: int):
    """(P, episodes) returns of each member's deterministic policy, one episode per lane."""
    size = jax.tree.leaves(hparams)[0].shape[0]
    act = population.population_act(agent)

    def greedy(obs, step_key, index):
        member_obs = obs.reshape(size, episodes, *obs.shape[1:])
        keys = jax.random.split(step_key, size)
        actions = act(policy, member_obs, keys, hparams, False, 0)
        return actions.reshape(size * episodes, *actions.shape[2:])

    returns = device_rollout.evaluate(env, episode_length, greedy, key, size * episodes)
    return returns.reshape(size, episodes)


def evaluate_on_device(agent, policy, hparams, config, episodes: int, seed: int) -> np.ndarray:
    """`fastpop eval` of a device-mode run: (P, episodes) returns on fresh brax envs."""
    from fastpop.envs.brax_envs import make_brax_env

    env = make_brax_env(config.env.id, config.env.backend)
    run = jax.jit(
        lambda policy, hparams, key: _evaluate(
            env, config.env.episode_length, agent, policy, hparams, key, episodes
        )
    )
    return np.asarray(run(policy, hparams, jax.random.key(seed)))


def env_state_bytes(config: config_lib.Config) -> int:
    """Device bytes of the env states a run holds besides its replay: the P x E training lanes
    and the P x eval.episodes evaluation lanes of device mode (0 in process mode)."""
    if config_lib.collection_mode(config) != "device":
        return 0
    from fastpop.envs.brax_envs import make_brax_env

    env = make_brax_env(config.env.id, config.env.backend)
    size = config.population.size
    lanes = size * (config.collect.envs_per_member + config.eval.episodes)
    shapes = jax.eval_shape(lambda key: device_rollout.init(env, key, lanes), jax.random.key(0))
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(shapes))


def make_collection(config: config_lib.Config, learner):
    """The config's collection mode (`collect.mode`, resolved per env id)."""
    if config_lib.collection_mode(config) == "device":
        return DeviceCollection(config, learner)
    return ProcessCollection(config, learner)
