"""MuJoCo Playground environments by id: `playground/<Name>` for its DeepMind Control Suite
(`playground/CartpoleBalance`, `playground/CheetahRun`, `playground/WalkerWalk`, ...) and its
humanoid joystick tasks (`playground/G1JoystickFlatTerrain`, `playground/T1JoystickFlatTerrain`,
their RoughTerrain forms: FastTD3's published Playground curves), stepped on the device through
the DeviceEnv protocol (device_envs.py).

The Control Suite's models ship with the package. Playground's locomotion and manipulation
envs load robot models from mujoco_menagerie, which playground clones from GitHub on first use.
fastpop never downloads during a run: a humanoid joystick task trains where its robot's models
are already in playground's menagerie folder (`menagerie_path()`), and is refused saying how
to get them where they are not; the other robot tasks are refused.

A humanoid joystick task observes a dict: `state` (what its policy may see) and
`privileged_state` (the simulator's). As FastTD3 trains it, the actor sees the state and the
critics the privileged state (an asymmetric actor-critic): the observation fastpop stores is
the two concatenated, [state | privileged_state], and its EnvSpec's `policy_obs_size` is the
state's size. As FastTD3's defaults have them, its pushes are off (`push_config.enable`) and no
domain randomization is applied.

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
EPISODE_LENGTH = 1000  # the default config of every Control Suite env and humanoid joystick task
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
# The humanoid joystick tasks fastpop trains (an asymmetric actor-critic: the actor on their
# dict's `state`, the critics on its `privileged_state`), by their robot's menagerie folder.
HUMANOID_JOYSTICKS = {
    "G1JoystickFlatTerrain": "unitree_g1",
    "G1JoystickRoughTerrain": "unitree_g1",
    "T1JoystickFlatTerrain": "booster_t1",
    "T1JoystickRoughTerrain": "booster_t1",
}
# a dict observation's entries: what the actor sees, then what the critics see
POLICY_OBSERVATION, PRIVILEGED_OBSERVATION = "state", "privileged_state"
# playground's own download, for a user who wants the models fetched (fastpop never does)
MENAGERIE_DOWNLOAD = (
    'python -c "from mujoco_playground._src import mjx_env; mjx_env.ensure_menagerie_exists()"'
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
            f"Control Suite: {', '.join(PREFIX + known for known in CONTROL_SUITE)}; and its "
            f"humanoid joystick tasks: {', '.join(PREFIX + known for known in HUMANOID_JOYSTICKS)}"
        )
    name = by_key[name.lower()]
    if name in NEEDS_MENAGERIE and name not in HUMANOID_JOYSTICKS:
        raise UnknownEnvironment(
            f"{PREFIX + name}: fastpop trains Playground's DeepMind Control Suite and its "
            f"humanoid joystick tasks ({', '.join(PREFIX + known for known in HUMANOID_JOYSTICKS)})"
            ", not its other robot tasks; use one of those"
        )
    if not playground_installed():
        raise missing_extra(env_id, "playground", INSTALL)
    if name in HUMANOID_JOYSTICKS and (problem := _missing_models(name)) is not None:
        raise UnknownEnvironment(problem)
    return PREFIX + name


def _missing_models(name: str) -> str | None:
    """Why `name`'s robot models cannot be loaded here (None: they are in place)."""
    path = menagerie_path()
    robot = HUMANOID_JOYSTICKS[name]
    if path is not None and (path / robot / "assets").is_dir():
        return None
    return (
        f"{PREFIX + name} needs the robot models of mujoco_menagerie's {robot}/, which this "
        f"machine does not have ({path / robot if path else 'mujoco_menagerie'}); fastpop does "
        f"not download during a run. Fetch them once with playground's own download "
        f"({MENAGERIE_DOWNLOAD}), or put a copy of {robot}/ there; or use a DeepMind Control "
        "Suite env, whose models ship with the package (playground/CartpoleBalance, ...)"
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
    name = env_id[len(PREFIX) :]
    config = registry.get_default_config(name)
    if name in HUMANOID_JOYSTICKS:  # FastTD3's defaults: no pushes
        config.push_config.enable = False
        config.push_config.magnitude_range = [0.0, 0.0]
    env = registry.load(name, config=config, config_overrides={"impl": "jax"})
    size, policy_size = env.observation_size, 0
    if isinstance(size, dict):
        policy_size = _flat_size(size[POLICY_OBSERVATION])
        size = policy_size + _flat_size(size[PRIVILEGED_OBSERVATION])
    shape = (_flat_size(size),)
    spec = EnvSpec(
        shape, np.dtype(np.float32), action_dim=env.action_size, policy_obs_size=policy_size
    )
    reset, step = observation_view(env.reset, env.step)
    return DeviceEnv(reset, step, spec, int(config.episode_length))


def _flat_size(size) -> int:
    return int(np.prod(size)) if isinstance(size, tuple) else int(size)


def observation_view(reset, step):
    """`reset` and `step` whose states observe a dict observation as one vector, its policy's
    entry then its privileged one (unchanged where the observation is an array). Playground's
    steps never read the observation of the state they are given: each makes its own."""
    import jax.numpy as jnp

    def view(state):
        if isinstance(state.obs, dict):
            parts = (state.obs[POLICY_OBSERVATION], state.obs[PRIVILEGED_OBSERVATION])
            return state.replace(obs=jnp.concatenate([jnp.ravel(part) for part in parts]))
        return state

    return (lambda key: view(reset(key))), (lambda state, action: view(step(state, action)))
