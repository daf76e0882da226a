"""MuJoCo Playground environments by id: `playground/<Name>` for its DeepMind Control Suite
(`playground/CartpoleBalance`, `playground/CheetahRun`, `playground/WalkerWalk`, ...), stepped
on the device through the DeviceEnv protocol (device_envs.py).

The Control Suite's models ship with the package. Playground's locomotion and manipulation
envs load robot models from mujoco_menagerie, which playground clones from GitHub on first use:
a machine without network (or a run that should not download) cannot, so those ids are refused
saying so, and so are they where the models are present (their observations are dicts of state
and privileged state, which fastpop's agents do not take).

Physics runs on MJX's JAX pipeline (`impl: jax`), which jit, vmap and scan like any JAX code on
every platform; playground's default, MuJoCo Warp, stepped ~100x slower under vmap on this CPU.
A Control Suite env's `done` is a termination only (NaN physics); its time limit (1000 steps)
is the rollout's `episode_length`, as for every device env.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np

from fastpop.envs.errors import UnknownEnvironment, close_names, missing_extra
from fastpop.envs.mjx_import import import_mjx
from fastpop.types import DeviceEnv, EnvSpec

PREFIX = "playground/"
EXTRA, PACKAGE = "playground", "mujoco_playground"
# Whose versions key stored programs (device_envs.family_libraries): the Control Suite's code and
# MJX's pipeline it steps on.
LIBRARIES = ("playground", "mujoco", "mujoco-mjx")
BACKENDS = ()  # MJX's JAX pipeline always: `backend` is refused (device_envs.resolve_backend)
INSTALL = f"pip install -e '.[{EXTRA}]'"
PROBE_ID = "playground/CartpoleBalance"  # what `fastpop doctor` builds to check the family
EPISODE_LENGTH = 1000  # every Control Suite env's default config
# playground 0.2.0's registry, so that ids are recognised and suggested without importing it
# (the import takes seconds); tests/test_playground.py checks them against the package.
CONTROL_SUITE = (
    "AcrobotSwingup",
    "AcrobotSwingupSparse",
    "BallInCup",
    "CartpoleBalance",
    "CartpoleBalanceSparse",
    "CartpoleSwingup",
    "CartpoleSwingupSparse",
    "CheetahRun",
    "FingerSpin",
    "FingerTurnEasy",
    "FingerTurnHard",
    "FishSwim",
    "HopperHop",
    "HopperStand",
    "HumanoidStand",
    "HumanoidWalk",
    "HumanoidRun",
    "PendulumSwingup",
    "PointMass",
    "ReacherEasy",
    "ReacherHard",
    "SwimmerSwimmer6",
    "WalkerRun",
    "WalkerStand",
    "WalkerWalk",
)
NEEDS_MENAGERIE = (
    "ApolloJoystickFlatTerrain",
    "BarkourJoystick",
    "BerkeleyHumanoidJoystickFlatTerrain",
    "BerkeleyHumanoidJoystickRoughTerrain",
    "G1JoystickFlatTerrain",
    "G1JoystickRoughTerrain",
    "Go1JoystickFlatTerrain",
    "Go1JoystickRoughTerrain",
    "Go1Getup",
    "Go1Handstand",
    "Go1Footstand",
    "H1InplaceGaitTracking",
    "H1JoystickGaitTracking",
    "Op3Joystick",
    "SpotFlatTerrainJoystick",
    "SpotGetup",
    "SpotJoystickGaitTracking",
    "T1JoystickFlatTerrain",
    "T1JoystickRoughTerrain",
    "AlohaHandOver",
    "AlohaSinglePegInsertion",
    "PandaPickCube",
    "PandaPickCubeOrientation",
    "PandaPickCubeCartesian",
    "PandaOpenCabinet",
    "PandaRobotiqPushCube",
    "LeapCubeReorient",
    "LeapCubeRotateZAxis",
    "AeroCubeRotateZAxis",
)


def playground_installed() -> bool:
    return importlib.util.find_spec("mujoco_playground") is not None


def menagerie_path() -> Path | None:
    """Where playground looks for mujoco_menagerie's robot models (None: not installed)."""
    spec = importlib.util.find_spec("mujoco_playground")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "external_deps" / "mujoco_menagerie"


def check_id(env_id: str) -> str:
    """The id as registered; UnknownEnvironment (close names, or why a known name is not
    trained here) or MissingExtra."""
    name = env_id[len(PREFIX) :]
    by_key = {known.lower(): known for known in (*CONTROL_SUITE, *NEEDS_MENAGERIE)}
    if name.lower() not in by_key:
        hint = close_names(name.lower(), by_key, PREFIX)
        raise UnknownEnvironment(
            f"{env_id}: unknown MuJoCo Playground environment; {hint}fastpop trains its DeepMind "
            f"Control Suite: {', '.join(PREFIX + known for known in CONTROL_SUITE)}"
        )
    name = by_key[name.lower()]
    if name in NEEDS_MENAGERIE:
        raise UnknownEnvironment(_refusal(PREFIX + name))
    if not playground_installed():
        raise missing_extra(env_id, "playground", INSTALL)
    return PREFIX + name


def _refusal(env_id: str) -> str:
    path = menagerie_path()
    if path is None or not path.exists():
        where = f" ({path})" if path is not None else ""
        return (
            f"{env_id} needs robot models from mujoco_menagerie, which playground clones from "
            f"GitHub on first use and this machine does not have{where}; fastpop does not "
            "download during a run. Use a DeepMind Control Suite env, whose models ship with "
            "the package (playground/CartpoleBalance, playground/CheetahRun, ...)"
        )
    return (
        f"{env_id}: its observations are a dict (state, privileged state), which fastpop's "
        "agents do not take yet; use a DeepMind Control Suite env (playground/CartpoleBalance, "
        "playground/CheetahRun, ...)"
    )


def discrete_actions(env_id: str) -> bool:
    del env_id
    return False  # every Control Suite env has continuous actions in [-1, 1]


def default_episode_length(env_id: str) -> int:
    del env_id
    return EPISODE_LENGTH


def counterpart(env_id: str) -> str | None:
    del env_id
    return None  # gymnasium has no Control Suite


@functools.cache
def make(env_id: str, backend: str | None = None) -> DeviceEnv:
    """`env_id`'s DeviceEnv (checked, canonical), on MJX's JAX pipeline."""
    import_mjx()  # before Playground imports it: without Warp, which `impl: jax` never runs
    from mujoco_playground import registry

    del backend  # BACKENDS is (): config.env.backend is refused for this family
    env = registry.load(env_id[len(PREFIX) :], config_overrides={"impl": "jax"})
    spec = EnvSpec((int(env.observation_size),), np.dtype(np.float32), action_dim=env.action_size)
    return DeviceEnv(env.reset, env.step, spec, EPISODE_LENGTH)
