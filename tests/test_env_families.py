"""An env family is its adapter module and its registration in `device_envs` (`register`):
every adapter carries what the rest of fastpop asks of a family (`LIBRARIES`, the distributions
whose versions key stored programs, included), and everything said of the families (their id
forms, backends, libraries) is read from the registry when it is asked, so a family registered
at run time (here a toy one, as a plugin would) is found by its ids, accepted by the config's
checks, named in its messages and keyed without compilation/stored_programs.py naming it."""

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
from fastpop.config import ConfigError, load_config
from fastpop.config.env import collection_mode
from fastpop.envs import device_envs
from fastpop.types import DeviceEnv, EnvSpec
from tests.dependencies import require

PACKAGE = Path(device_envs.__file__).resolve().parents[1]
ADAPTER, FUNCTIONS = device_envs.ADAPTER_CONSTANTS, device_envs.ADAPTER_FUNCTIONS
# Modules outside fastpop/envs that still import a family's adapter by name (its physics
# backends): each should ask the registry (device_envs.takes_backend / resolve_backend /
# BACKENDS) instead. Remove a module from here when it does.
STILL_NAMING_A_FAMILY: set[str] = set()


def toy_family(libraries: tuple[str, ...], backends: tuple[str, ...] = ()) -> types.ModuleType:
    """A family of one env, `toy/Counter`, as an adapter module would define it."""
    toy = types.ModuleType("toy_envs")
    toy.PREFIX, toy.EXTRA, toy.PACKAGE, toy.PROBE_ID = "toy/", None, "numpy", "toy/Counter"
    toy.LIBRARIES, toy.BACKENDS = libraries, backends
    toy.resolve_backend = lambda env_id, backend: backend or backends[0]
    toy.check_id = lambda env_id: env_id
    toy.discrete_actions = lambda env_id: False
    toy.default_episode_length = lambda env_id: 5
    toy.counterpart = lambda env_id: None
    spec = EnvSpec((1,), np.dtype(np.float32), action_dim=1)

    toy.make = lambda env_id, backend=None: DeviceEnv(
        lambda key: jnp.zeros(1), lambda state, action: state + action, spec, 5
    )
    return toy


@pytest.mark.parametrize("adapter", device_envs.families(), ids=lambda a: a.PREFIX)
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
    for adapter in device_envs.families():
        assert set(adapter.LIBRARIES) <= set(keyed) <= set(versions), adapter.PREFIX
        assert versions[adapter.LIBRARIES[0]] == metadata.version(adapter.LIBRARIES[0])
    assert not set(stored_programs.LIBRARIES) & set(device_envs.family_libraries())
    assert {"jax", "jaxlib", "flax"} <= set(stored_programs.LIBRARIES)


@pytest.fixture
def registered():
    """register(adapter) as a plugin calls it, the family removed again after the test."""
    prefixes = []

    def register(adapter):
        prefixes.append(adapter.PREFIX)
        return device_envs.register(adapter)

    yield register
    for prefix in prefixes:
        device_envs.unregister(prefix)


def test_a_family_registered_at_run_time_is_keyed_by_its_libraries(monkeypatch, registered):
    toy = toy_family(("fastpop-toy-physics",))
    monkeypatch.setattr(stored_programs, "_library_sources", {})  # as in a fresh process
    before = stored_programs.fingerprint()
    registered(toy)
    assert device_envs.family(toy.PROBE_ID) is toy and device_envs.families()[-1] is toy
    env = device_envs.make_device_env(toy.PROBE_ID)
    assert env.spec == toy.make(toy.PROBE_ID).spec
    assert "fastpop-toy-physics" in stored_programs.libraries()
    after = stored_programs.fingerprint()
    assert json.loads(after)[1]["fastpop-toy-physics"] is None  # not installed: still keyed
    assert after != before
    device_envs.unregister(toy.PREFIX)
    assert "fastpop-toy-physics" not in stored_programs.libraries()  # read from the registry
    assert device_envs.family(toy.PROBE_ID) is None


def test_a_family_registered_at_run_time_is_configured_as_the_built_ins_are(registered):
    """Its ids are device ids, its backends env.backend's choices, and the messages listing
    the families' id forms name it: read from the registry when a config is read."""
    registered(toy_family(("fastpop-toy-physics",), backends=("abacus",)))
    config = load_config(None, ["env.id=toy/Counter", "env.backend=abacus"])
    assert config.env.backend == "abacus" and config.env.episode_length == 5
    assert collection_mode(config) == "device"
    assert "abacus" in device_envs.BACKENDS and device_envs.takes_backend("toy/Counter")
    assert device_envs.resolve_backend("toy/Counter") == "abacus"
    assert device_envs.families()[-1].PREFIX == "toy/" and "toy/<name>" in device_envs.id_forms()
    forms = "brax/<name>, gymnax/<name>, playground/<name>, toy/<name>"
    with pytest.raises(ConfigError, match=rf"device steps JAX environments \(env.id: {forms}\)"):
        load_config(None, ["env.id=Pendulum-v1", "collect.mode=device"])
    with pytest.raises(ConfigError, match=r"only brax, toy environments \(env.id: brax/<name>, "):
        load_config(None, ["env.id=Pendulum-v1", "env.backend=abacus"])
    with pytest.raises(ConfigError, match=r"env.backend: must be one of generalized, .*abacus"):
        load_config(None, ["env.id=toy/Counter", "env.backend=warp"])
    device_envs.unregister("toy/")
    with pytest.raises(ConfigError, match=r"env.backend: must be one of .*mjx, got 'abacus'"):
        load_config(None, ["env.id=brax/ant", "env.backend=abacus"])


def test_a_family_is_refused_a_taken_prefix_or_a_missing_name(registered):
    toy = registered(toy_family(("fastpop-toy-physics",)))
    again = toy_family(())
    with pytest.raises(ValueError, match=r"prefix 'toy/' is taken by toy_envs \('toy/'\)"):
        device_envs.register(again)
    again.PREFIX = "toy/sub/"  # an id of it would be toy's too
    with pytest.raises(ValueError, match=r"prefix 'toy/sub/' is taken by toy_envs"):
        device_envs.register(again)
    with pytest.raises(ValueError, match=r"prefix 'brax/' is taken by fastpop.envs.brax_envs"):
        device_envs.register(types.SimpleNamespace(**{**vars(toy), "PREFIX": "brax/"}))
    del again.counterpart
    again.PREFIX = "other/"
    with pytest.raises(ValueError, match=r"env family toy_envs lacks counterpart"):
        device_envs.register(again)
    assert device_envs.families()[-1] is toy and device_envs.family("other/x") is None


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
    assert device_envs.backend_family_names() == "brax"


def test_outside_the_envs_only_known_modules_import_a_familys_adapter():
    adapters = {adapter.__name__ for adapter in device_envs.families()}
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
