"""An asymmetric actor-critic (EnvSpec.policy_obs_size > 0) through device mode end to end, as
the Playground humanoid joystick tasks run on a GPU: a toy family gives gymnax's Pendulum as
[state | privileged_state], the privileged part the pendulum's angle, velocity and last torque.
A short TD3 run trains and evaluates on the device, its replay holds the whole vector, its
networks read their own parts, and its export takes the state alone and acts as the checkpoint's
policy does. (The humanoids need robot models the suite does not have.)"""

from __future__ import annotations

import json
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jax_export

from fastpop import config as config_lib
from fastpop.commands import cli, evaluate
from fastpop.envs import device_envs
from fastpop.population import replay
from fastpop.run import loop
from fastpop.run.parts import build_run
from tests.dependencies import require
from tests.test_asymmetric_critic import first_kernels
from tests.test_device_mode import PRESET, SHORT, rows

require("gymnax")

ENV_ID = "asym/Pendulum-v1"
STATE, PRIVILEGED = 3, 3  # gymnax's observation (cos, sin, velocity); angle, velocity, torque


def with_privileged_state(state):
    """The gymnax state with its observation followed by the privileged entries."""
    env = state.env
    privileged = jnp.stack([env.theta, env.theta_dot, env.last_u]).astype(jnp.float32)
    return state._replace(obs=jnp.concatenate([state.obs, privileged]))


def asymmetric_family() -> types.ModuleType:
    """A family of one env, `asym/Pendulum-v1`, as a plugin's adapter module would define it."""
    family = types.ModuleType("asymmetric_envs")
    family.PREFIX, family.EXTRA, family.PACKAGE, family.PROBE_ID = "asym/", None, "gymnax", ENV_ID
    family.LIBRARIES, family.BACKENDS = ("gymnax",), ()
    family.check_id = lambda env_id: env_id
    family.discrete_actions = lambda env_id: False
    family.default_episode_length = lambda env_id: 200
    family.counterpart = lambda env_id: None

    def make(env_id, backend=None):
        pendulum = device_envs.make_device_env("gymnax/Pendulum-v1")
        spec = pendulum.spec._replace(obs_shape=(STATE + PRIVILEGED,), policy_obs_size=STATE)
        return pendulum._replace(
            reset=lambda key: with_privileged_state(pendulum.reset(key)),
            step=lambda state, action: with_privileged_state(pendulum.step(state, action)),
            spec=spec,
        )

    family.make = make
    return family


@pytest.fixture
def asymmetric_env():
    device_envs.register(asymmetric_family())
    yield
    device_envs.unregister("asym/")


def test_an_asymmetric_td3_trains_evaluates_and_exports_on_the_device(asymmetric_env, tmp_path):
    config = config_lib.load_config(
        PRESET, [*SHORT, f"env.id={ENV_ID}", "train.total_env_steps=512"]
    )
    assert config_lib.collection_mode(config) == "device"
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    trained = loop.Run(build_run(config), run_dir, log=lambda message: None)
    trained.run()
    evaluated = rows(run_dir)
    assert [(r["member"], r["member_env_steps"]) for r in evaluated] == [
        (0, 512),
        (1, 512),
    ]
    assert all(np.isfinite(r["return_mean"]) and r["return_mean"] < 0 for r in evaluated)
    learner = trained.learner
    assert set(first_kernels(learner.states.actor)) == {(2, STATE, 16)}  # per member
    assert set(first_kernels(learner.states.critic)) == {(2, PRIVILEGED + 1, 16)}
    # The replay holds the whole vector; its privileged angle is the state's (cos, sin) angle.
    buffer = jax.tree.map(lambda x: x[0], learner.replay.buffers)
    batch = replay.sample(learner.replay.spec, buffer, jax.random.key(0), 64)
    stored = np.asarray(batch.obs)
    assert stored.shape == (64, STATE + PRIVILEGED)
    angle = stored[:, STATE]
    np.testing.assert_allclose(np.cos(angle), stored[:, 0], atol=1e-5)
    np.testing.assert_allclose(np.sin(angle), stored[:, 1], atol=1e-5)

    out = tmp_path / "policy"
    assert cli.main(["export", str(run_dir), "--member", "1", "--out", str(out)]) == 0
    described = json.loads((out / "policy.json").read_text())
    assert described["observation"]["shape"] == [STATE]
    assert described["trained_on"]["observation_shape"] == [STATE + PRIVILEGED]
    exported = jax_export.deserialize(bytearray((out / "policy.jax").read_bytes()))
    weights = dict(np.load(out / "weights.npz", allow_pickle=False))
    loaded = evaluate.load_latest(run_dir, print)
    policy = jax.tree.map(lambda leaf: leaf[1], loaded.policy)
    hparams = jax.tree.map(lambda leaf: leaf[1], loaded.hparams)
    training_obs = stored[:16]
    expected = loaded.agent.act(policy, training_obs, jax.random.key(0), hparams, False, 0)
    actions = exported.call(weights, training_obs[:, :STATE])
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
