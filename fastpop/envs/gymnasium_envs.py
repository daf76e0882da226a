"""Environment construction and the EnvSpec of a gymnasium environment's spaces.

One factory for every task fastpop trains on: gymnasium ids (MuJoCo v5, classic control, ...)
are made as registered; Atari games (ALE v5 ids, legacy ids like `PongNoFrameskip-v4`, or short
names like `Pong`) get the DQN preprocessing of Mnih et al. (2015) / Machado et al. (2018) and
frames stacked channel-last, (84, 84, 4) uint8, which the replay stores one frame per row
(atari_preprocessing.py).
Device ids (`brax/halfcheetah`, `gymnax/CartPole-v1`) are checked and specified here too, and
built by device_envs.py.
"""

from __future__ import annotations

import difflib
import functools
import importlib.util
import re

import gymnasium as gym
import numpy as np

from fastpop.envs import device_envs, mujoco_warnings
from fastpop.envs.atari_preprocessing import AtariOptions, make_atari_env
from fastpop.envs.errors import MissingExtra, UnknownEnvironment
from fastpop.types import EnvSpec

# ALE v5 games (ale-py 0.12), so that Atari ids are recognised (and suggested) even where
# ale-py is not installed; games of a newer ale-py are added from its registry.
_ATARI_GAMES = """
Adventure AirRaid Alien Amidar Assault Asterix Asteroids Atlantis Atlantis2 Backgammon BankHeist
BasicMath BattleZone BeamRider Berzerk Blackjack Bowling Boxing Breakout Carnival Casino Centipede
ChopperCommand CrazyClimber Crossbow Darkchambers Defender DemonAttack DonkeyKong DoubleDunk
Earthworld ElevatorAction Enduro Entombed Et FishingDerby FlagCapture Freeway Frogger Frostbite
Galaxian Gopher Gravitar Hangman HauntedHouse Hero HumanCannonball IceHockey Jamesbond
JourneyEscape Kaboom Kangaroo KeystoneKapers KingKong Klax Koolaid Krull KungFuMaster LaserGates
LostLuggage MarioBros MiniatureGolf MontezumaRevenge MrDo MsPacman NameThisGame Othello Pacman
Phoenix Pitfall Pitfall2 Pong Pooyan PrivateEye Qbert Riverraid RoadRunner Robotank Seaquest
SirLancelot Skiing Solaris SpaceInvaders SpaceWar StarGunner Superman Surround Tennis Tetris
TicTacToe3D TimePilot Trondead Turmoil Tutankham UpNDown Venture VideoCheckers VideoChess VideoCube
VideoPinball WizardOfWor WordZapper YarsRevenge Zaxxon
""".split()  # noqa: SIM905 (a list literal would take 104 lines)

# `Pong`, `pong`, `space_invaders`, `PongNoFrameskip-v4`, `ALE/Pong-v5`: the game's name is
# matched case-insensitively with underscores removed; any variant or version maps to v5.
_ATARI_ID = re.compile(
    r"^(?:ALE/)?(?P<game>[A-Za-z0-9_]+?)(?:NoFrameskip|Deterministic)?(?:-v\d+)?$"
)

# Entry-point module prefix -> (modules it needs, what to install). MuJoCo's envs import imageio
# too: .[brax] and .[playground] bring `mujoco` alone.
_EXTRAS = (
    ("gymnasium.envs.mujoco", ("mujoco", "imageio"), "fastpop[mujoco]"),
    ("gymnasium.envs.box2d", ("Box2D",), "gymnasium[box2d]"),
)
_ATARI_MODULES = ("ale_py", "cv2")


def _module_available(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


@functools.cache
def _atari_games() -> dict[str, str]:
    """Canonical ALE game names keyed by their lower-case, underscore-free form."""
    games = set(_ATARI_GAMES)
    try:
        import ale_py  # registers the ALE/* ids with gymnasium
    except ImportError:
        pass
    else:
        gym.register_envs(ale_py)
        games.update(
            key[4:-3]
            for key in gym.registry
            if key.startswith("ALE/") and key.endswith("-v5") and "-ram" not in key
        )
    return {game.lower(): game for game in games}


def _atari_game(env_id: str) -> str | None:
    match = _ATARI_ID.match(env_id)
    if match is None:
        return None
    return _atari_games().get(match["game"].replace("_", "").lower())


def _is_atari_entry_point(spec: gym.envs.registration.EnvSpec) -> bool:
    return isinstance(spec.entry_point, str) and spec.entry_point.startswith("ale_py")


def _suggestions(env_id: str) -> list[str]:
    candidates = [
        key
        for key, spec in gym.registry.items()
        if not key.startswith("ALE/") and not _is_atari_entry_point(spec)
    ]
    for game in _atari_games().values():
        candidates += [game, f"ALE/{game}-v5", f"{game}NoFrameskip-v4"]
    by_lower = {candidate.lower(): candidate for candidate in candidates}
    matches = difflib.get_close_matches(env_id.lower(), by_lower, n=3, cutoff=0.6)
    return [by_lower[match] for match in matches]


def _require(env_id: str, modules: tuple[str, ...], extra: str) -> None:
    for module in (m for m in modules if not _module_available(m)):
        raise MissingExtra(
            f"environment {env_id!r} needs the {module!r} package, which is not installed; "
            f"install {extra} (pip install '{extra}')"
        )


def check_env_id(env_id: str) -> str:
    """The normalized id of an environment fastpop can make, or a user-facing error.

    Registered gymnasium ids are returned as they are; Atari games in any spelling become
    their ALE v5 id (`Pong`, `PongNoFrameskip-v4` -> `ALE/Pong-v5`), made with fastpop's own
    frame skip and sticky-action settings (`AtariOptions`), not the variant's. Raises
    `UnknownEnvironment` with close registered ids, or `MissingExtra` naming what to install.
    Device ids (`brax/<name>`, `gymnax/<name>`, ...) are checked by their family
    (device_envs.py).
    """
    if device_envs.is_device_id(env_id):
        return device_envs.check_device_id(env_id)
    spec = gym.registry.get(env_id)
    if spec is not None and not _is_atari_entry_point(spec):
        for prefix, modules, extra in _EXTRAS:
            if isinstance(spec.entry_point, str) and spec.entry_point.startswith(prefix):
                _require(env_id, modules, extra)
        return env_id
    game = _atari_game(env_id)
    if game is None and spec is not None:
        raise UnknownEnvironment(
            f"fastpop makes Atari games from screen pixels only, not {env_id!r}; "
            f"did you mean {', '.join(_suggestions(env_id))}?"
        )
    if game is None:
        close = _suggestions(env_id)
        hint = (
            f"did you mean {', '.join(close)}?"
            if close
            else "it is neither a registered gymnasium id nor an Atari game (e.g. 'Pong', "
            "'ALE/Breakout-v5')"
        )
        raise UnknownEnvironment(f"unknown environment {env_id!r}; {hint}")
    normalized = f"ALE/{game}-v5"
    _require(normalized, _ATARI_MODULES, "fastpop[atari]")
    return normalized


def _to_float32(observation: np.ndarray) -> np.ndarray:
    return observation.astype(np.float32)


def make_env(
    env_id: str,
    seed: int,
    *,
    training: bool = True,
    atari: AtariOptions | None = None,
    render_mode: str | None = None,
) -> gym.Env:
    """One seeded environment (see `check_env_id` for the ids accepted).

    `terminated` and `truncated` stay apart: time limits are truncations, a training life-loss
    terminal is a termination. `info["episode"]` (return "r", length "l") arrives when a whole
    episode ends and always holds the raw game score, even where training rewards are clipped.
    `training` only matters for Atari (life-loss terminals and reward clipping, see
    `AtariOptions`; `atari` is ignored for other environments). float64 observations (MuJoCo)
    are cast to float32, the precision the networks compute in, halving replay memory.
    The environment is reset once with `seed`, so later unseeded resets are deterministic too.
    `render_mode` is gymnasium's (`"rgb_array"` for `fastpop eval --video`).
    """
    env_id = check_env_id(env_id)
    if device_envs.is_device_id(env_id):
        raise ValueError(f"{env_id} is stepped on the device: build it with make_device_env")
    if env_id.startswith("ALE/"):
        env = make_atari_env(env_id, training, atari or AtariOptions(), render_mode)
    else:
        if str(gym.spec(env_id).entry_point).startswith("gymnasium.envs.mujoco"):
            mujoco_warnings.hide_asset_deprecations()
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id, render_mode=render_mode))
        space = env.observation_space
        if isinstance(space, gym.spaces.Box) and space.dtype == np.float64:
            float32_space = gym.spaces.Box(
                space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32
            )
            env = gym.wrappers.TransformObservation(env, _to_float32, float32_space)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    env.observation_space.seed(seed)
    return env


def env_spec_from_spaces(observation_space: gym.Space, action_space: gym.Space) -> EnvSpec:
    """Shapes an agent needs, from one (non-vector) environment's spaces."""
    obs_shape = tuple(observation_space.shape)
    obs_dtype = np.dtype(observation_space.dtype)
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpec(obs_shape, obs_dtype, num_actions=int(action_space.n))
    if isinstance(action_space, gym.spaces.Box):
        low, high = np.unique(action_space.low), np.unique(action_space.high)
        if len(low) != 1 or len(high) != 1:
            raise ValueError(
                f"action bounds must be the same for every dimension, got low={action_space.low}"
                f" high={action_space.high}"
            )
        return EnvSpec(
            obs_shape,
            obs_dtype,
            action_dim=int(np.prod(action_space.shape)),
            action_low=float(low[0]),
            action_high=float(high[0]),
        )
    raise ValueError(f"unsupported action space {action_space}; use Box or Discrete")


def env_spec(env_id: str, atari: AtariOptions | None = None, backend: str | None = None) -> EnvSpec:
    """The EnvSpec of `make_env(env_id, ...)`, built from one throwaway environment; for a device
    id its DeviceEnv's (built once on `backend` and kept)."""
    if device_envs.is_device_id(env_id):
        return device_envs.device_env_spec(env_id, backend)
    env = make_env(env_id, seed=0, atari=atari)
    try:
        spec = env_spec_from_spaces(env.observation_space, env.action_space)
    finally:
        env.close()
    if check_env_id(env_id).startswith("ALE/"):
        spec = spec._replace(frame_stack=(atari or AtariOptions()).frame_stack)
    return spec


def make_vector_env(
    env_id: str,
    num_envs: int,
    seed: int,
    *,
    training: bool = True,
    atari: AtariOptions | None = None,
) -> gym.vector.VectorEnv:
    """Synchronous vector env with next-step autoreset (the replay's row convention).

    Environment i is seeded with `seed + i` (also what `reset(seed=seed)` on the vector env
    does), and the batched action space with `seed`, so a run is reproducible end to end.
    """
    env_id = check_env_id(env_id)
    envs = gym.vector.SyncVectorEnv(
        [
            functools.partial(make_env, env_id, seed + i, training=training, atari=atari)
            for i in range(num_envs)
        ],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    return envs
