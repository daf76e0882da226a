"""`fastpop eval`: a member from the newest usable checkpoint, evaluated as the periodic
evaluation does; bad input exits 2 with a message; --video records the first episode."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.collect.evaluator import evaluate_population
from fastpop.commands import evaluate
from fastpop.commands import video as fastpop_video
from fastpop.learn.learner import Learner
from fastpop.run import checkpoint
from fastpop.run.parts import build_learner

# Its module fixture is expensive: one worker runs it once for every test here.
pytestmark = pytest.mark.xdist_group("eval")

TINY = [
    "agent.hidden_sizes=[8,8]",
    "agent.batch_size=4",
    "replay.capacity=256",
    "replay.min_size=4",
    "population.size=2",
    "eval.episodes=1",
]


def tiny_learner(*overrides) -> Learner:
    config = config_lib.load_config(None, [*TINY, *overrides])
    learner = build_learner(config)
    learner.config = config  # what the tests read the learner's settings from
    return learner


def save_run(run_dir, learner, steps=(100,), latest_returns=(-1000.0, -200.0)) -> None:
    """A run directory with one checkpoint of `learner` per entry of `steps`."""
    for step in steps:
        checkpoint.save(
            run_dir / "checkpoints",
            step,
            {"learner": learner.saved_tree(True), "pending": []},
            {
                "config": config_lib.config_to_dict(learner.config),
                "run": {"latest_returns": list(latest_returns), "member_env_steps": step},
            },
        )


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="fastpop")
    evaluate.add_parser(root.add_subparsers(dest="command", required=True))
    return root


def fastpop_eval(*argv) -> int:
    return evaluate.run(parser().parse_args(["eval", *map(str, argv)]))


def reported_return(stdout: str) -> str:
    return re.search(r"return (\S+) \+- \S+ over", stdout).group(1)


@pytest.fixture(scope="module")
def pendulum_learner():
    return tiny_learner()


@pytest.fixture(scope="module")
def pendulum_run(tmp_path_factory, pendulum_learner):
    run_dir = tmp_path_factory.mktemp("run")
    save_run(run_dir, pendulum_learner)
    return run_dir, pendulum_learner


def files_of(directory):
    return {(p, p.stat().st_mtime_ns, p.stat().st_size) for p in directory.rglob("*")}


def test_best_member_is_the_highest_latest_return_and_nothing_is_written(pendulum_run, capsys):
    run_dir, _ = pendulum_run
    before = files_of(run_dir)
    assert fastpop_eval(run_dir) == 0
    out = capsys.readouterr().out
    assert "member 1 (best: return -200.0" in out
    assert re.search(r"member 1 \(checkpoint 000000000100, 100 env steps/member\): return", out)
    assert "over 1 episode" in out
    assert "actor_lr=" in out  # the member's hparams
    assert files_of(run_dir) == before


def test_member_return_equals_evaluating_the_trained_policy(pendulum_run, capsys):
    run_dir, learner = pendulum_run
    assert fastpop_eval(run_dir, "--member", 0, "--seed", 3, "--episodes", 2) == 0
    reported = reported_return(capsys.readouterr().out)
    policy = population.member_policies(learner.agent, learner.states)
    first = lambda tree: jax.tree.map(lambda leaf: leaf[:1], tree)
    mean, _ = evaluate_population(
        learner.agent, first(policy), first(learner.hparams), "Pendulum-v1", 2, 3
    )
    assert np.isfinite(mean[0])
    assert reported == f"{mean[0]:.1f}"
    loaded = evaluate.load_latest(run_dir, warn=pytest.fail)
    restored = evaluate.evaluate_member(
        loaded.agent,
        evaluate.one_member(loaded.policy, 0),
        evaluate.one_member(loaded.hparams, 0),
        loaded.config,
        2,
        3,
    )
    assert restored[0] == pytest.approx(float(mean[0]), abs=0)


def test_shared_critic_members_are_its_actors_and_cemrl_best_is_the_mean(tmp_path, capsys):
    learner = tiny_learner("strategy=cemrl", "population.size=3", "replay.shared=true")
    save_run(tmp_path, learner, latest_returns=(-300.0, -100.0, -200.0))
    assert fastpop_eval(tmp_path, "--seed", 1) == 0
    out = capsys.readouterr().out
    assert "member 0 (best: cemrl's CEM mean)" in out
    first = lambda tree: jax.tree.map(lambda leaf: leaf[:1], tree)
    policy = learner.training.policies(learner.states)
    mean, _ = evaluate_population(
        learner.agent, first(policy), first(learner.hparams), "Pendulum-v1", 1, 1
    )
    assert reported_return(out) == f"{mean[0]:.1f}"


def test_bad_input_exits_2_with_a_message(pendulum_run, tmp_path, capsys):
    run_dir, _ = pendulum_run
    assert fastpop_eval(run_dir, "--member", 5) == 2
    assert "--member 5: the run's population has 2 members (0..1)" in capsys.readouterr().err
    assert fastpop_eval(run_dir, "--member", "first") == 2
    assert "--member 'first': expected best or a member index" in capsys.readouterr().err
    assert fastpop_eval(tmp_path / "nowhere") == 2
    assert f"run directory {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty" / "checkpoints").mkdir(parents=True)
    assert fastpop_eval(tmp_path / "empty") == 2
    assert "has no checkpoint" in capsys.readouterr().err
    assert fastpop_eval(run_dir, "--video", tmp_path / "missing" / "out.mp4") == 2
    err = capsys.readouterr().err
    assert f"directory {tmp_path / 'missing'} does not exist" in err
    assert fastpop_eval(run_dir, "--video", tmp_path / "out.gif") == 2
    assert "name it *.mp4" in capsys.readouterr().err


def test_best_without_an_evaluation_asks_for_a_member(pendulum_learner, tmp_path, capsys):
    save_run(tmp_path, pendulum_learner, latest_returns=(None, float("nan")))
    assert fastpop_eval(tmp_path) == 2
    err = capsys.readouterr().err
    assert "no evaluation was recorded before the checkpoint" in err
    assert "pass --member N (0..1)" in err


def test_corrupted_newest_checkpoint_falls_back_with_a_warning(pendulum_learner, tmp_path, capsys):
    save_run(tmp_path, pendulum_learner, steps=(100, 200))
    newest = tmp_path / "checkpoints" / "000000000200" / "arrays.npz"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    assert fastpop_eval(tmp_path, "--member", 0) == 0
    captured = capsys.readouterr()
    assert "warning: skipping checkpoint" in captured.err
    assert "000000000200" in captured.err and "checksum mismatch" in captured.err
    assert "checkpoint 000000000100" in captured.out
    oldest = tmp_path / "checkpoints" / "000000000100" / "arrays.npz"
    oldest.write_bytes(oldest.read_bytes()[:-10])
    assert fastpop_eval(tmp_path, "--member", 0) == 2
    assert "no usable checkpoint in" in capsys.readouterr().err


@pytest.mark.skipif(
    importlib.util.find_spec("pygame") is not None, reason="pygame renders Pendulum here"
)
def test_video_of_an_env_that_cannot_render_exits_2(pendulum_run, tmp_path, capsys):
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        pytest.skip('the video extra is not installed: pip install -e ".[video]"')
    run_dir, _ = pendulum_run
    assert fastpop_eval(run_dir, "--video", tmp_path / "out.mp4") == 2
    err = capsys.readouterr().err
    assert "--video: Pendulum-v1 cannot render" in err and "pygame" in err
    assert not (tmp_path / "out.mp4").exists()


def test_video_without_its_dependencies_names_the_extra(
    pendulum_run, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(fastpop_video, "VIDEO_MODULES", ("imageio", "no_such_module_for_fastpop"))
    assert fastpop_eval(pendulum_run[0], "--video", tmp_path / "out.mp4") == 2
    err = capsys.readouterr().err
    assert "no_such_module_for_fastpop not installed" in err
    assert 'pip install -e ".[video]"' in err


def test_mujoco_gl_is_the_users_or_a_headless_backend_found_here(monkeypatch):
    import ctypes.util

    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    assert fastpop_video.choose_mujoco_gl() == "osmesa"
    monkeypatch.delenv("MUJOCO_GL")
    expected = (
        "egl"
        if ctypes.util.find_library("EGL")
        else "osmesa"
        if ctypes.util.find_library("OSMesa")
        else None
    )
    assert fastpop_video.choose_mujoco_gl() == expected
    assert os.environ.get("MUJOCO_GL") == expected


def mujoco_renders() -> bool:
    from fastpop.envs import make_env

    try:
        env = make_env("Hopper-v5", 0, training=False, render_mode="rgb_array")
    except ValueError:  # MuJoCo not installed
        return False
    try:
        return env.render().ndim == 3
    except Exception:
        return False
    finally:
        env.close()


# Counting the frames runs ffmpeg in a subprocess, which JAX warns about (it execs at once).
@pytest.mark.filterwarnings(r"ignore:os\.fork\(\) was called:RuntimeWarning")
def test_video_records_the_evaluated_first_episode(tmp_path, capsys, monkeypatch):
    if importlib.util.find_spec("imageio_ffmpeg") is None:
        pytest.skip('the video extra is not installed: pip install -e ".[video]"')
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", ""))  # restored afterwards
    fastpop_video.choose_mujoco_gl()
    if not mujoco_renders():
        pytest.skip(f"MuJoCo cannot render offscreen here (MUJOCO_GL={os.environ['MUJOCO_GL']})")
    # Hopper, not HalfCheetah: an untrained Hopper falls within a few dozen steps, so the
    # episode (1000 steps for HalfCheetah, ~15 ms a frame with CPU rendering) stays short.
    save_run(tmp_path, tiny_learner("env.id=Hopper-v5"))
    video = tmp_path / "episode.mp4"
    assert fastpop_eval(tmp_path, "--member", 0, "--video", video) == 0
    out = capsys.readouterr().out
    frames, recorded = re.search(r"(\d+) frames, the first episode \(return (\S+)\)", out).groups()
    assert recorded == reported_return(out)  # one episode: the evaluation's is the video's
    import imageio.v2 as imageio

    assert video.stat().st_size > 0
    with imageio.get_reader(video) as reader:
        assert reader.count_frames() == int(frames) > 1
