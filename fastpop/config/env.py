"""The config's `env` section and the checks tying it to `collect.mode` and `algo`: which
environment, on which brax backend, and where its steps run (collector processes stepping
gymnasium environments on the CPU, or brax environments stepped on the device).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastpop.envs.brax_envs import BACKENDS, EPISODE_LENGTH, is_brax_id
from fastpop.schema import Reader, field

COLLECTION_MODES = ("processes", "device")


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    id: str = "Pendulum-v1"
    """gymnasium id (MuJoCo v5, classic control), Atari game (`ALE/Pong-v5`, `Pong`) or brax
    environment `brax/<name>`, any name in brax's registry (`brax/halfcheetah`, `brax/ant`,
    `brax/inverted_pendulum`, ...; pip install -e '.[brax]'), stepped on the device."""
    atari_terminal_on_life_loss: bool = False
    """Atari training only: a lost life is a terminal step (Mnih et al.; not Machado et al.)."""
    backend: str | None = field(None, choices=BACKENDS)
    """brax ids only: brax's physics pipeline. null: spring for every environment and platform
    (`brax_envs.default_backend`), the fastest measured, 2-5x positional and generalized on a
    CPU (ant, halfcheetah, inverted_pendulum; the table and command: README.md, Brax). spring
    is brax's least accurate pipeline; generalized is the closest to MuJoCo (mjx: slow on CPU)."""
    episode_length: int | None = field(None, min=1)
    """brax ids only: an episode is truncated (a time limit, not a terminal) after this many
    steps; null: 1000, brax's EpisodeWrapper default. gymnasium ids keep their own limit."""


def check_env(r: Reader, env: EnvConfig) -> EnvConfig:
    """The env section with its id normalized and a brax id's episode_length filled in; a
    brax-only field given for another environment is refused."""
    from fastpop import envs

    try:
        env_id = envs.check_env_id(env.id)
    except ValueError as error:  # UnknownEnvironment, MissingExtra: their messages say it all
        r.fail("env.id", str(error))
    if is_brax_id(env_id):
        length = EPISODE_LENGTH if env.episode_length is None else env.episode_length
        return dataclasses.replace(env, id=env_id, episode_length=length)
    problems = {
        "backend": "only brax environments (env.id: brax/<name>) have a physics backend",
        "episode_length": "only brax environments (env.id: brax/<name>) take a time limit "
        "here; gymnasium environments keep their registered one",
    }
    for name, problem in problems.items():
        if getattr(env, name) is not None:
            r.fail(
                f"env.{name}",
                f"{problem}, and {env_id} is not one: remove env.{name} (or set it to null), "
                f"or use a brax id such as brax/halfcheetah",
            )
    return dataclasses.replace(env, id=env_id)


def check_algo_fits_env(r: Reader, algo: str, env_id: str) -> None:
    """Refuse DQN on a brax env: checked before the hparams are read, since their keys are the
    algorithm's (a brax preset's actor_lr would otherwise be the first complaint)."""
    if is_brax_id(env_id) and algo == "dqn":
        r.fail(
            "algo",
            f"dqn needs discrete actions, and brax environments ({env_id}) have continuous "
            "ones: use td3 or sac",
        )


def collection_mode(config: Any) -> str:
    """`collect.mode` of a Config, null resolved: device for brax ids, else processes."""
    if config.collect.mode is not None:
        return config.collect.mode
    return "device" if is_brax_id(config.env.id) else "processes"


def check_collection(r: Reader, config: Any) -> None:
    """Refuse a collection mode the environment cannot run in."""
    env_id, mode = config.env.id, config.collect.mode
    if is_brax_id(env_id) and mode == "processes":
        r.fail(
            "collect.mode",
            f"processes steps gymnasium environments in collector processes, and {env_id} is "
            "a brax environment, stepped on the device: use collect.mode: device (or null)",
        )
    if not is_brax_id(env_id) and mode == "device":
        r.fail(
            "collect.mode",
            f"device steps brax environments (env.id: brax/<name>) on the device, and {env_id} "
            "is a gymnasium environment, stepped in collector processes: use collect.mode: "
            "processes (or null), or a brax id such as brax/halfcheetah",
        )
