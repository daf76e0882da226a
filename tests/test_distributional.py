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
    with pytest.raises(TypeError, match="support must be a constant"):  # traced: no float64 ends
        jax.jit(lambda support: losses.categorical_target(f32(0), f32(1), support, support))(
            SUPPORT
        )


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
    # TD3's internals carry the critic's kind: CEM-RL's and DvD's one critic (shared_critic.py) is
    # the members' own, through the internals' critic_loss and actor_loss (CEM-RL's run here).
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


# --- the projection against its definition in double precision (issue 59) ----------------------

# Supports of the configs and tests: the helpers' and the humanoid's spacings (0.4, 0.6) are not
# float32 numbers; the others' are.
SUPPORTS = [(-10.0, 10.0, 51), (-10.0, 50.0, 101), (-250.0, 250.0, 101), (-3300.0, 0.0, 101)]


def projected_exactly(atoms, probs, v_min, v_max, num_atoms):
    """The projection by its definition (rlax's dense form) in float64: probs[i] goes to the
    support point v_min + j * spacing in proportion max(0, 1 - |clip(atoms[i]) - point| /
    spacing), the support evenly spaced in exact arithmetic."""
    spacing = (v_max - v_min) / (num_atoms - 1)
    points = v_min + spacing * np.arange(num_atoms)
    clipped = np.clip(np.asarray(atoms, np.float64), v_min, v_max)
    weights = np.maximum(0.0, 1.0 - np.abs(clipped[:, None] - points[None, :]) / spacing)
    return np.asarray(probs, np.float64) @ weights


@pytest.mark.parametrize(("v_min", "v_max", "num_atoms"), SUPPORTS)
def test_the_projection_is_its_definition_in_double_precision(v_min, v_max, num_atoms):
    """No more mass moves to a neighbour than float32's rounding of atom - v_min moves (up to
    ~6e-6 at 101 atoms): the float32 spacing moved up to 5e-5 on [-10, 10] and [-10, 50]. The
    mass is kept to the rounding of its float32 sums."""
    support = np.linspace(v_min, v_max, num_atoms, dtype=np.float32)
    project = jax.jit(jax.vmap(lambda a, p: losses.categorical_projection(a, p, support)))
    rng = np.random.default_rng(num_atoms)
    cases = 200
    # Atoms over twice the support's range (about half of them clipped), and on support points.
    width = v_max - v_min
    atoms = rng.uniform(v_min - width / 2, v_max + width / 2, (cases, num_atoms))
    on_points = support[rng.integers(0, num_atoms, atoms.shape)]
    atoms = np.where(rng.random(atoms.shape) < 0.25, on_points, atoms).astype(np.float32)
    probs = np.asarray(jax.nn.softmax(jnp.asarray(rng.normal(0, 3, (cases, num_atoms)), f32)))
    got = np.asarray(project(atoms, probs), np.float64)
    want = np.stack(
        [
            projected_exactly(a, p, v_min, v_max, num_atoms)
            for a, p in zip(atoms, probs, strict=True)
        ]
    )
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got.sum(axis=1), probs.astype(np.float64).sum(axis=1), atol=1e-6)


@pytest.mark.parametrize(("v_min", "v_max", "num_atoms"), SUPPORTS)
def test_an_atom_on_a_support_point_is_not_split(v_min, v_max, num_atoms):
    """Every support point that float32 holds exactly (0.0 on [-10, 10]) keeps all its mass: the
    float32 spacing put 0.0 on [-10, 10] (51 atoms) 5e-5 of a spacing below its point."""
    support = np.linspace(v_min, v_max, num_atoms, dtype=np.float32)
    spacing = (v_max - v_min) / (num_atoms - 1)
    exact = np.flatnonzero(support.astype(np.float64) == v_min + spacing * np.arange(num_atoms))
    projected = jax.vmap(lambda a: losses.categorical_projection(a[None], jnp.ones(1), support))
    got = np.asarray(projected(support[exact]))
    np.testing.assert_array_equal(got, np.eye(num_atoms, dtype=np.float32)[exact])


# --- the twin target: the smaller mean after the projection (issue 59) --------------------------


def test_the_twin_target_is_the_projection_with_the_smaller_mean():
    """Clipping reverses the order of the means: reward -1 and bootstrap 1 move critic 0's mass
    at -2 to -3, clipped back to -2 (its mean rises by 0.5). Before the projection critic 0's
    mean (0) is the smaller, after it critic 1's (-0.75 against -0.5): FastTD3 (which projects
    both, then compares) takes critic 1's projection."""
    next_probs = np.array([[0.5, 0.0, 0.0, 0.0, 0.5], [0.0, 0.0, 0.75, 0.25, 0.0]])
    assert next_probs @ np.asarray(SUPPORT) @ [1, -1] < 0  # before: critic 0's is the smaller
    atoms = -1.0 + np.asarray(SUPPORT, np.float64)
    projected = [projected_exactly(atoms, p, -2.0, 2.0, 5) for p in next_probs]
    close(projected[0], [0.5, 0.0, 0.0, 0.5, 0.0])
    close(projected[1], [0.0, 0.75, 0.25, 0.0, 0.0])

    def loss(logits):
        return losses.td3_distributional_critic_loss(
            logits, f32(-1.0), f32(1.0), jnp.log(jnp.asarray(next_probs, f32)), SUPPORT
        )

    expected = 0.2 - projected[1]  # uniform predictions: gradient = 0.2 - target, per critic
    close(jax.grad(loss)(jnp.zeros((2, 5))), np.stack([expected, expected]), atol=1e-5)


def twin_loss_by_definition(logits, reward, bootstrap, next_logits, v_min, v_max):
    """FastTD3's: both target critics' distributions projected, the projection of smaller
    mean taken (the second where they tie), the cross-entropy of each critic against it."""
    num_atoms = logits.shape[-1]
    support = np.linspace(v_min, v_max, num_atoms)
    next_probs = np.asarray(jax.nn.softmax(next_logits), np.float64)
    projected = [
        projected_exactly(reward + bootstrap * support, p, v_min, v_max, num_atoms)
        for p in next_probs
    ]
    target = projected[0] if projected[0] @ support < projected[1] @ support else projected[1]
    log_probs = np.asarray(jax.nn.log_softmax(logits), np.float64)
    return -np.sum(log_probs @ target)


def test_the_twin_target_matches_fasttd3s_under_heavy_clipping():
    v_min, v_max, num_atoms, cases = -10.0, 10.0, 21, 300
    support = np.linspace(v_min, v_max, num_atoms, dtype=np.float32)
    rng = np.random.default_rng(59)
    logits = rng.normal(0, 2, (cases, 2, num_atoms)).astype(np.float32)
    next_logits = rng.normal(0, 3, (cases, 2, num_atoms)).astype(np.float32)
    reward = rng.uniform(-15, 15, cases).astype(np.float32)  # most targets partly clipped
    bootstrap = rng.uniform(0.5, 1.0, cases).astype(np.float32)
    loss = jax.jit(jax.vmap(lambda *x: losses.td3_distributional_critic_loss(*x, support)))
    got = np.asarray(loss(logits, reward, bootstrap, next_logits))
    want = [
        twin_loss_by_definition(*case, v_min, v_max)
        for case in zip(logits, reward, bootstrap, next_logits, strict=True)
    ]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
