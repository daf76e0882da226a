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
and its registration here (`register`: the built-ins below, a plugin from its own module): code
elsewhere asks this registry, never a family by name (tests/test_env_families.py lists the
modules that still do), and everything said of the families (`families`, `id_forms`,
`BACKENDS`, ...) is read from the registry when it is asked, so a family registered later is in
it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from types import ModuleType

from fastpop.envs import brax_envs, gymnax_envs, playground_envs
from fastpop.types import DeviceEnv, EnvSpec

# What an adapter defines: its constants, then its functions (`resolve_backend` too where it
# has `BACKENDS`).
ADAPTER_CONSTANTS = ("PREFIX", "EXTRA", "PACKAGE", "PROBE_ID", "LIBRARIES", "BACKENDS")
ADAPTER_FUNCTIONS = (
    "check_id",
    "make",
    "discrete_actions",
    "default_episode_length",
    "counterpart",
)

_FAMILIES: dict[str, ModuleType] = {}  # PREFIX -> adapter, in registration order


def _label(adapter) -> str:
    return getattr(adapter, "__name__", None) or repr(adapter)


def register(adapter: ModuleType) -> ModuleType:
    """Add a family's adapter (a module, or any object with its names); ValueError for one that
    lacks a name fastpop asks of it, or whose `PREFIX` is taken or overlaps another's (an id
    would belong to both)."""
    missing = [name for name in ADAPTER_CONSTANTS + ADAPTER_FUNCTIONS if not hasattr(adapter, name)]
    if getattr(adapter, "BACKENDS", ()) and not hasattr(adapter, "resolve_backend"):
        missing.append("resolve_backend")
    label = _label(adapter)
    if missing:
        raise ValueError(f"env family {label} lacks {', '.join(missing)}")
    prefix = adapter.PREFIX
    if not (isinstance(prefix, str) and prefix.endswith("/") and len(prefix) > 1):
        raise ValueError(f"env family {label}: PREFIX must end with '/', as 'brax/' does")
    for taken, other in _FAMILIES.items():
        if prefix.startswith(taken) or taken.startswith(prefix):
            raise ValueError(
                f"env family {label}: prefix {prefix!r} is taken by {_label(other)} "
                f"({taken!r}); a family's ids need a prefix of their own"
            )
    _FAMILIES[prefix] = adapter
    return adapter


def unregister(prefix: str) -> None:
    """Remove a family registered at run time (a test's toy); an unknown prefix is ignored."""
    _FAMILIES.pop(prefix, None)


for _adapter in (brax_envs, gymnax_envs, playground_envs):
    register(_adapter)


def families() -> tuple[ModuleType, ...]:
    """Every registered family's adapter, the built-ins first."""
    return tuple(_FAMILIES.values())


def id_forms(with_backends: bool = False) -> str:
    """The device ids' forms, for messages: "brax/<name>, gymnax/<name>, playground/<name>"
    (`with_backends`: only the families with physics backends)."""
    return ", ".join(f"{f.PREFIX}<name>" for f in families() if f.BACKENDS or not with_backends)


def backend_family_names() -> str:
    """The families with physics backends, for messages: "brax"."""
    return ", ".join(f.PREFIX.rstrip("/") for f in families() if f.BACKENDS)


class Backends:
    """Every family's physics backends, read from the registry each time: `env.backend`'s
    choices (a config field's choices that follows `register`)."""

    def names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(name for f in families() for name in f.BACKENDS))

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return repr(self.names())


BACKENDS = Backends()


def family(env_id: str):
    """The adapter module of a device id, or None for an id stepped in collector processes."""
    return next((f for f in families() if env_id.startswith(f.PREFIX)), None)


def is_device_id(env_id: str) -> bool:
    return family(env_id) is not None


def family_libraries() -> tuple[str, ...]:
    """The distributions every family's programs hold (their `LIBRARIES`), read from the
    registry each time: what stored programs add to their key (`make_device_env`)."""
    return tuple(sorted({name for family in families() for name in family.LIBRARIES}))


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
                f"backend {backend!r}: only {id_forms(with_backends=True)} ids have a physics "
                f"backend, and {env_id} is not one"
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
