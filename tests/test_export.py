"""`fastpop export`: a member's policy as plain arrays plus a `jax.export` function that a fresh
process holding only jax and numpy calls to get the actions fastpop's own deterministic policy
takes; bad input exits 2 and leaves no partial output."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop.commands import cli, evaluate, export
from fastpop.run import checkpoint
from fastpop.run.parts import build_learner

# Its module fixture is expensive: one worker runs it once for every test here.
pytestmark = pytest.mark.xdist_group("export")

TINY = [
    "agent.hidden_sizes=[8,8]",
    "agent.batch_size=4",
    "replay.capacity=256",
    "replay.min_size=4",
    "population.size=3",
    "eval.episodes=1",
]
CASES = {
    "td3": ["algo=td3", "env.id=Pendulum-v1"],
    "sac": ["algo=sac", "env.id=Pendulum-v1"],
    "dqn": ["algo=dqn", "env.id=CartPole-v1"],
    # the member's observation statistics among the weights, applied inside the function
    "td3_observation_norm": ["algo=td3", "env.id=Pendulum-v1", "agent.observation_norm=true"],
    "dqn_dueling": ["algo=dqn", "env.id=CartPole-v1", "agent.dueling=true"],
    "td3_distributional": [
        "algo=td3",
        "env.id=Pendulum-v1",
        "agent.critic=distributional",
        "agent.layer_norm=true",
    ],
}
if importlib.util.find_spec("ale_py") is not None:  # uint8 frames, a frame stack, Nature CNN
    CASES["dqn_atari"] = ["algo=dqn", "env.id=ALE/Pong-v5", "collect.chunk_len=8"]


def save_run(run_dir: Path, *overrides: str, latest_returns=(-5.0, -1.0, -3.0)) -> Path:
    """A run directory holding one checkpoint of a freshly initialised population."""
    config = config_lib.load_config(None, [*TINY, *overrides])
    learner = build_learner(config)
    checkpoint.save(
        run_dir / "checkpoints",
        100,
        {"learner": learner.saved_tree(True), "pending": []},
        {
            "config": config_lib.config_to_dict(config),
            "run": {"latest_returns": list(latest_returns), "member_env_steps": 100},
        },
    )
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {name: save_run(tmp_path_factory.mktemp(name), *case) for name, case in CASES.items()}


def fastpop_export(*argv) -> int:
    return cli.main(["export", *map(str, argv)])


def observations(obs_shape, dtype, count: int = 64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if np.dtype(dtype) == np.uint8:
        return rng.integers(0, 256, (count, *obs_shape), dtype=np.uint8)
    return (3.0 * rng.standard_normal((count, *obs_shape))).astype(dtype)


def fastpop_actions(run_dir: Path, member: int, obs: np.ndarray) -> np.ndarray:
    """What fastpop's own policy does: agent.act(..., explore=False) of the loaded member."""
    loaded = evaluate.load_latest(run_dir, print)
    policy = jax.tree.map(lambda leaf: leaf[member], loaded.policy)
    hparams = jax.tree.map(lambda leaf: leaf[member], loaded.hparams)
    return np.asarray(loaded.agent.act(policy, obs, jax.random.key(123), hparams, False))


# Runs in a fresh interpreter: only jax and numpy (flatbuffers underneath jax.export).
LOADER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import jax
    import numpy as np

    for export_dir in sys.argv[1:]:
        export_dir = Path(export_dir)
        spec = json.loads((export_dir / "policy.json").read_text())
        exported = jax.export.deserialize(bytearray((export_dir / "policy.jax").read_bytes()))
        with np.load(export_dir / "weights.npz", allow_pickle=False) as data:
            weights = dict(data)
        obs = np.load(export_dir / "obs.npy", allow_pickle=False)
        assert list(obs.shape[1:]) == spec["observation"]["shape"]
        assert obs.dtype.name == spec["observation"]["dtype"]
        np.save(export_dir / "actions.npy", np.asarray(exported.call(weights, obs)))
        np.save(export_dir / "one.npy", np.asarray(exported.call(weights, obs[:1])))
    print(json.dumps(sorted({m.split(".")[0] for m in sys.modules})))
    """
)


def load_in_fresh_process(*export_dirs: Path) -> set[str]:
    """Runs LOADER on each export; returns the top-level modules that process imported."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", LOADER, *map(str, export_dirs)],
        env={**env, "JAX_PLATFORMS": "cpu"},
        cwd=export_dirs[0].parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout.strip().splitlines()[-1]))


def test_a_fresh_process_with_jax_and_numpy_reproduces_fastpops_actions(runs, tmp_path, capsys):
    exports, expected = [], {}
    for name, run_dir in runs.items():
        out = tmp_path / f"{name}_member2"
        assert fastpop_export(run_dir, "--member", "2", "--out", out) == 0
        assert f"wrote {out}: member 2 of {run_dir}" in capsys.readouterr().out
        assert sorted(os.listdir(out)) == ["policy.jax", "policy.json", "weights.npz"]
        spec = json.loads((out / "policy.json").read_text())
        obs = observations(spec["observation"]["shape"], spec["observation"]["dtype"])
        np.save(out / "obs.npy", obs)
        expected[name] = fastpop_actions(run_dir, 2, obs)
        if name != "dqn_atari":  # the export is member 2's: another member acts otherwise
            assert not np.array_equal(expected[name], fastpop_actions(run_dir, 0, obs))
        exports.append(out)
    modules = load_in_fresh_process(*exports)
    assert not modules & {"fastpop", "flax", "optax", "chex", "gymnasium"}
    assert {"jax", "numpy"} <= modules
    for name, out in zip(runs, exports, strict=True):
        actions, one = np.load(out / "actions.npy"), np.load(out / "one.npy")
        if name.startswith("dqn"):
            assert actions.dtype == np.int32 and actions.shape == (64,)
            np.testing.assert_array_equal(actions, expected[name])
            if name in ("dqn", "dqn_dueling"):
                assert len(set(actions.tolist())) > 1  # the observations exercise both actions
        else:
            assert actions.dtype == np.float32 and actions.shape == (64, 1)
            np.testing.assert_allclose(actions, expected[name], rtol=1e-6, atol=1e-6)
            assert np.all(np.abs(actions) <= 2.0)
        np.testing.assert_allclose(one, actions[:1], rtol=1e-6, atol=1e-6)  # any batch size


def test_the_spaces_and_the_origin_are_described(runs, tmp_path, capsys):
    out = tmp_path / "sac"
    assert fastpop_export(runs["sac"], "--out", out) == 0
    spec = json.loads((out / "policy.json").read_text())
    assert spec["member"] == 1 and "best: return -1.0" in spec["member_chosen"]
    assert spec["algo"] == "sac" and spec["env_id"] == "Pendulum-v1"
    assert spec["observation"] == {"shape": [3], "dtype": "float32"}
    assert spec["action"] == {
        "kind": "continuous",
        "shape": [1],
        "dtype": "float32",
        "low": -2.0,
        "high": 2.0,
    }
    assert spec["frame_stack"] == 1 and spec["atari_preprocessing"] is None
    assert spec["trained_on"] is None  # the policy takes the observation it was trained on
    assert spec["run"] == str(runs["sac"].resolve()) and spec["member_env_steps"] == 100
    assert spec["hparams"]["actor_lr"] == 3e-4
    with np.load(out / "weights.npz", allow_pickle=False) as weights:
        loaded = evaluate.load_latest(runs["sac"], print)
        member = jax.tree.map(lambda leaf: np.asarray(leaf[1]), loaded.policy)
        assert sorted(weights) == sorted(export.flat_weights(member)[0])
        kernel = weights["params/MLP_0/Dense_0/kernel"]
        np.testing.assert_array_equal(kernel, member["params"]["MLP_0"]["Dense_0"]["kernel"])
    dqn = tmp_path / "dqn"
    assert fastpop_export(runs["dqn"], "--member", "0", "--out", dqn) == 0
    action = json.loads((dqn / "policy.json").read_text())["action"]
    assert action == {"kind": "discrete", "num_actions": 2, "shape": [], "dtype": "int32"}
    dueling = tmp_path / "dueling"
    assert fastpop_export(runs["dqn_dueling"], "--member", "0", "--out", dueling) == 0
    with np.load(dueling / "weights.npz", allow_pickle=False) as weights:
        # Both streams: the advantages (one per action) and the value.
        assert weights["params/Dense_0/kernel"].shape[-1] == 2
        assert weights["params/Dense_1/kernel"].shape[-1] == 1


def entries(directory: Path) -> set[str]:
    return {str(p.relative_to(directory)) for p in directory.rglob("*")}


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--member", "3"], "--member 3: the run's population has 3 members (0..2)"),
        (["--member", "worst"], "--member 'worst': expected best or a member index"),
        (["--member", "-1"], "--member '-1': expected best or a member index"),
    ],
)
def test_bad_member_exits_2_and_writes_nothing(runs, tmp_path, capsys, argv, message):
    assert fastpop_export(runs["td3"], *argv, "--out", tmp_path / "out") == 2
    assert message in capsys.readouterr().err
    assert entries(tmp_path) == set()


def test_a_run_without_a_checkpoint_exits_2(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert fastpop_export(tmp_path / "run", "--out", tmp_path / "out") == 2
    assert "has no checkpoint" in capsys.readouterr().err
    assert fastpop_export(tmp_path / "missing", "--out", tmp_path / "out") == 2
    assert f"run directory {tmp_path / 'missing'} does not exist" in capsys.readouterr().err
    assert entries(tmp_path) == {"run"}


def test_an_existing_out_dir_is_replaced_only_with_overwrite_and_only_an_export(
    runs, tmp_path, capsys
):
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    assert fastpop_export(runs["td3"], "--out", other) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert fastpop_export(runs["td3"], "--out", other, "--overwrite") == 2
    assert "replaces only an earlier export" in capsys.readouterr().err
    assert entries(other) == {"keep.txt"}
    out = tmp_path / "out"
    out.mkdir()  # an empty directory is fine
    assert fastpop_export(runs["td3"], "--member", "0", "--out", out) == 0
    assert fastpop_export(runs["td3"], "--member", "2", "--out", out) == 2
    assert json.loads((out / "policy.json").read_text())["member"] == 0
    assert fastpop_export(runs["td3"], "--member", "2", "--out", out, "--overwrite") == 0
    assert json.loads((out / "policy.json").read_text())["member"] == 2
    assert sorted(os.listdir(tmp_path)) == ["notes", "out"]  # no temporary left behind


def test_a_failed_write_leaves_no_partial_output(runs, tmp_path, capsys, monkeypatch):
    real_write = Path.write_bytes
    written = []

    def full_disk(self, data):
        written.append(self.name)
        if len(written) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    assert fastpop_export(runs["td3"], "--out", tmp_path / "out") == 2
    assert "No space left on device" in capsys.readouterr().err
    assert len(written) == 2
    assert entries(tmp_path) == set()
