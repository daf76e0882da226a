"""The distributional (C51) critic of TD3 and SAC and LayerNorm in their critics: the projection
and the losses against hand-computed numbers, the agents' critics as configured, and the
config's words for a bad value. (Vectorized == sequential and termination masking for these
options: tests/test_population.py and tests/test_losses.py; learning: tests/test_learning.py.)"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.agents import losses, make_agent, registry
from fastpop.agents.critics import make_critic
from fastpop.agents.td3 import TD3Config
from fastpop.config import ConfigError, load_config
from tests.helpers import TINY_OPTIONS, TINY_SPECS, tiny_agent
from tests.test_losses import flagged_batch
from tests.test_shared_critic import shared_learner

f32 = jnp.float32
SUPPORT = jnp.linspace(-2.0, 2.0, 5)  # atoms at -2, -1, 0, 1, 2: spacing 1


def close(actual, expected, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=1e-6, atol=atol)


def target(reward, bootstrap, next_probs):
    return losses.categorical_target(f32(reward), f32(bootstrap), jnp.array(next_probs), SUPPORT)


# --- the projection by hand ---------------------------------------------------------------------


def test_atoms_between_support_points_split_their_mass_by_closeness():
    # 0.3 + 0.5 * z: the mass 0.5 at z = -1 lands on -0.2 (0.8 of it to 0, 0.2 to -1), the
    # mass 0.5 at z = 1 on 0.8 (0.8 of it to 1, 0.2 to 0).
    close(target(0.3, 0.5, [0.0, 0.5, 0.0, 0.5, 0.0]), [0.0, 0.1, 0.5, 0.4, 0.0])


def test_atoms_beyond_the_support_are_clipped_to_its_ends():
    # 2 + 0.9 * z: 0.2 at 0.2 (0.16 to 0, 0.04 to 1), 0.3 at 2.0 (on the last point), 0.5 at
    # 3.8 (past v_max = 2: clipped to it).
    close(target(2.0, 0.9, [0.2, 0.0, 0.3, 0.0, 0.5]), [0.0, 0.0, 0.16, 0.04, 0.8])
    # -3 + 0.5 * z: every atom at or below v_min = -2.
    close(target(-3.0, 0.5, [0.5, 0.0, 0.0, 0.0, 0.5]), [1.0, 0.0, 0.0, 0.0, 0.0])


@pytest.mark.parametrize(
    ("reward", "expected"),
    [(0.25, [0.0, 0.0, 0.75, 0.25, 0.0]), (1.0, [0.0, 0.0, 0.0, 1.0, 0.0])],
    ids=["between", "on-a-point"],
)
def test_a_terminal_puts_all_the_mass_at_the_reward(reward, expected):
    for next_probs in ([0.2, 0.2, 0.2, 0.2, 0.2], [0.0, 0.0, 0.0, 0.0, 1.0]):
        close(target(reward, 0.0, next_probs), expected)
    bootstrap = losses.bootstrap_multiplier(f32(0.99), jnp.bool_(True))
    close(target(reward, bootstrap, [0.2, 0.2, 0.2, 0.2, 0.2]), expected)
    close(losses.bootstrap_multiplier(f32(0.99), jnp.bool_(False)), 0.99)


def test_the_projection_keeps_the_mass_and_the_mean_inside_the_support():
    rng = np.random.default_rng(0)
    for _ in range(20):
        probs = jax.nn.softmax(jnp.asarray(rng.normal(size=5), jnp.float32))
        reward, bootstrap = rng.uniform(-0.5, 0.5), rng.uniform(0.0, 0.7)
        projected = target(reward, bootstrap, probs)
        close(jnp.sum(projected), 1.0, atol=1e-5)
        assert np.all(np.asarray(projected) >= 0.0)
        # Nothing clipped: the mean is reward + bootstrap * the next mean, exactly.
        close(projected @ SUPPORT, reward + bootstrap * (probs @ SUPPORT), atol=1e-5)


def test_the_target_is_a_constant():
    grads = jax.grad(lambda p, r: jnp.sum(target(r, 0.5, p) * SUPPORT), argnums=(0, 1))(
        jnp.full(5, 0.2), f32(0.3)
    )
    close(grads[0], np.zeros(5))
    close(grads[1], 0.0)


# --- the losses by hand ---------------------------------------------------------------------------


def one_hot_logits(index, size=5, scale=50.0):
    """Logits whose softmax is (to float precision) all mass at `index`."""
    return scale * jax.nn.one_hot(index, size)


def test_td3_loss_takes_the_target_critic_with_the_smaller_mean():
    # Target critic 0 says 1 (all mass at 1), critic 1 says -1: the target is 0.5 + 0.5 * -1
    # = 0, one-hot at 0, whichever order the two come in.
    logits = jnp.zeros((2, 5))  # uniform predictions: gradient = 0.2 - target, per critic
    for order in ([3, 1], [1, 3]):
        next_logits = jnp.stack([one_hot_logits(i) for i in order])

        def loss(logits, next_logits=next_logits):
            return losses.td3_distributional_critic_loss(
                logits, f32(0.5), f32(0.5), next_logits, SUPPORT
            )

        close(loss(logits), 2 * np.log(5.0), atol=1e-5)  # cross-entropy log 5 per critic
        expected = 0.2 - np.array([0.0, 0.0, 1.0, 0.0, 0.0])
        close(jax.grad(loss)(logits), np.stack([expected, expected]), atol=1e-5)
        close(jax.grad(loss, argnums=0)(logits).shape, (2, 5))


def test_sac_loss_shifts_the_next_distribution_by_the_entropy_term():
    # reward 0.5 scaled by 2 = 1; next: all mass at 0 for both critics; alpha 0.5, log pi -1:
    # the soft atoms are 0 - 0.5 * -1 = 0.5, so the target atom 1 + 0.5 * 0.5 = 1.25: 0.75
    # to 1, 0.25 to 2.
    next_logits = jnp.stack([one_hot_logits(2), one_hot_logits(2)])

    def loss(logits):
        return losses.sac_distributional_critic_loss(
            logits, f32(0.5), f32(0.5), next_logits, f32(-1.0), f32(0.5), f32(2.0), SUPPORT
        )

    expected = 0.2 - np.array([0.0, 0.0, 0.0, 0.75, 0.25])
    close(jax.grad(loss)(jnp.zeros((2, 5))), np.stack([expected, expected]), atol=1e-5)


def test_the_distributional_losses_reject_wrong_shapes():
    with pytest.raises(AssertionError):  # three critics are not a twin
        losses.td3_distributional_critic_loss(
            jnp.zeros((3, 5)), f32(0), f32(1), jnp.zeros((3, 5)), SUPPORT
        )
    with pytest.raises(AssertionError):  # logits of another support
        losses.td3_distributional_critic_loss(
            jnp.zeros((2, 4)), f32(0), f32(1), jnp.zeros((2, 4)), SUPPORT
        )
    with pytest.raises(AssertionError):  # a batch, not one example
        losses.categorical_target(jnp.zeros(4), f32(1), jnp.full(5, 0.2), SUPPORT)


# --- the agents' critics ------------------------------------------------------------------------


def agent_config(algo, **fields):
    return registry.get(algo).config_type(hidden_sizes=(16, 16), batch_size=8, **fields)


def test_the_critic_is_what_the_config_says():
    scalar = make_critic(TD3Config(hidden_sizes=(8,)))
    assert scalar.support is None and scalar.network.num_atoms is None
    assert not scalar.network.layer_norm
    c51 = make_critic(TD3Config(critic="distributional", layer_norm=True))
    np.testing.assert_allclose(c51.support, np.linspace(-250.0, 250.0, 101))  # FastTD3's
    assert c51.network.layer_norm and c51.network.num_atoms == 101
    with pytest.raises(ValueError, match=r"agent\.critic: must be one of scalar, distributional"):
        make_critic(TD3Config(critic="quantile"))
    with pytest.raises(ValueError, match=r"agent\.v_min < agent\.v_max"):
        make_critic(TD3Config(critic="distributional", v_min=1.0, v_max=1.0))


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_distributional_agents_have_logit_critics_and_layer_norm(algo):
    agent = tiny_agent(algo, **TINY_OPTIONS["distributional"])
    state = agent.init(jax.random.key(0), agent.default_hparams())
    for twin in ("MLP_0", "MLP_1"):
        critic = state.critic["params"][twin]
        assert critic["Dense_2"]["kernel"].shape == (16, 11)  # logits over 11 atoms
        assert set(critic) == {"Dense_0", "Dense_1", "Dense_2", "LayerNorm_0", "LayerNorm_1"}
    assert not any("LayerNorm" in name for name in state.actor["params"]["MLP_0"])
    batch = flagged_batch(algo, terminated=False, truncated=False)
    _, metrics = jax.jit(agent.update)(state, batch, agent.default_hparams(), jax.random.key(1))
    # Its Q: the mean of each critic's distribution over the atoms.
    critic = make_critic(agent_config(algo, **TINY_OPTIONS["distributional"]))
    logits = critic.network.apply(state.critic, batch.obs, batch.action)
    q = jnp.sum(jax.nn.softmax(logits) * np.linspace(-10.0, 10.0, 11), axis=-1)
    close(metrics["q_mean"], jnp.mean(q), atol=1e-5)
    # A fresh critic is close to uniform over the atoms: a cross-entropy near log 11 per critic.
    assert abs(float(metrics["critic_loss"]) - 2 * np.log(11.0)) < 0.5


def test_layer_norm_alone_keeps_the_scalar_critic():
    agent = make_agent("sac", TINY_SPECS["sac"], hidden_sizes=(8,), layer_norm=True)
    critic = agent.init(jax.random.key(0), agent.default_hparams()).critic["params"]["MLP_0"]
    assert critic["Dense_1"]["kernel"].shape == (8, 1) and "LayerNorm_0" in critic


def test_the_shared_critic_strategies_train_a_distributional_critic():
    # TD3's parts carry the critic's kind: CEM-RL's and DvD's one critic (shared_critic.py) is
    # the members' own, through the parts' critic_loss and actor_loss (CEM-RL's run here).
    options = ["agent.critic=distributional", "agent.num_atoms=11", "agent.layer_norm=true"]
    learner = shared_learner("cemrl", 3, *options, "agent.v_min=-10", "agent.v_max=300")
    critic = learner.states.critic["params"]["MLP_0"]
    assert critic["Dense_2"]["kernel"].shape == (8, 11) and "LayerNorm_0" in critic
    trained = np.asarray(learner.states.trained)  # half the samples, never the mean
    assert trained.any()
    before = jax.tree.map(np.array, (learner.states.critic, learner.states.actors))
    learner.update()
    after = (learner.states.critic, learner.states.actors)
    for old, new in zip(jax.tree.leaves(before[0]), jax.tree.leaves(after[0]), strict=True):
        assert not np.array_equal(old, new)
    for old, new in zip(jax.tree.leaves(before[1]), jax.tree.leaves(after[1]), strict=True):
        assert not np.array_equal(old[trained], np.asarray(new)[trained])
    metrics = jax.tree.map(np.asarray, learner.calls.metrics)
    assert all(np.all(np.isfinite(metrics[name])) for name in ("critic_loss", "q_mean"))


# --- the config ---------------------------------------------------------------------------------


def test_the_config_accepts_the_options():
    config = load_config(
        None,
        [
            "agent.critic=distributional",
            "agent.num_atoms=51",
            "agent.v_min=-1600",
            "agent.v_max=0",
            "agent.layer_norm=true",
        ],
    )
    assert config.agent["critic"] == "distributional" and config.agent["layer_norm"] is True
    assert (config.agent["num_atoms"], config.agent["v_min"], config.agent["v_max"]) == (
        51,
        -1600.0,
        0.0,
    )
    default = load_config(None, [])
    assert default.agent["critic"] == "scalar" and default.agent["layer_norm"] is False
    dqn = load_config(None, ["algo=dqn", "env.id=CartPole-v1", "agent.dueling=true"])
    assert dqn.agent["dueling"] is True


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["agent.critic=quantile"], "agent.critic: must be one of scalar, distributional, got"),
        (["agent.num_atoms=1"], "agent.num_atoms: must be >= 2, got 1"),
        (["agent.v_min=10", "agent.v_max=-10"], "agent.v_max: must be > agent.v_min (10.0)"),
        (["agent.layer_norm=yes please"], "agent.layer_norm: expected true or false"),
        (["algo=dqn", "env.id=CartPole-v1", "agent.dueling=1"], "agent.dueling: expected true"),
        (["algo=dqn", "env.id=CartPole-v1", "agent.critic=distributional"], "'agent.critic'"),
    ],
)
def test_bad_values_are_refused_naming_the_field(overrides, message):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert message in str(error.value)
