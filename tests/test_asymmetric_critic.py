"""An asymmetric actor-critic (EnvSpec.policy_obs_size > 0: Playground's humanoid joystick tasks,
whose observation is [state | privileged_state], as FastTD3 trains them): TD3's and SAC's
actors see the observation's first entries alone and their critics the rest alone; an algorithm
that does not separate them is refused; collectors act through JAX. Without it (0, every other
env) both see everything, as before (the equivalence tests elsewhere)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.agents import make_agent
from fastpop.agents.networks import DeterministicActor, GaussianActor, TwinCritic
from fastpop.collect.acting import numpy_policy_for
from fastpop.types import EnvSpec, Transition

SPEC = EnvSpec((7,), action_dim=2, policy_obs_size=3)  # 3 for the policy, 4 privileged


def first_kernels(tree) -> list[tuple[int, ...]]:
    """The kernel shape of the first Dense layer of every MLP in a params tree (the layer that
    reads the observation; SAC's heads beside its MLP read its features)."""
    found = []

    def visit(node):
        for name, child in node.items():
            if name.startswith("MLP_"):
                found.append(tuple(child["Dense_0"]["kernel"].shape))
            elif isinstance(child, dict):
                visit(child)

    visit(tree)
    return found


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_the_agents_actor_takes_the_policy_entries_and_its_critics_the_privileged_ones(algo):
    agent = make_agent(algo, SPEC, hidden_sizes=(8,), batch_size=4)
    state = jax.eval_shape(agent.init, jax.random.key(0), agent.default_hparams())
    assert set(first_kernels(state.actor)) == {(3, 8)}  # the 3 policy entries
    assert set(first_kernels(state.critic)) == {(4 + 2, 8)}  # privileged entries and action
    assert numpy_policy_for(algo, SPEC, (agent.policy_params(state),), 1, 1) is None
    # two updates on such observations (TD3's actor: every second) run and move both networks
    rng = np.random.default_rng(0)
    batch = Transition(
        obs=rng.standard_normal((4, 7)).astype(np.float32),
        action=rng.uniform(-1, 1, (4, 2)).astype(np.float32),
        reward=rng.standard_normal(4).astype(np.float32),
        next_obs=rng.standard_normal((4, 7)).astype(np.float32),
        terminated=np.zeros(4, bool),
        truncated=np.zeros(4, bool),
    )
    hparams = agent.default_hparams()
    before = agent.init(jax.random.key(0), hparams)

    def twice(state):
        state, _ = agent.update(state, batch, hparams, jax.random.key(1))
        return agent.update(state, batch, hparams, jax.random.key(2))

    after, metrics = jax.jit(twice)(before)
    assert np.isfinite(metrics["critic_loss"]) and np.isfinite(metrics["actor_loss"])
    for name in ("actor", "critic"):
        moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), getattr(before, name),
                             getattr(after, name))  # fmt: skip
        assert any(jax.tree.leaves(moved)), name


def test_each_network_reads_only_its_slice_of_the_observation():
    obs = jnp.asarray(np.random.default_rng(1).standard_normal((5, 7)), jnp.float32)
    privileged_changed = obs.at[:, 3:].add(1.0)
    policy_changed = obs.at[:, :3].add(1.0)
    action = jnp.zeros((5, 2))
    for actor in (
        DeterministicActor(2, (8,), -1.0, 1.0, observes=SPEC.actor_observes),
        GaussianActor(2, (8,), observes=SPEC.actor_observes),
    ):
        params = actor.init(jax.random.key(0), obs)
        same = jax.tree.map(
            np.array_equal, actor.apply(params, obs), actor.apply(params, privileged_changed)
        )
        assert all(jax.tree.leaves(same))
        changed = jax.tree.map(
            np.array_equal, actor.apply(params, obs), actor.apply(params, policy_changed)
        )
        assert not all(jax.tree.leaves(changed))
    critic = TwinCritic((8,), observes=SPEC.critic_observes)
    params = critic.init(jax.random.key(0), obs, action)
    q = critic.apply(params, obs, action)
    np.testing.assert_array_equal(q, critic.apply(params, policy_changed, action))
    assert not np.array_equal(q, critic.apply(params, privileged_changed, action))
    assert EnvSpec((7,), action_dim=2).actor_observes == (None, None)  # the whole observation


def test_an_algorithm_that_does_not_separate_them_is_refused():
    discrete = EnvSpec((7,), num_actions=3, policy_obs_size=3)
    with pytest.raises(ValueError, match="privileged state for the critics alone") as error:
        make_agent("dqn", discrete)
    assert "use td3, sac" in str(error.value)


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_the_exported_policy_takes_the_state_alone_and_acts_as_the_agent(algo):
    """`fastpop export` of an asymmetric run: the function takes the policy's entries alone (what
    a robot has), with the observation statistics of the whole training vector applied to them,
    and acts as the agent does on any training observation that starts with them."""
    from jax import export as jax_export

    from fastpop.commands import export

    agent = make_agent(algo, SPEC, hidden_sizes=(8,), batch_size=4, observation_norm=True)
    state = agent.init(jax.random.key(0), agent.default_hparams())
    rng = np.random.default_rng(2)
    stats = state.observation_norm._replace(  # statistics unlike the initial ones
        mean=jnp.asarray(rng.standard_normal(7), jnp.float32),
        var=jnp.asarray(rng.uniform(0.5, 2.0, 7), jnp.float32),
    )
    policy = agent.policy_params(state._replace(observation_norm=stats))
    hparams = agent.default_hparams()
    weights, serialized = export.export_policy(agent, policy, hparams, SPEC)
    exported = jax_export.deserialize(bytearray(serialized))
    assert export.policy_observation_shape(SPEC) == (3,)
    assert exported.in_avals[-1].shape[1:] == (3,)  # (batch, 3): the observation, last
    training_obs = rng.standard_normal((6, 7)).astype(np.float32)
    actions = exported.call(weights, training_obs[:, :3])
    expected = agent.act(policy, training_obs, jax.random.key(0), hparams, False, 0)
    np.testing.assert_allclose(actions, expected, rtol=1e-6, atol=1e-6)
    assert export.trained_on(SPEC)["observation_shape"] == [7]
    assert export.trained_on(SPEC)["policy_entries"] == 3
    assert export.trained_on(EnvSpec((7,), action_dim=2)) is None
