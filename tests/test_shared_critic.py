"""CEM, CEM-RL and DvD: the distribution update, the shared critic, the population-level
diversity loss and its numerics, and short `fastpop train` runs of both strategies."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.learn.learner import Learner
from fastpop.population import replay
from fastpop.run.parts import build_learner
from fastpop.strategies import cem, diversity, shared_critic
from fastpop.strategies.base import Evaluation
from tests.helpers import leaves_allclose, train_here
from tests.runs import FAST, TD3_PENDULUM, read_jsonl

# --- CEM ---


def test_cem_finds_the_optimum_of_a_quadratic_and_shrinks_to_the_floor():
    optimum = jnp.arange(6.0) - 2.0
    state = cem.init(jnp.full(6, 4.0), initial_variance=1.0, initial_noise=1e-2)
    key = jax.random.key(0)
    floor = 1e-6
    for _ in range(150):
        key, sample_key = jax.random.split(key)
        samples = cem.ask(state, sample_key, 16)
        fitness = -jnp.sum(jnp.square(samples - optimum), axis=1)
        state = cem.tell(state, samples, fitness, 0.5, noise_decay=0.9, noise_floor=floor)
    np.testing.assert_allclose(state.mean, optimum, atol=1e-2)
    assert float(state.noise) == pytest.approx(floor, rel=1e-2)
    assert np.all(np.asarray(state.variance) >= floor * 0.99)
    assert np.all(np.asarray(state.variance) < 10 * floor)


def test_mirrored_samples_are_exact_negatives_around_the_mean():
    centred = cem.ask(cem.init(jnp.zeros(7), 0.3, 0.0), jax.random.key(1), 10)
    np.testing.assert_array_equal(centred[:5], -centred[5:])  # bit for bit
    state = cem.init(jnp.linspace(-1.0, 1.0, 7), 0.3, 0.0)
    samples = cem.ask(state, jax.random.key(1), 10)
    np.testing.assert_allclose(samples[:5] - state.mean, -(samples[5:] - state.mean), atol=1e-6)
    with pytest.raises(ValueError, match="even number"):
        cem.ask(state, jax.random.key(1), 5)


def test_elite_weights_sum_to_one_and_favour_the_best():
    for count in (1, 2, 5, 40):
        weights = np.asarray(cem.elite_weights(count))
        assert weights.sum() == pytest.approx(1.0)
        assert np.all(np.diff(weights) < 0) or count == 1


def test_tell_refits_to_the_weighted_elites_around_the_old_mean():
    state = cem.init(jnp.zeros(2), 1.0, 0.5)
    samples = jnp.array([[1.0, 0.0], [3.0, 1.0], [-1.0, 2.0], [0.0, 0.0]])
    fitness = jnp.array([2.0, 3.0, jnp.nan, 1.0])  # elites: samples 1 then 0
    new = cem.tell(state, samples, fitness, elite_fraction=0.5, noise_decay=0.5, noise_floor=0.1)
    weights = np.asarray(cem.elite_weights(2))
    elites = np.array([[3.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(new.mean, weights @ elites, rtol=1e-6)
    np.testing.assert_allclose(new.variance, weights @ elites**2 + 0.5, rtol=1e-6)
    assert float(new.noise) == pytest.approx(0.5 * 0.5 + 0.5 * 0.1)


# --- shared critic learners ---

SMALL = [
    "agent.hidden_sizes=[8,8]",
    "agent.batch_size=16",
    "replay.capacity=256",
    "replay.min_size=4",
    "replay.shared=true",
    "collect.chunk_len=8",
    "collect.num_collectors=1",
    "train.updates_per_call=2",
    "hparams.policy_delay=1",
    "dvd.embedding_states=8",
]


def shared_learner(strategy: str, size: int, *overrides: str) -> Learner:
    config = config_lib.load_config(
        None, [*SMALL, f"strategy={strategy}", f"population.size={size}", *overrides]
    )
    learner = build_learner(config)
    rng = np.random.default_rng(0)
    layout = replay.row_layout(learner.replay.spec, (size, 8))
    for chunk in range(3):
        rewards = np.repeat(np.arange(size, dtype=np.float32)[:, None], 8, 1) + 100 * chunk
        learner.insert(
            replay.Rows(
                rng.normal(size=layout.obs.shape).astype(np.float32),
                rng.uniform(-1, 1, size=layout.action.shape).astype(np.float32),
                rewards,  # member m's rows carry reward m (+ 100 per chunk)
                *(np.zeros(leaf.shape, bool) for leaf in layout[3:]),
            )
        )
    return learner


def snapshot(tree):
    return jax.tree.map(np.array, tree)


def test_cemrl_trains_the_chosen_half_against_one_critic_then_refits_and_resamples():
    learner = shared_learner("cemrl", 5)
    states = learner.states
    np.testing.assert_array_equal(states.trained, [False, True, True, False, False])
    single = jax.tree.map(np.shape, population.member(states.actors, 0))
    agent_critic = learner.agent.init(jax.random.key(0), population.member(learner.hparams, 0))
    assert jax.tree.map(np.shape, states.critic) == jax.tree.map(np.shape, agent_critic.critic)
    assert jax.tree.map(lambda x: x.shape[1:], states.actors) == single
    before = snapshot(states)
    learner.update()
    after = snapshot(learner.states)
    for member in range(5):
        changed = [
            not np.array_equal(a[member], b[member])
            for a, b in zip(
                jax.tree.leaves(before.actors), jax.tree.leaves(after.actors), strict=True
            )
        ]
        assert all(changed) if member in (1, 2) else not any(changed), member
    for old, new in zip(jax.tree.leaves(before.critic), jax.tree.leaves(after.critic), strict=True):
        assert not np.array_equal(old, new)  # the one critic learned from the trained batches

    # The end of a generation: refit to the samples' returns, resample every actor.
    distribution = learner.strategy_state.distribution
    events, scalars = learner.strategy_step(Evaluation(0, 100, np.array([0.0, 4, 3, 2, 1])))
    assert events == [] and scalars["cemrl/generation"] == 1
    assert scalars["cemrl/mean_return"] == 0.0 and scalars["cemrl/best_sample_return"] == 4.0
    new = learner.strategy_state.distribution
    assert not np.array_equal(new.mean, distribution.mean)
    flat = jax.vmap(lambda a: jax.flatten_util.ravel_pytree(a)[0])(learner.states.actors)
    np.testing.assert_allclose(flat[0], new.mean)  # member 0 acts with the mean
    np.testing.assert_allclose(flat[1:3] - new.mean, -(flat[3:5] - new.mean), atol=1e-6)
    assert_same(learner.states.target_actors, learner.states.actors)
    assert all(np.all(np.asarray(m) == 0) for m in jax.tree.leaves(learner.states.actor_opts.mu))


def test_shared_buffer_receives_every_members_transitions():
    learner = read_only_dvd_learner(3)
    rewards = np.asarray(learner.buffers.rows.reward)
    assert learner.buffers.rows.reward.shape[0] == 3  # one lane per member's environment
    for member in range(3):
        np.testing.assert_array_equal(
            rewards[member, :24], np.repeat([member, member + 100, member + 200], 8)
        )


def assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)


# --- DvD ---


@functools.cache
def read_only_dvd_learner(size: int) -> Learner:
    """Shared by the tests that only read it (compiling a learner is most of their time)."""
    return shared_learner("dvd", size)


def dvd_inputs(size=3, identical=False):
    learner = read_only_dvd_learner(size)
    states = learner.states
    if identical:  # members 0 and 1 coincide
        actors = jax.tree.map(lambda x: x.at[1].set(x[0]), states.actors)
        states = states._replace(actors=actors)
    batch = jax.vmap(lambda k: learner.replay.sample(k))(jax.random.split(jax.random.key(3), size))
    return learner, states, batch.obs


def loss_and_grads(learner, states, obs, weight):
    def loss(actors):
        return shared_critic.population_actor_loss(
            learner.agent.internals, actors, states.critic, obs, states.trained,
            jnp.float32(weight), obs[0, :8], (1.0, 1e-3),
        )[0]  # fmt: skip

    return jax.value_and_grad(loss)(states.actors)


def test_dvd_gradient_matches_finite_differences_of_the_population_loss():
    """Guards against a per-member all_gather inside vmap(grad), which is P times too large."""
    learner, states, obs = dvd_inputs()
    weight = 10.0

    def coupling_only(flat):
        actors = unravel(flat)
        points = diversity.embeddings(learner.agent.internals.actor_apply, actors, obs[0, :8])
        return -weight * diversity.log_det(diversity.rbf_kernel(points, 1.0), 1e-3)

    flat, unravel = jax.flatten_util.ravel_pytree(states.actors)
    direction = jax.random.normal(jax.random.key(5), flat.shape)
    direction = direction / jnp.linalg.norm(direction)
    _, with_coupling = loss_and_grads(learner, states, obs, weight)
    _, without = loss_and_grads(learner, states, obs, 0.0)
    coupling_grad = (
        jax.flatten_util.ravel_pytree(with_coupling)[0]
        - (jax.flatten_util.ravel_pytree(without)[0])
    )
    epsilon = 1e-2
    numeric = (
        coupling_only(flat + epsilon * direction) - coupling_only(flat - epsilon * direction)
    ) / (2 * epsilon)
    analytic = jnp.dot(coupling_grad, direction)
    assert float(analytic) == pytest.approx(float(numeric), rel=0.05, abs=1e-3)


def test_dvd_is_finite_when_two_members_coincide():
    learner, states, obs = dvd_inputs(identical=True)
    for weight in (0.0, 0.5):
        loss, grads = loss_and_grads(learner, states, obs, weight)
        assert np.isfinite(float(loss))
        assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))


def test_dvd_with_lambda_zero_is_independent_td3_on_the_shared_critic():
    learner, states, obs = dvd_inputs()
    _, grads = loss_and_grads(learner, states, obs, 0.0)
    internals = learner.agent.internals
    for member in range(3):
        expected = jax.grad(internals.actor_loss)(
            population.member(states.actors, member), states.critic, obs[member]
        )
        # the same sums in another program: equal up to float rounding
        assert leaves_allclose(population.member(grads, member), expected, atol=1e-8)


def test_dvd_resets_a_non_finite_member_from_the_best_and_touches_no_other():
    learner = shared_learner("dvd", 4)
    broken = jax.tree.map(lambda x: x.at[1].set(jnp.nan), learner.states.actors)
    learner.states = learner.states._replace(actors=broken)
    before = snapshot(shared_critic.member_trees(learner.states))
    events, scalars = learner.strategy_step(Evaluation(0, 100, np.array([1.0, np.nan, 5, 2])))
    assert [(e["kind"], e["target"], e["source"]) for e in events] == [("reset", 1, 2)]
    after = snapshot(shared_critic.member_trees(learner.states))
    for member in (0, 2, 3):
        assert_same(population.member(after, member), population.member(before, member))
    assert_same(population.member(after, 1), population.member(before, 2))
    assert set(scalars) == {"dvd/log_det_kernel", "dvd/mean_pairwise_distance", "dvd/lambda"}
    assert all(np.isfinite(v) for v in scalars.values())


# --- short runs ---

SHARED_RUN = [
    *FAST,
    "replay.shared=true",
    "collect.num_collectors=1",
    "train.total_env_steps=1300",
    "log.tensorboard=false",
]


@pytest.mark.parametrize(
    "overrides,scalars",
    [
        (
            ["strategy=cemrl", "population.size=5", "cemrl.generation_steps=400"],
            {"cemrl/mean_return", "cemrl/mean_variance", "cemrl/noise"},
        ),
        (
            ["strategy=dvd", "dvd.coefficients=[0.0,0.5]", "eval.interval=400"],
            {"dvd/log_det_kernel", "dvd/mean_pairwise_distance", "dvd/lambda"},
        ),
    ],
    ids=["cemrl", "dvd"],
)
def test_shared_critic_runs_complete_and_log_their_metrics(tmp_path, overrides, scalars):
    # trained in this process: its files are what is checked
    run = train_here(tmp_path, TD3_PENDULUM, *SHARED_RUN, *overrides).run_dir
    logged = [row for row in read_jsonl(run / "scalars.jsonl") if scalars & set(row)]
    # One row per evaluation round during training: 416, 800, 1216 (the learner waits for each;
    # the final evaluation at 1312 decides nothing).
    assert len(logged) == 3, logged
    assert all(scalars <= set(row) for row in logged)
    rows = read_jsonl(run / "metrics.jsonl")
    assert sorted({row["member_env_steps"] for row in rows}) == [416, 800, 1216, 1312]
