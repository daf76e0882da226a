"""Environments stepped on the device, one protocol for every family: brax (`brax/<name>`,
brax_envs.py), gymnax (`gymnax/<name>`, gymnax_envs.py) and MuJoCo Playground
(`playground/<Name>`, playground_envs.py).

    DeviceEnv(reset, step, spec, episode_length)     (fastpop.types)
        reset(key) -> state          state.obs, state.reward, state.done are read
        step(state, action) -> state
        state.done                   a termination only, never a time limit

The device rollout (collect/device_rollout.py) applies the time limit (`env.episode_length`,
default the family's own) and gymnasium's next-step autoreset itself, so truncation keeps the
real final observation and bootstraps, termination does not. Each family is a small adapter
module with `PREFIX`, `check_id(env_id) -> canonical id` (UnknownEnvironment with close names,
MissingExtra), `make(env_id, backend) -> DeviceEnv`, `discrete_actions(env_id)` (without building
the env where the family knows), `default_episode_length(env_id)`, `counterpart(env_id) ->
gymnasium id or None`, `LIBRARIES` (the distributions whose code its programs hold: their
versions key stored programs, compilation/stored_programs.py) and `BACKENDS` (its physics
pipelines, () for none; with some, `resolve_backend(env_id, backend)`). A family is its adapter
and its entry in `FAMILIES`: code elsewhere asks this registry, never a family by name
(tests/test_env_families.py lists the modules that still do).
"""

from __future__ import annotations

import functools

from fastpop.envs import brax_envs, gymnax_envs, playground_envs
from fastpop.types import DeviceEnv, EnvSpec

FAMILIES = (brax_envs, gymnax_envs, playground_envs)
# For messages: "brax/<name>, gymnax/<name>, playground/<name>"
ID_FORMS = ", ".join(f"{family.PREFIX}<name>" for family in FAMILIES)
# Every family's physics backends (env.backend's choices), and the ids that take one.
BACKENDS = tuple(dict.fromkeys(name for family in FAMILIES for name in family.BACKENDS))
BACKEND_ID_FORMS = ", ".join(f"{family.PREFIX}<name>" for family in FAMILIES if family.BACKENDS)
BACKEND_FAMILY_NAMES = ", ".join(f.PREFIX.rstrip("/") for f in FAMILIES if f.BACKENDS)


def family(env_id: str):
    """The adapter module of a device id, or None for an id stepped in collector processes."""
    return next((f for f in FAMILIES if env_id.startswith(f.PREFIX)), None)


def is_device_id(env_id: str) -> bool:
    return family(env_id) is not None


def family_libraries() -> tuple[str, ...]:
    """The distributions every family's programs hold (their `LIBRARIES`), read from `FAMILIES`
    each time: what stored programs add to their key (`make_device_env`)."""
    return tuple(sorted({name for family in FAMILIES for name in family.LIBRARIES}))


def takes_backend(env_id: str) -> bool:
    """Whether `env_id` (any id, gymnasium's too) belongs to a family with physics backends."""
    adapter = family(env_id)
    return adapter is not None and bool(adapter.BACKENDS)


def resolve_backend(env_id: str, backend: str | None = None) -> str | None:
    """The backend `backend` (None: the family's default) means for a device id, checked
    (ValueError); None for a family without backends, which refuses one."""
    adapter = family(env_id)
    if not adapter.BACKENDS:
        if backend is not None:
            raise ValueError(
                f"backend {backend!r}: only {BACKEND_ID_FORMS} ids have a physics backend, "
                f"and {env_id} is not one"
            )
        return None
    return adapter.resolve_backend(env_id, backend)


def check_device_id(env_id: str) -> str:
    """The canonical id, or the family's user-facing error (UnknownEnvironment, MissingExtra)."""
    return family(env_id).check_id(env_id)


@functools.cache
def make_device_env(env_id: str, backend: str | None = None) -> DeviceEnv:
    """The device env of `env_id`, built once per process (`backend`: `takes_backend` ids). Its
    `reset` and `step` are jitted here, once: the programs that step it (the lanes' shapes for
    the memory check, the chunk, the evaluation) then share one trace of each instead of
    tracing the env's Python again (brax's pendulum reset: ~0.5 s each time)."""
    import jax

    from fastpop.compilation import stored_programs  # imports JAX: not at this module's import

    # The programs that step it hold its family's libraries: their versions key stored ones.
    stored_programs.add_library_source(family_libraries)
    adapter = family(env_id)
    env = adapter.make(adapter.check_id(env_id), backend)
    return env._replace(reset=jax.jit(env.reset), step=jax.jit(env.step))


def device_env_spec(env_id: str, backend: str | None = None) -> EnvSpec:
    return make_device_env(env_id, backend).spec


def default_episode_length(env_id: str) -> int:
    """The time limit `env.episode_length: null` means: brax's and Playground's 1000, gymnax's
    registered one."""
    adapter = family(env_id)
    return adapter.default_episode_length(adapter.check_id(env_id))


def discrete_actions(env_id: str) -> bool:
    adapter = family(env_id)
    return adapter.discrete_actions(adapter.check_id(env_id))


def process_counterpart(env_id: str) -> str | None:
    """The gymnasium id of a device env's task (what `fastpop bench device` trains in process
    mode beside it), or None."""
    adapter = family(env_id)
    return adapter.counterpart(adapter.check_id(env_id))
