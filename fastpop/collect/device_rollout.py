"""Environments stepped on the device (any DeviceEnv: brax, gymnax, Playground), writing replay
rows as the collectors do: device mode's chunk of every member's lanes (`member_rollout`, in
its collect program: fastpop.collect.chunk_programs) and its evaluation.

Every lane follows gymnasium's next-step autoreset, exactly as `rows.RowStream` records a
vector env: the step after an episode ends is the reset step. Its row holds the episode's
real final observation (the action is ignored, reward 0, no flags) and the reset observation
starts the next row. So a truncated episode keeps its true last state for bootstrapping, and
the replay's lane layout and sampling rules are the same in both collection modes.

The env's `done` is a termination only (fastpop.types.DeviceEnv); the time limit is
`episode_length`. brax's own AutoResetWrapper is not used: it swaps in a cached first state
and overwrites the final observation in the same step (brax issues #167, #275), which would
pair the last action with a reset state. Here a fresh reset (its own key) is computed every
step and selected only on lanes whose previous step ended an episode; under vmap both branches
run anyway.

All functions are pure over `LaneState` and jit / scan friendly; `episode_length` is the time
limit (the DeviceEnv's `episode_length` unless env.episode_length says otherwise).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.compilation import stored_programs
from fastpop.population import population_act, replay
from fastpop.types import EnvSpec, PRNGKey
from fastpop.xla_defaults import env_stepping_options

# act(obs (lanes, obs_dim), key, step index within the rollout[, episode draws (lanes,)]) ->
# actions (lanes, action_dim); the draws are passed where the lanes keep them
ActFn = Callable[..., jax.Array]


class LaneState(NamedTuple):
    env: Any  # the DeviceEnv's state with a leading lane axis
    steps: jax.Array  # int32 (lanes,): steps taken in the current episode
    done: jax.Array  # bool (lanes,): the previous step ended an episode, this one resets
    starts: jax.Array  # bool (lanes,): the current observation is a reset observation
    episode_return: jax.Array  # float32 (lanes,): return of the current episode so far
    key: PRNGKey  # for the resets
    # float32 (lanes,): each lane's uniform draw in [0, 1), made anew at each of its reset
    # steps, for an agent that reads them (`Agent.episode_draws`); None for the others
    episode_draw: jax.Array | None = None


class Finished(NamedTuple):
    """Per lane and step: an episode ended here, with this return (0 elsewhere)."""

    ended: jax.Array  # bool
    episode_return: jax.Array  # float32


def random_actions(spec: EnvSpec, key: PRNGKey, shape: tuple[int, ...]) -> jax.Array:
    """Uniform actions of `spec`'s space (warm-up): int32 indices or float32 in the bounds."""
    if spec.discrete:
        return jax.random.randint(key, shape, 0, spec.num_actions, jnp.int32)
    return jax.random.uniform(key, shape, minval=spec.action_low, maxval=spec.action_high)


def init(env, key: PRNGKey, lanes: int) -> LaneState:
    """`lanes` lanes whose previous step ended an episode: each one's first step is its reset
    step (a row with a blank observation and `autoreset` set, which sampling never uses as an
    observation), so the lanes need no reset program of their own; the chunk's per-step reset
    makes their first states. (A separate reset program was ~420 XLA kernels, ~2.7 CPU-s to
    compile for the brax pendulum, beside the chunk program on a cold start.)"""
    reset_key, key = jax.random.split(key)
    shapes = jax.eval_shape(jax.vmap(env.reset), jax.random.split(reset_key, lanes))
    return LaneState(
        # Strongly typed, as `step`'s selects return them (gymnax's resets hold weakly typed
        # Python scalars): the lanes a chunk returns must not recompile the next chunk.
        env=jax.tree.map(_blank, shapes),
        steps=jnp.zeros(lanes, jnp.int32),
        done=jnp.ones(lanes, bool),
        starts=jnp.zeros(lanes, bool),
        episode_return=jnp.zeros(lanes, jnp.float32),
        key=key,
    )


def with_episode_draws(state: LaneState) -> LaneState:
    """`state` (or its shapes) keeping each lane's episode draw: zeros, each made anew at its
    lane's first step, a reset step (`init`)."""
    lanes = state.steps.shape[0]
    if isinstance(state.steps, jax.ShapeDtypeStruct):
        return state._replace(episode_draw=jax.ShapeDtypeStruct((lanes,), jnp.float32))
    return state._replace(episode_draw=jnp.zeros(lanes, jnp.float32))


def _blank(shape: jax.ShapeDtypeStruct) -> jax.Array:
    """Zeros of `shape` (strongly typed), or copies of one key for a key leaf."""
    if jax.dtypes.issubdtype(shape.dtype, jax.dtypes.prng_key):
        return jnp.broadcast_to(jax.random.key(0), shape.shape)
    return jnp.zeros(shape.shape, shape.dtype)


def strongly_typed(x: jax.Array) -> jax.Array:
    """`x` without a weak type (a program given weak and then strong inputs compiles twice)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return x  # typed keys are never weak
    return x.astype(x.dtype)


def _select(mask: jax.Array, a, b):
    """Per lane: a where mask, else b (mask broadcast over each leaf's trailing axes)."""

    def pick(x, y):
        return jnp.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)

    return jax.tree.map(pick, a, b)


def restart(state: LaneState, lanes: jax.Array) -> LaneState:
    """Where `lanes` (bool, per lane), the current episode ends here, with no flag (a stopped
    trial's episode, not the env's): the next step is a reset step, whose row (an autoreset row,
    never a transition's start) ends the lane's stream, and the episode after is the new
    trial's from its first step."""
    return state._replace(
        done=state.done | lanes,
        starts=state.starts & ~lanes,
        episode_return=jnp.where(lanes, 0.0, state.episode_return),
    )


def step(env, episode_length: int, state: LaneState, action: jax.Array):
    """One env step of every lane -> (state, the row it writes (lanes,...), Finished)."""
    lanes = state.steps.shape[0]
    key, reset_key = jax.random.split(state.key)
    stepped = jax.vmap(env.step)(state.env, action)
    draw = state.episode_draw
    if draw is not None:  # a new episode's draw on each reset step (its own key)
        reset_key, draw_key = jax.random.split(reset_key)
        draw = jnp.where(state.done, jax.random.uniform(draw_key, (lanes,)), draw)
    fresh = jax.vmap(env.reset)(jax.random.split(reset_key, lanes))
    autoreset = state.done
    steps = state.steps + 1
    terminated = ~autoreset & (stepped.done > 0)
    truncated = ~autoreset & (steps >= episode_length)
    reward = jnp.where(autoreset, 0.0, stepped.reward).astype(jnp.float32)
    row = replay.Rows(
        obs=state.env.obs,
        action=action,
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        autoreset=autoreset,
        episode_start=state.starts,
    )
    ended = terminated | truncated
    episode_return = state.episode_return + reward
    finished = Finished(ended, jnp.where(ended, episode_return, 0.0))
    state = LaneState(
        env=_select(autoreset, fresh, stepped),
        steps=jnp.where(autoreset, 0, steps),
        done=ended,
        starts=autoreset,
        episode_return=jnp.where(ended, 0.0, episode_return),
        key=key,
        episode_draw=draw,
    )
    return state, row, finished


def rollout(env, episode_length: int, state: LaneState, act: ActFn, key: PRNGKey, length: int):
    """`length` steps of every lane -> (state, rows (lanes, length, ...), Finished (lanes,
    length))."""

    def one(state, inputs):
        step_key, index = inputs
        draws = () if state.episode_draw is None else (state.episode_draw,)
        action = act(state.env.obs, step_key, index, *draws)
        state, row, finished = step(env, episode_length, state, action)
        return state, (row, finished)

    inputs = (jax.random.split(key, length), jnp.arange(length, dtype=jnp.int32))
    state, (rows, finished) = jax.lax.scan(one, state, inputs)
    time_second = lambda x: jnp.swapaxes(x, 0, 1)
    return state, jax.tree.map(time_second, rows), jax.tree.map(time_second, finished)


class MemberLanes(NamedTuple):
    """P members with E env lanes each, as device mode's chunk steps them (`member_rollout`);
    the lanes are member-major."""

    env: Any  # the DeviceEnv
    episode_length: int  # the time limit
    agent: Any  # its `act`, through `population_act`
    env_spec: EnvSpec  # the action space the warm-up samples
    policies: Callable  # the members' states -> their stacked policy params (`Training.policies`)
    population_size: int
    envs_per_member: int
    warmup_steps: int  # per member: its trial's first env steps act at random
    chunk_len: int  # steps per lane and chunk


def member_rollout(members: MemberLanes, lanes, key, states, hparams, member_steps, restarts=None):
    """One chunk of every member's lanes, acting with the members' `states` and `hparams` ->
    (lanes, rows (lanes, chunk_len, ...)). `member_steps`: env steps of each member's trial
    before the chunk ((P,), or one for all), which its warm-up and exploration act at;
    `restarts`: (P,) bool, members whose fresh trial starts here: their lanes start new episodes
    first."""
    policy = members.policies(states)  # inside the jit: no host work per chunk
    size, per_member = members.population_size, members.envs_per_member
    act = population_act(members.agent, env_steps_per_member=True)
    warmup_env_steps = -(-members.warmup_steps // per_member)
    trial_steps = jnp.broadcast_to(jnp.asarray(member_steps, jnp.int32), (size,))
    if restarts is not None:
        lanes = restart(lanes, jnp.repeat(restarts, per_member))

    def lane_act(obs, step_key, index, episode_draws=None):
        env_steps = trial_steps // per_member + index  # per env, as collectors count
        explore_key, random_key = jax.random.split(step_key)
        member_obs = obs.reshape(size, per_member, *obs.shape[1:])
        keys = jax.random.split(explore_key, size)
        if episode_draws is not None:
            episode_draws = episode_draws.reshape(size, per_member)
        member_steps = env_steps * per_member
        actions = act(policy, member_obs, keys, hparams, True, member_steps, episode_draws)
        actions = actions.reshape(size * per_member, *actions.shape[2:])
        warmup = random_actions(members.env_spec, random_key, actions.shape)
        warming = jnp.repeat(env_steps < warmup_env_steps, per_member)
        warming = warming.reshape(-1, *(1,) * (actions.ndim - 1))
        return jnp.where(warming, warmup, actions).astype(warmup.dtype)

    length = members.chunk_len
    lanes, rows, _ = rollout(members.env, members.episode_length, lanes, lane_act, key, length)
    return lanes, rows


def evaluate(env, episode_length: int, act: ActFn, key: PRNGKey, lanes: int) -> jax.Array:
    """Return of one full episode on each of `lanes` fresh envs, acting with `act` (held
    constant); lanes that end early wait (uncounted) until the time limit."""
    init_key, act_key = jax.random.split(key)
    states = jax.vmap(env.reset)(jax.random.split(init_key, lanes))

    def one(carry, inputs):
        states, total, running = carry
        step_key, index = inputs
        stepped = jax.vmap(env.step)(states, act(states.obs, step_key, index))
        total = total + jnp.where(running, stepped.reward, 0.0)
        running = running & ~(stepped.done > 0)
        return (stepped, total, running), None

    carry = (states, jnp.zeros(lanes, jnp.float32), jnp.ones(lanes, bool))
    inputs = (jax.random.split(act_key, episode_length), jnp.arange(episode_length))
    (_, total, _), _ = jax.lax.scan(one, carry, inputs)
    return total


def lanes_init(env, lanes: int):
    """`lanes` fresh env lanes from a key: the program device mode makes its lanes with."""
    return functools.partial(init, env, lanes=lanes)


def lanes_shapes(env, lanes: int, identity: str | None = None):
    """Shapes and dtypes of `lanes` fresh lanes, from device mode's lanes program: its stored
    program under `identity` where there is one (loaded, or exported now), else traced."""
    program = stored_programs.stored_jit(lanes_init(env, lanes), identity, "lanes")
    return stored_programs.output_shapes(program, jax.random.key(0))


def env_state_bytes(env, lanes: int, made: int | None = None, identity: str | None = None) -> int:
    """Device bytes of the states of `lanes` lanes of `env` (fastpop.run.parts plans them),
    scaled from the `made` lanes (default `lanes`) of device mode's lanes program, whose shapes
    come from its stored program under `identity` where there is one (a rerun traces nothing:
    MJX's reset took ~0.6 s to trace)."""
    made = made or lanes
    shapes = lanes_shapes(env, made, identity)
    nbytes = lambda tree: sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree))
    shared = nbytes(shapes.key)  # one key for every lane
    return (nbytes(shapes) - shared) // made * lanes + shared


def evaluate_members(env, episode_length: int, agent, policy, hparams, key, episodes: int):
    """(P, episodes) returns of each member's deterministic policy, one episode per lane."""
    size = jax.tree.leaves(hparams)[0].shape[0]
    act = population_act(agent)

    def greedy(obs, step_key, index):
        member_obs = obs.reshape(size, episodes, *obs.shape[1:])
        keys = jax.random.split(step_key, size)
        actions = act(policy, member_obs, keys, hparams, False, 0)
        return actions.reshape(size * episodes, *actions.shape[2:])

    returns = evaluate(env, episode_length, greedy, key, size * episodes)
    return returns.reshape(size, episodes)


def evaluate_on_device(agent, policy, hparams, env_section, episodes: int, seed: int) -> np.ndarray:
    """`fastpop eval` of a device-mode run: (P, episodes) returns on fresh device envs of
    `env_section` (the config's `env`: id, backend, episode length)."""
    from fastpop.envs.device_envs import make_device_env

    env = make_device_env(env_section.id, env_section.backend)
    run = jax.jit(
        lambda policy, hparams, key: evaluate_members(
            env, env_section.episode_length, agent, policy, hparams, key, episodes
        ),
        compiler_options=env_stepping_options(),
    )
    return np.asarray(run(policy, hparams, jax.random.key(seed)))
