"""Brax environments by id: `brax/<name>` for every environment in brax's registry, and their
adapter to the DeviceEnv protocol (device_envs.py: `check_id`, `make`, ...).

`check_brax_id` validates an id (close names suggested, as for gymnasium ids), `make_brax_env`
builds the brax environment once per (id, backend) and `brax_env_spec` gives its EnvSpec.
The environment is brax's own, unwrapped: no EpisodeWrapper or AutoResetWrapper, since the
device rollout (collect/device_rollout.py) applies `env.episode_length` and next-step autoreset
itself. Actions are in [-1, 1] for every brax environment (those whose actuators have another
control range rescale [-1, 1] to it, e.g. inverted_pendulum, humanoid, pusher; the rest clip).

Importing brax is slow (seconds) and `mujoco.mjx` prints to stdout when it cannot import warp;
brax is imported only when a brax id is checked or built, with that output silenced.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import time
import warnings

import numpy as np

from fastpop.envs.errors import UnknownEnvironment, close_names, missing_extra
from fastpop.envs.mjx_import import import_mjx
from fastpop.types import DeviceEnv, EnvSpec

PREFIX = "brax/"
BACKENDS = ("generalized", "positional", "spring", "mjx")
EPISODE_LENGTH = 1000  # brax's EpisodeWrapper default
EXTRA, PACKAGE = "brax", "brax"
# The distributions whose code brax's programs hold (MJX's: brax loads models with MuJoCo and
# its mjx pipeline is MJX): their versions key stored programs (device_envs.family_libraries).
LIBRARIES = ("brax", "mujoco", "mujoco-mjx")
INSTALL = f"pip install -e '.[{EXTRA}]'"
PROBE_ID = "brax/inverted_pendulum"  # what `fastpop doctor` builds to check the family
# brax 0.14's registry, so that ids are recognised and suggested without importing brax; where
# brax is installed its own registry (`brax.envs._envs`) is used instead.
_NAMES = """ant fast halfcheetah hopper humanoid humanoidstandup inverted_double_pendulum
inverted_pendulum pusher reacher swimmer walker2d""".split()  # noqa: SIM905 (as envs._ATARI_GAMES)

# The backend `env.backend: null` picks: brax's own default, generalized (the closest to MuJoCo),
# for every environment and platform, so `brax/<name>` is the system brax and published results
# mean. spring is a choice for speed: env-steps/s of jit(scan(vmap(step))) at batch 256 on a
# loaded 2-core CPU (`python -m fastpop.envs.brax_envs`, docs/device-mode-and-env-families.md):
# spring 2-5x positional and generalized on ant, halfcheetah and inverted_pendulum, and quickest
# to compile; but it is brax's least accurate pipeline, and on it inverted_pendulum is another
# system (dt 0.02 s; TD3 and SAC did not learn it in 20-30k steps,
# results/brax_inverted_pendulum_cpu/).
DEFAULT_BACKEND = "generalized"

# Each brax environment's task in gymnasium's MuJoCo suite, where it has one: what `fastpop bench
# device` trains in process mode beside the device-mode row (a brax id itself runs in device
# mode only). The same task and reward design, not the same physics or observation.
MUJOCO_COUNTERPARTS = {
    "ant": "Ant-v5",
    "halfcheetah": "HalfCheetah-v5",
    "hopper": "Hopper-v5",
    "humanoid": "Humanoid-v5",
    "humanoidstandup": "HumanoidStandup-v5",
    "inverted_double_pendulum": "InvertedDoublePendulum-v5",
    "inverted_pendulum": "InvertedPendulum-v5",
    "pusher": "Pusher-v5",
    "reacher": "Reacher-v5",
    "swimmer": "Swimmer-v5",
    "walker2d": "Walker2d-v5",
}


def is_brax_id(env_id: str) -> bool:
    return env_id.startswith(PREFIX)


def brax_installed() -> bool:
    return importlib.util.find_spec("brax") is not None


@functools.cache
def _brax_envs():
    """brax.envs, imported after MuJoCo MJX (without Warp: envs/mjx_import.py), with jaxopt's
    deprecation warning and anything printed on stdout silenced."""
    import_mjx()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from brax import envs
    return envs


def known_names() -> tuple[str, ...]:
    """brax's registered environment names (a fixed list where brax is not installed)."""
    names = _brax_envs()._envs if brax_installed() else _NAMES
    return tuple(sorted(names))


def _key(name: str) -> str:
    return name.lower().replace("_", "").replace("-", "")


def check_brax_id(env_id: str) -> str:
    """The canonical id (`brax/half_cheetah` -> `brax/halfcheetah`), or a user-facing error:
    `UnknownEnvironment` with close names and the known ones, or `MissingExtra` without brax."""
    name, names = env_id[len(PREFIX) :], known_names()
    by_key = {_key(known): known for known in names}
    if _key(name) not in by_key:
        hint = close_names(_key(name), by_key, PREFIX)
        known = ", ".join(PREFIX + known for known in names)
        raise UnknownEnvironment(f"{env_id}: unknown brax environment; {hint}Known: {known}")
    if not brax_installed():
        raise missing_extra(env_id, "brax", INSTALL)
    return PREFIX + by_key[_key(name)]


def mujoco_counterpart(env_id: str) -> str | None:
    """The gymnasium id of a (canonical) brax id's task, or None (`MUJOCO_COUNTERPARTS`)."""
    return MUJOCO_COUNTERPARTS.get(env_id[len(PREFIX) :])


def check_backend(backend: str | None) -> None:
    if backend is not None and backend not in BACKENDS:
        raise ValueError(
            f"unknown brax backend {backend!r}; use one of {', '.join(BACKENDS)} "
            "(or null: the fastest for the environment)"
        )


def default_backend(env_id: str) -> str:
    """The backend `env.backend: null` means for `env_id` (the same on every platform)."""
    del env_id  # one backend measured fastest for all; a per-environment table would go here
    return DEFAULT_BACKEND


def resolve_backend(env_id: str, backend: str | None = None) -> str:
    """`backend` if given (checked), else `default_backend(env_id)`."""
    check_backend(backend)
    return default_backend(env_id) if backend is None else backend


def make_brax_env(env_id: str, backend: str | None = None):
    """The brax environment of `env_id` on `backend` (None: `default_backend`), built once per
    process for each (id, backend): building parses the MJCF model. Unwrapped (see above)."""
    env_id = check_brax_id(env_id)
    return _make(env_id, resolve_backend(env_id, backend))


@functools.cache
def _make(env_id: str, backend: str):
    envs = _brax_envs()
    with warnings.catch_warnings(), _systems_loaded_without_copies():
        # "Brax System, pipelines ... not actively maintained"
        warnings.filterwarnings("ignore", message="Brax System", category=UserWarning)
        return envs.get_environment(env_id[len(PREFIX) :], backend=backend)


@contextlib.contextmanager
def _systems_loaded_without_copies():
    """brax's `mjcf.load_model` ends with `jax.tree.map(jp.array, sys)`: a copy of each of the
    system's leaves, every one a program JAX compiles (or loads from the cache) on its own: 41
    for the inverted pendulum, ~0.5 s of every start on the 2-core CPU. Here `jp.array` gives a
    JAX array back as it is (immutable: the copy changes nothing) and puts host data on the
    device as `jnp.array` would (same dtype), compiling nothing; tests/test_brax_config.py
    checks the system is leaf for leaf brax's own. Where brax's module is not as expected, it
    is left alone."""
    import jax
    import jax.numpy as jnp
    from brax.io import mjcf

    if getattr(mjcf, "jp", None) is not jnp:
        yield
        return
    mjcf.jp = _NumpyWithoutCopies(jax, jnp)
    try:
        yield
    finally:
        mjcf.jp = jnp


class _NumpyWithoutCopies:
    """`jax.numpy` but for `array` (see `_systems_loaded_without_copies`)."""

    def __init__(self, jax, jnp):
        self._jax, self._jnp = jax, jnp

    def __getattr__(self, name: str):
        return getattr(self._jnp, name)

    def array(self, value):
        if isinstance(value, self._jax.Array):
            return value
        if isinstance(value, bool | int | float | complex):  # weakly typed, as `jnp.array`'s
            return self._jax.device_put(value)
        # a private copy: on the CPU, JAX may keep using the host memory it was given (some
        # of it the MuJoCo model's own arrays)
        return self._jax.device_put(np.array(value, copy=True))


@functools.cache
def brax_env_spec(env_id: str, backend: str | None = None) -> EnvSpec:
    """Observation (observation_size,) float32 and action_size actions in [-1, 1]. The shapes
    are the same on every backend; the observation's comes from tracing a reset (no compile)."""
    import jax

    env = make_brax_env(env_id, backend)
    obs = jax.eval_shape(env.reset, jax.random.PRNGKey(0)).obs
    if not hasattr(obs, "shape") or len(obs.shape) != 1:
        raise ValueError(f"{env_id}: fastpop needs a flat observation vector, got {obs}")
    return EnvSpec((int(obs.shape[0]),), np.dtype(obs.dtype), action_dim=int(env.action_size))


# --- the DeviceEnv adapter (device_envs.py) ---

check_id = check_brax_id
counterpart = mujoco_counterpart


def discrete_actions(env_id: str) -> bool:
    del env_id
    return False  # every brax environment has continuous actions


def default_episode_length(env_id: str) -> int:
    del env_id
    return EPISODE_LENGTH


def make(env_id: str, backend: str | None = None) -> DeviceEnv:
    """brax's own reset and step: its `state.done` is already a termination only (no
    EpisodeWrapper)."""
    env = make_brax_env(env_id, backend)
    return DeviceEnv(env.reset, env.step, brax_env_spec(env_id, backend), EPISODE_LENGTH)


def _stepper(env, batch: int, steps: int):
    """A compiled `steps`-step scan of vmap(env.step) under random actions, and its state."""
    import jax

    def run(state, key):
        actions = jax.random.uniform(key, (steps, batch, env.action_size), minval=-1, maxval=1)
        return jax.lax.scan(lambda s, a: (jax.vmap(env.step)(s, a), None), state, actions)[0]

    keys = jax.random.split(jax.random.PRNGKey(0), batch)
    state = jax.jit(jax.vmap(env.reset))(keys)
    run = jax.jit(run)
    jax.block_until_ready(run(state, jax.random.PRNGKey(1)))  # compile
    return run, state


def measure_backends(
    env_id: str, backends=BACKENDS[:3], batch: int = 256, steps: int = 50, rounds: int = 3
) -> dict[str, tuple[float, list[float]]]:
    """Per backend: (seconds to build and compile, env-steps/s of each round) of `steps`
    steps of `batch` environments, the backends interleaved within each round (so a change in
    machine load touches them all alike)."""
    import jax

    runs, compile_seconds = {}, {}
    for backend in backends:
        start = time.perf_counter()
        runs[backend] = _stepper(make_brax_env(env_id, backend), batch, steps)
        compile_seconds[backend] = time.perf_counter() - start
    rates = {backend: [] for backend in backends}
    for round_index in range(rounds):
        for backend, (run, state) in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(run(state, jax.random.PRNGKey(2 + round_index)))
            rates[backend].append(batch * steps / (time.perf_counter() - start))
    return {backend: (compile_seconds[backend], rates[backend]) for backend in backends}


def _main(argv: list[str]) -> None:
    import jax

    platform = jax.default_backend()
    print("env-steps/s (median, max of 3 rounds) and seconds to compile jit(scan(vmap(step)))")
    print(f"at batch 256 on {platform}")
    backends = BACKENDS[:3] if platform == "cpu" else BACKENDS  # mjx: far too slow on a CPU
    for name in argv or ["inverted_pendulum", "halfcheetah"]:
        env_id = check_brax_id(PREFIX + name)
        cells = [
            f"{b} {np.median(r):,.0f} ({max(r):,.0f}) {seconds:.0f}s"
            for b, (seconds, r) in measure_backends(env_id, backends).items()
        ]
        print(f"{env_id}: {'  '.join(cells)}; default: {default_backend(env_id)}", flush=True)


if __name__ == "__main__":
    import sys

    _main(sys.argv[1:])
