"""Brax environments by id (`brax/<name>`), `env.backend`, `env.episode_length` and
`collect.mode`: what is accepted, the specs, and every refusal with its message (exit 2)."""

from __future__ import annotations

import ast
import inspect
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from fastpop import envs
from fastpop.commands import cli
from fastpop.config import ConfigError, collection_mode, load_config, save_config
from fastpop.config import env as env_config
from fastpop.envs import brax_envs
from fastpop.envs.errors import MissingExtra, UnknownEnvironment
from fastpop.types import EnvSpec
from tests.dependencies import require


@pytest.fixture
def brax_package():
    require("brax")


needs_brax = pytest.mark.usefixtures("brax_package")
PENDULUM = "env.id=brax/inverted_pendulum"


def refusal(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    return str(error.value)


@needs_brax
def test_brax_ids_are_accepted_and_normalized():
    assert envs.check_env_id("brax/inverted_pendulum") == "brax/inverted_pendulum"
    assert envs.check_env_id("brax/half_cheetah") == "brax/halfcheetah"
    assert envs.check_env_id("brax/InvertedPendulum") == "brax/inverted_pendulum"
    assert load_config(None, ["env.id=brax/HalfCheetah"]).env.id == "brax/halfcheetah"
    # Every name in brax's registry is an id; the fixed list used without brax is the same.
    from brax import envs as registry

    assert brax_envs.known_names() == tuple(sorted(registry._envs)) == tuple(brax_envs._NAMES)
    for name in registry._envs:
        assert envs.check_env_id(f"brax/{name}") == f"brax/{name}"


@needs_brax
def test_brax_specs():
    pendulum = envs.env_spec("brax/inverted_pendulum")
    assert pendulum == EnvSpec((4,), np.dtype(np.float32), action_dim=1)
    assert (pendulum.action_low, pendulum.action_high) == (-1.0, 1.0)  # brax rescales to +-3
    assert not pendulum.discrete and pendulum.frame_stack == 1
    cheetah = envs.env_spec("brax/halfcheetah", backend="spring")
    assert cheetah == EnvSpec((17,), np.dtype(np.float32), action_dim=6)
    env = brax_envs.make_brax_env("brax/halfcheetah", "spring")
    assert env.observation_size == 17 and env.action_size == 6 and env.backend == "spring"


@needs_brax
def test_make_brax_env_is_built_once_per_id_and_backend():
    env = brax_envs.make_brax_env("brax/inverted_pendulum", "positional")
    assert brax_envs.make_brax_env("brax/InvertedPendulum", "positional") is env
    assert brax_envs.make_brax_env("brax/inverted_pendulum", "spring") is not env
    default = brax_envs.make_brax_env("brax/inverted_pendulum")
    assert default.backend == brax_envs.default_backend("brax/inverted_pendulum")
    with pytest.raises(ValueError, match="unknown brax backend 'sprng'; use one of generalized, "):
        brax_envs.make_brax_env("brax/inverted_pendulum", "sprng")
    with pytest.raises(ValueError, match="stepped on the device: build it with make_device_env"):
        envs.make_env("brax/inverted_pendulum", seed=0)


@needs_brax
def test_default_backend_is_braxs_own():
    # env.backend: null means the system brax itself builds for the name (its generalized
    # pipeline), the same on every platform; spring is a choice for speed.
    from brax import envs as brax_registry

    for name in ("ant", "halfcheetah", "inverted_pendulum"):
        assert brax_envs.default_backend(f"brax/{name}") == "generalized"
        assert brax_registry.get_environment(name).backend == "generalized"
    assert brax_envs.resolve_backend("brax/ant", "spring") == "spring"
    assert brax_envs.resolve_backend("brax/ant") == "generalized"


def test_unknown_brax_name_suggests_close_names():
    with pytest.raises(UnknownEnvironment) as error:
        envs.check_env_id("brax/halfcheeta")
    message = str(error.value)
    assert message.startswith("brax/halfcheeta: unknown brax environment; did you mean ")
    assert "brax/halfcheetah" in message.split("?")[0]
    assert "Known: brax/ant, brax/fast, brax/halfcheetah, " in message
    with pytest.raises(UnknownEnvironment, match=r"^brax/zzz: unknown brax environment; Known: "):
        envs.check_env_id("brax/zzz")
    message = refusal(["env.id=brax/humanoidd"])
    assert message.startswith("env.id: brax/humanoidd: unknown brax environment; did you mean ")
    assert "brax/humanoid" in message and message.endswith("(from --set env.id=brax/humanoidd)")


def test_missing_brax_names_the_extra(monkeypatch):
    monkeypatch.setattr(brax_envs, "brax_installed", lambda: False)
    with pytest.raises(MissingExtra) as error:
        envs.check_env_id("brax/ant")
    assert str(error.value) == (
        "environment 'brax/ant' needs the 'brax' package, which is not installed; "
        "install it with pip install -e '.[brax]'"
    )
    with pytest.raises(UnknownEnvironment, match="did you mean brax/ant"):  # without brax too
        envs.check_env_id("brax/antt")
    assert "pip install -e '.[brax]'" in refusal(["env.id=brax/ant"])


def test_backend_typo_is_refused_naming_the_backends():
    message = refusal([PENDULUM, "env.backend=genralized"])
    assert message == (
        "env.backend: must be one of generalized, positional, spring, mjx, got 'genralized' "
        "(from --set env.backend=genralized)"
    )


def test_brax_only_fields_are_refused_for_gymnasium_ids():
    message = refusal(["env.backend=spring"])
    assert message.startswith(
        "env.backend: only brax environments (env.id: brax/<name>) have a physics backend, "
        "and Pendulum-v1 is not one: remove env.backend (or set it to null)"
    )
    message = refusal(["env.id=CartPole-v1", "algo=dqn", "env.episode_length=200"])
    assert message.startswith(
        "env.episode_length: only environments stepped on the device (env.id: brax/<name>, "
        "gymnax/<name>, playground/<name>) take a time limit here"
    )
    assert "CartPole-v1 is not one: remove env.episode_length" in message


def test_collection_mode_defaults_follow_the_env():
    brax = load_config(None, [PENDULUM])
    assert brax.collect.mode is None and collection_mode(brax) == "device"
    assert brax.env.episode_length == brax_envs.EPISODE_LENGTH == 1000 and brax.env.backend is None
    gym = load_config(None)
    assert collection_mode(gym) == "processes" and gym.env.episode_length is None
    explicit = load_config(None, [PENDULUM, "collect.mode=device", "env.episode_length=200"])
    assert collection_mode(explicit) == "device" and explicit.env.episode_length == 200
    assert collection_mode(load_config(None, ["collect.mode=processes"])) == "processes"
    # Collector counts do not apply on the device: one member, the default two collectors.
    assert load_config(None, [PENDULUM, "population.size=1"]).population.size == 1
    assert "collect.num_collectors: must be <=" in refusal(["population.size=1"])


def test_the_collection_mode_is_worked_out_by_config_validation_and_run_parts_only():
    """Everything else takes it from `RunParts.collection_mode` (or asks about the env)."""
    package = Path(__file__).resolve().parents[1] / "fastpop"
    allowed = {package / "run" / "parts.py", *(package / "config").glob("*.py")}
    callers = []
    for path in sorted(set(package.rglob("*.py")) - allowed):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and "collection_mode" in ast.unparse(node.func):
                callers.append(f"{path.relative_to(package)}:{node.lineno}")
    assert callers == []


def test_collection_mode_mismatches_are_refused():
    message = refusal([PENDULUM, "collect.mode=processes"])
    assert message == (
        "collect.mode: processes steps gymnasium environments in collector processes, and "
        "brax/inverted_pendulum is stepped on the device: use "
        "collect.mode: device (or null) (from --set collect.mode=processes)"
    )
    message = refusal(["collect.mode=device"])
    assert message.startswith(
        "collect.mode: device steps JAX environments (env.id: brax/<name>, gymnax/<name>, "
        "playground/<name>) on the device, and "
        "Pendulum-v1 is a gymnasium environment, stepped in collector processes: use "
        "collect.mode: processes (or null)"
    )
    assert "must be one of processes, device, got 'gpu'" in refusal(["collect.mode=gpu"])


def test_dqn_on_brax_is_refused():
    message = refusal([PENDULUM, "algo=dqn"])
    assert message.startswith(
        "algo: dqn needs discrete actions, and brax/inverted_pendulum has continuous ones: use "
        "td3 or sac"
    )
    assert load_config(None, [PENDULUM, "algo=sac"]).algo == "sac"


def test_dqn_on_a_brax_preset_names_the_actions_before_the_td3_hparams():
    """A brax preset's hparams are TD3's: with algo=dqn the env's continuous actions are the
    reason to give, not the unknown key hparams.actor_lr."""
    preset = Path(__file__).resolve().parents[1] / "configs" / "td3_brax_inverted_pendulum_cpu.yaml"
    with pytest.raises(ConfigError) as refused:
        load_config(preset, ["algo=dqn"])
    assert str(refused.value).startswith("algo: dqn needs discrete actions"), refused.value


def test_brax_config_round_trips(tmp_path):
    config = load_config(None, [PENDULUM, "env.backend=positional", "env.episode_length=300"])
    save_config(config, tmp_path / "resolved.yaml")
    assert load_config(tmp_path / "resolved.yaml") == config
    gym = load_config(None)
    save_config(gym, tmp_path / "gym.yaml")
    assert load_config(tmp_path / "gym.yaml") == gym


@pytest.mark.parametrize(
    "overrides,fragment",
    [
        ([PENDULUM, "env.backend=genralized"], "env.backend: must be one of generalized, "),
        ([PENDULUM, "algo=dqn"], "algo: dqn needs discrete actions"),
        (["env.id=brax/halfcheeta"], "did you mean brax/halfcheetah"),
    ],
)
def test_cli_exits_2_before_creating_the_run(tmp_path, capsys, overrides, fragment):
    out = tmp_path / "run"
    argv = ["train", "--out", str(out)]
    for override in overrides:
        argv += ["--set", override]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith("fastpop: error: ") and fragment in error
    assert "Traceback" not in error and os.listdir(tmp_path) == []


def test_env_fields_have_docstrings():
    tree = ast.parse(inspect.getsource(env_config))
    (env_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for i, statement in enumerate(env_class.body):
        if isinstance(statement, ast.AnnAssign):
            following = env_class.body[i + 1]
            assert isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant)


@needs_brax
@pytest.mark.parametrize(
    ("name", "backend"), [("inverted_pendulum", "generalized"), ("ant", "spring")]
)
def test_systems_are_braxs_own_built_without_a_copy_per_leaf(monkeypatch, name, backend):
    # brax's mjcf loader copies every leaf of the system with `jnp.array`, a compiled program
    # each (41 for the pendulum): fastpop builds its envs without those copies. The system
    # must still be brax's own, leaf for leaf, dtype and weak type included.
    import jax
    from brax import envs as brax_registry
    from brax.io import mjcf

    copies_by_brax = []
    jnp_array = jax.numpy.array

    def counted(*args, **kwargs):
        frame = sys._getframe(1)  # called by brax's loader (through jax.tree.map)?
        while frame is not None and frame.f_code.co_filename != mjcf.__file__:
            frame = frame.f_back
        copies_by_brax.extend([1] if frame is not None else [])
        return jnp_array(*args, **kwargs)

    monkeypatch.setattr(jax.numpy, "array", counted)
    ours = brax_envs._make.__wrapped__(f"brax/{name}", backend)
    assert copies_by_brax == [] and mjcf.jp is jax.numpy  # brax's module as it was after
    theirs = brax_registry.get_environment(name, backend=backend)
    assert len(copies_by_brax) > 100  # (what the count would have caught)
    our_leaves, their_leaves = jax.tree.leaves(ours.sys), jax.tree.leaves(theirs.sys)
    for mine, brax_own in zip(our_leaves, their_leaves, strict=True):
        assert type(mine) is type(brax_own)  # (the env may set a leaf to a Python number)
        if isinstance(brax_own, jax.Array):
            assert mine.dtype == brax_own.dtype and mine.shape == brax_own.shape
            assert mine.weak_type == brax_own.weak_type
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(brax_own))
