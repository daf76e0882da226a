"""An env family is its adapter module and its entry in `device_envs.FAMILIES`: every adapter
carries what the rest of fastpop asks of a family (`LIBRARIES`, the distributions whose versions
key stored programs, included), and the stored programs' key reads the families' libraries
from the registry, so a family added there (here a toy one, at run time) is keyed without
compilation/stored_programs.py naming it."""

from __future__ import annotations

import ast
import importlib.util
import json
import types
from importlib import metadata
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.compilation import stored_programs
from fastpop.envs import device_envs
from fastpop.types import DeviceEnv, EnvSpec
from tests.dependencies import require

PACKAGE = Path(device_envs.__file__).resolve().parents[1]
ADAPTER = ("PREFIX", "EXTRA", "PACKAGE", "PROBE_ID", "LIBRARIES", "BACKENDS")
FUNCTIONS = ("check_id", "make", "discrete_actions", "default_episode_length", "counterpart")
# Modules outside fastpop/envs that still import a family's adapter by name (its physics
# backends): each should ask the registry (device_envs.takes_backend / resolve_backend /
# BACKENDS) instead. Remove a module from here when it does.
STILL_NAMING_A_FAMILY: set[str] = set()


def toy_family(libraries: tuple[str, ...]) -> types.ModuleType:
    """A family of one env, `toy/Counter`, as an adapter module would define it."""
    toy = types.ModuleType("toy_envs")
    toy.PREFIX, toy.EXTRA, toy.PACKAGE, toy.PROBE_ID = "toy/", None, "numpy", "toy/Counter"
    toy.LIBRARIES, toy.BACKENDS = libraries, ()
    toy.check_id = lambda env_id: env_id
    toy.discrete_actions = lambda env_id: False
    toy.default_episode_length = lambda env_id: 5
    toy.counterpart = lambda env_id: None
    spec = EnvSpec((1,), np.dtype(np.float32), action_dim=1)

    toy.make = lambda env_id, backend=None: DeviceEnv(
        lambda key: jnp.zeros(1), lambda state, action: state + action, spec, 5
    )
    return toy


@pytest.mark.parametrize("adapter", device_envs.FAMILIES, ids=lambda a: a.PREFIX)
def test_every_family_carries_what_fastpop_asks_of_one(adapter):
    missing = [name for name in ADAPTER + FUNCTIONS if not hasattr(adapter, name)]
    assert not missing, f"{adapter.__name__} lacks {missing}"
    assert adapter.PREFIX.endswith("/") and adapter.PROBE_ID.startswith(adapter.PREFIX)
    assert all(callable(getattr(adapter, name)) for name in FUNCTIONS)
    assert isinstance(adapter.BACKENDS, tuple)
    if adapter.BACKENDS:
        assert callable(adapter.resolve_backend)
    assert isinstance(adapter.LIBRARIES, tuple) and adapter.LIBRARIES
    assert importlib.util.find_spec(adapter.PACKAGE), "the test extra installs every family"
    for name in adapter.LIBRARIES:  # a misspelt distribution would key nothing
        assert metadata.version(name), name


def test_the_stored_programs_key_covers_every_familys_libraries():
    """Building a device env adds the families' libraries to the key; the key's own list names
    none of them (stored_programs.py names no family)."""
    require("gymnax")
    device_envs.make_device_env("gymnax/CartPole-v1")
    keyed = stored_programs.libraries()
    versions = json.loads(stored_programs.fingerprint())[1]
    for adapter in device_envs.FAMILIES:
        assert set(adapter.LIBRARIES) <= set(keyed) <= set(versions), adapter.PREFIX
        assert versions[adapter.LIBRARIES[0]] == metadata.version(adapter.LIBRARIES[0])
    assert not set(stored_programs.LIBRARIES) & set(device_envs.family_libraries())
    assert {"jax", "jaxlib", "flax"} <= set(stored_programs.LIBRARIES)


def test_a_family_added_to_the_registry_is_keyed_by_its_libraries(monkeypatch):
    toy = toy_family(("fastpop-toy-physics",))
    monkeypatch.setattr(stored_programs, "_library_sources", {})  # as in a fresh process
    before = stored_programs.fingerprint()
    monkeypatch.setattr(device_envs, "FAMILIES", (*device_envs.FAMILIES, toy))
    assert device_envs.family(toy.PROBE_ID) is toy
    env = device_envs.make_device_env(toy.PROBE_ID)
    assert env.spec == toy.make(toy.PROBE_ID).spec
    assert "fastpop-toy-physics" in stored_programs.libraries()
    after = stored_programs.fingerprint()
    assert json.loads(after)[1]["fastpop-toy-physics"] is None  # not installed: still keyed
    assert after != before
    monkeypatch.setattr(device_envs, "FAMILIES", device_envs.FAMILIES[:-1])
    assert "fastpop-toy-physics" not in stored_programs.libraries()  # read from the registry


def test_backends_are_asked_of_the_registry():
    assert device_envs.takes_backend("brax/ant")
    assert not device_envs.takes_backend("gymnax/CartPole-v1")
    assert not device_envs.takes_backend("Pendulum-v1")  # a gymnasium id
    assert device_envs.resolve_backend("brax/ant") == "generalized"
    assert device_envs.resolve_backend("brax/ant", "spring") == "spring"
    assert device_envs.resolve_backend("gymnax/CartPole-v1") is None
    with pytest.raises(ValueError, match=r"only brax/<name> ids have a physics backend"):
        device_envs.resolve_backend("gymnax/CartPole-v1", "spring")
    with pytest.raises(ValueError, match="unknown brax backend"):
        device_envs.resolve_backend("brax/ant", "warp")
    assert set(device_envs.BACKENDS) == {"generalized", "positional", "spring", "mjx"}


def test_outside_the_envs_only_known_modules_import_a_familys_adapter():
    adapters = {adapter.__name__ for adapter in device_envs.FAMILIES}
    naming = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("envs/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named = {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                named = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            else:
                continue
            if named & adapters:
                naming.add(relative)
    assert naming == STILL_NAMING_A_FAMILY, (
        "a module outside fastpop/envs imports a family's adapter: ask device_envs instead "
        "(or, once one no longer does, remove it from STILL_NAMING_A_FAMILY)"
    )
