"""`fastpop eval --video`: one episode of a member's policy rendered to an mp4.

Frames come from gymnasium's `rgb_array` rendering (MuJoCo offscreen through EGL or OSMesa, so it
works without a display); imageio-ffmpeg encodes them. The episode uses the reset seed and action
keys of `collect.evaluator.evaluate_population`, so it is the evaluation's first episode (to float
rounding where the run's evaluator acted in numpy).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

VIDEO_SUFFIX = ".mp4"
VIDEO_INSTALL = 'pip install -e ".[video]"'
VIDEO_MODULES = ("imageio", "imageio_ffmpeg")  # imageio-ffmpeg brings the ffmpeg binary
# MuJoCo's default 4096^2 shadow map dominates software (llvmpipe) rendering: 1024 renders a
# 480x480 HalfCheetah frame about 2-3x faster and looks the same at video resolution.
MUJOCO_SHADOW_SIZE = 1024
ATARI_FRAMES_PER_SECOND = 60  # the emulator's (NTSC) rate; one agent step is frame_skip frames


class VideoError(ValueError):
    """Bad --video input, or an environment that cannot render; the message says what."""


def check_video_path(path: Path) -> None:
    if path.suffix.lower() != VIDEO_SUFFIX:
        raise VideoError(f"--video {path}: the video is written as mp4; name it *{VIDEO_SUFFIX}")
    if path.is_dir():
        raise VideoError(f"--video {path}: is a directory; name a file, e.g. {path}/episode.mp4")
    if not path.parent.is_dir():
        raise VideoError(f"--video {path}: directory {path.parent} does not exist; create it first")


def check_video_dependencies() -> None:
    missing = [m for m in VIDEO_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise VideoError(
            f"--video needs imageio and imageio-ffmpeg ({', '.join(missing)} not installed): "
            f"{VIDEO_INSTALL}"
        )


def choose_mujoco_gl() -> str | None:
    """MUJOCO_GL for offscreen rendering without a display, unless the user has set it: EGL
    (a GPU's, or Mesa's software llvmpipe) where libEGL is found, else OSMesa."""
    import ctypes.util

    if os.environ.get("MUJOCO_GL"):
        return os.environ["MUJOCO_GL"]
    for backend, library in (("egl", "EGL"), ("osmesa", "OSMesa")):
        if ctypes.util.find_library(library):
            os.environ["MUJOCO_GL"] = backend
            return backend
    return None


def make_video_env(config, seed: int):
    """The env the video is rendered from, checked to render before anything is evaluated."""
    from fastpop import config as config_lib
    from fastpop.envs import make_env

    env_id = config.env.id
    env = make_env(
        env_id,
        seed,
        training=False,
        atari=config_lib.atari_options(config),
        render_mode="rgb_array",
    )
    try:
        if env.render_mode != "rgb_array":
            raise VideoError(f"--video: {env_id} does not render rgb_array frames")
        quality = getattr(
            getattr(getattr(env.unwrapped, "model", None), "vis", None), "quality", None
        )
        if quality is not None:  # MuJoCo; read when the first render makes the GL context
            quality.shadowsize = min(quality.shadowsize, MUJOCO_SHADOW_SIZE)
        try:
            frame = env.render()
        except Exception as error:  # pygame missing (classic control), no OpenGL, ...
            hint = ""
            if quality is not None:
                hint = (
                    f" (MUJOCO_GL={os.environ.get('MUJOCO_GL')}; MuJoCo renders offscreen with "
                    "MUJOCO_GL=egl (libEGL) or osmesa (libOSMesa))"
                )
            raise VideoError(f"--video: {env_id} cannot render: {error}{hint}") from None
        if getattr(frame, "ndim", 0) != 3:
            raise VideoError(f"--video: {env_id} renders no RGB frames (got {type(frame)})")
    except BaseException:
        env.close()
        raise
    return env


def video_fps(config, env) -> float:
    """Real time: one frame per agent step."""
    from fastpop import config as config_lib

    atari = config_lib.atari_options(config)
    if atari is not None:  # ALE's metadata gives the emulator's rate, not the agent's
        return ATARI_FRAMES_PER_SECOND / atari.frame_skip
    return float(env.metadata.get("render_fps") or 30)


def record_episode(agent, policy, hparams, env, seed: int, path: Path, fps: float):
    """Write one episode as an mp4: (frames, return). The same reset seed and action keys as
    `evaluate_population`, so it is the evaluation's first episode."""
    import warnings

    import imageio.v2 as imageio
    import jax
    import numpy as np

    from fastpop import population

    step = jax.jit(population.policy_step(agent, 1, 1, explore=False))  # as the evaluator's
    no_steps = np.zeros(1, np.int32)
    key = jax.random.key(seed)
    obs, _ = env.reset(seed=seed)
    episode_return, frames = 0.0, 0
    with warnings.catch_warnings():
        # JAX warns on any fork; the ffmpeg subprocess execs at once and never touches JAX.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        # macro_block_size 2: yuv420p needs even sizes; 16 would rescale e.g. Atari's 210x160.
        writer = imageio.get_writer(path, format="FFMPEG", fps=fps, macro_block_size=2)
        try:
            writer.append_data(env.render())
            frames += 1
            done = False
            while not done:
                action, key = step(policy, obs[None, None], key, hparams, no_steps)
                obs, reward, terminated, truncated, _ = env.step(np.asarray(action)[0, 0])
                episode_return += float(reward)
                writer.append_data(env.render())
                frames += 1
                done = terminated or truncated
            writer.close()
        except BaseException:
            writer.close()
            path.unlink(missing_ok=True)  # no half-written video left behind
            raise
    return frames, episode_return
