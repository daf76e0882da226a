"""The config's `env` section and the checks tying it to `collect.mode` and `algo`: which
environment, on which brax backend, and where its steps run (collector processes stepping
gymnasium environments on the CPU, or brax, gymnax and Playground environments stepped on the
device).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fastpop.agents import registry
from fastpop.envs import device_envs
from fastpop.schema import Reader, field

COLLECTION_MODES = ("processes", "device")


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    id: str = "Pendulum-v1"
    """gymnasium id (MuJoCo v5, classic control), Atari game (`ALE/Pong-v5`, `Pong`), stepped in
    collector processes; or, stepped on the device, a brax environment `brax/<name>`, any name in
    brax's registry (`brax/halfcheetah`, `brax/inverted_pendulum`, ...; pip install -e
    '.[brax]'), a gymnax one `gymnax/<name>` (`gymnax/CartPole-v1`, `gymnax/Pendulum-v1`,
    `gymnax/Breakout-MinAtar`, ...; pip install -e '.[gymnax]') or a MuJoCo Playground one,
    its DeepMind Control Suite `playground/<Name>` (`playground/CartpoleBalance`,
    `playground/CheetahRun`, ...; pip install -e '.[playground]')."""
    atari_terminal_on_life_loss: bool = False
    """Atari training only: a lost life is a terminal step (Mnih et al.; not Machado et al.)."""
    backend: str | None = field(None, choices=device_envs.BACKENDS)  # live: follows `register`
    """brax ids only: brax's physics pipeline. null: generalized, brax's own default and the
    closest to MuJoCo, for every environment and platform (`brax_envs.default_backend`). spring
    is the choice for speed, 2-5x positional and generalized on a CPU (ant, halfcheetah,
    inverted_pendulum; the table and command: docs/device-mode-and-env-families.md, brax), but
    brax's least accurate pipeline (mjx: slow on a CPU)."""
    episode_length: int | None = field(None, min=1)
    """Device ids only (brax/, gymnax/, playground/): an episode is truncated (a time limit, not
    a terminal) after this many steps; null: the family's own, 1000 for brax (its EpisodeWrapper
    default) and Playground, the registered limit for gymnax (CartPole-v1 500, Pendulum-v1 200,
    MinAtar 1000, ...).
    gymnasium ids keep their registered limit."""


def check_env(r: Reader, env: EnvConfig) -> EnvConfig:
    """The env section with its id normalized and a device id's episode_length filled in; a
    field given for an environment it does not apply to is refused."""
    from fastpop import envs

    try:
        env_id = envs.check_env_id(env.id)
    except ValueError as error:  # UnknownEnvironment, MissingExtra: their messages say it all
        r.fail("env.id", str(error))
    problems = {}
    if not device_envs.takes_backend(env_id):
        names = device_envs.backend_family_names()
        forms = device_envs.id_forms(with_backends=True)
        problems["backend"] = f"only {names} environments (env.id: {forms}) have a physics backend"
    if device_envs.is_device_id(env_id):
        length = env.episode_length
        if length is None:
            length = device_envs.default_episode_length(env_id)
        env = dataclasses.replace(env, episode_length=length)
    else:
        problems["episode_length"] = (
            f"only environments stepped on the device (env.id: {device_envs.id_forms()}) take a "
            "time limit here; gymnasium environments keep their registered one"
        )
    for name, problem in problems.items():
        if getattr(env, name) is not None:
            r.fail(
                f"env.{name}",
                f"{problem}, and {env_id} is not one: remove env.{name} (or set it to null)",
            )
    return dataclasses.replace(env, id=env_id)


def check_algo_fits_env(r: Reader, algo: str, env_id: str) -> None:
    """Refuse an algorithm the device env's actions do not fit: checked before the hparams are
    read, since their keys are the algorithm's (a brax preset's actor_lr would otherwise be the
    first complaint). gymnasium ids are checked when the agent is built."""
    if not device_envs.is_device_id(env_id):
        return
    kind = "discrete" if device_envs.discrete_actions(env_id) else "continuous"
    needs = registry.get(algo).actions
    if needs != kind:
        fits = " or ".join(registry.names_with(actions=kind)) or "none is registered"
        r.fail("algo", f"{algo} needs {needs} actions, and {env_id} has {kind} ones: use {fits}")


def collection_mode(config: Any) -> str:
    """`collect.mode` of a Config, null resolved: device for device ids, else processes."""
    if config.collect.mode is not None:
        return config.collect.mode
    return "device" if device_envs.is_device_id(config.env.id) else "processes"


def check_collection(r: Reader, config: Any) -> None:
    """Refuse a collection mode the environment cannot run in."""
    env_id, mode = config.env.id, config.collect.mode
    on_device = device_envs.is_device_id(env_id)
    if on_device and mode == "processes":
        r.fail(
            "collect.mode",
            f"processes steps gymnasium environments in collector processes, and {env_id} is "
            "stepped on the device: use collect.mode: device (or null)",
        )
    if not on_device and mode == "device":
        r.fail(
            "collect.mode",
            f"device steps JAX environments (env.id: {device_envs.id_forms()}) on the device, "
            f"and {env_id} is a gymnasium environment, stepped in collector "
            "processes: use collect.mode: processes (or null), or a device id such as "
            "brax/halfcheetah or gymnax/CartPole-v1",
        )
