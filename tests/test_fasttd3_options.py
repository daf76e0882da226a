"""FastTD3's options (Seo et al., 2025; issue 59), each a config field off by default: no target
actor, target critics after every critic step, the actor on min(Q1, Q2), per-episode exploration
stds, AdamW and residual (SimBa) networks; each against TD3 where it reduces to it, or against a
hand computation. (SAC's n-step targets leave the window's entropy terms out: agents/sac.py.)
Each test compiles one small program at most, or none (shapes by `jax.eval_shape`)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastpop import population
from fastpop.agents import make_agent
from fastpop.agents.base import adam_step, network_optimizer
from fastpop.agents.critics import make_critic
from fastpop.agents.networks import ResidualMLP
from fastpop.agents.td3 import TD3Config
from fastpop.collect import device_rollout, numpy_policy
from fastpop.collect.acting import JaxActing, numpy_policy_for
from fastpop.collect.device_collection import EnvLanes
from fastpop.collect.numpy_policy import NumpyActing
from fastpop.config import ConfigError, load_config
from fastpop.envs.device_envs import make_device_env
from tests.dependencies import require
from tests.helpers import TINY_OPTIONS, TINY_SPECS, leaves_allclose, tiny_agent
from tests.test_losses import flagged_batch

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
FASTTD3 = {
    "target_actor": False,
    "target_critic_every_step": True,
    "actor_q": "min",
    "exploration_std_min": 0.05,
    "weight_decay": 0.1,
    "network": "residual",
    "actor_output_init_std": 0.01,
}


def init_shapes(agent):
    return jax.eval_shape(agent.init, jax.random.key(0), agent.default_hparams())


def same(a, b) -> bool:
    return all(map(np.array_equal, jax.tree.leaves(a), jax.tree.leaves(b)))


def random_state(agent, seed: int = 0, members: int | None = None):
    """A state of `agent` made in numpy (no random-number program to compile): networks of
    N(0, 0.3^2) weights, each its own draw (targets apart from their networks), optimizer
    moments zero; stacked over `members` where given."""
    rng, shapes = np.random.default_rng(seed), init_shapes(agent)
    lead = () if members is None else (members,)
    weights = lambda s: (0.3 * rng.standard_normal((*lead, *s.shape))).astype(s.dtype)
    zeros = lambda tree: jax.tree.map(lambda s: np.zeros((*lead, *s.shape), s.dtype), tree)
    networks = ("actor", "critic", "target_actor", "target_critic")
    random = {name: jax.tree.map(weights, getattr(shapes, name)) for name in networks}
    return zeros(shapes)._replace(**random)


def test_the_options_are_off_by_default():
    defaults = {name: getattr(TD3Config(), name) for name in FASTTD3}
    off = {"target_actor": True, "target_critic_every_step": False, "actor_q": "first"}
    unset = {"exploration_std_min": None, "actor_output_init_std": None}
    assert defaults == {**off, **unset, "weight_decay": 0.0, "network": "mlp"}
    assert {name: load_config(None, []).agent[name] for name in FASTTD3} == defaults
    agent = tiny_agent("td3")
    state = init_shapes(agent)
    assert state.target_actor is not None and not agent.episode_draws
    assert isinstance(state.actor_opt, optax.ScaleByAdamState)  # Adam's state, no decay
    assert set(state.actor["params"]) == {"MLP_0"}
    assert init_shapes(tiny_agent("td3", target_actor=False)).target_actor is None


def test_without_a_target_actor_the_targets_come_from_the_online_actor():
    td3, fast = tiny_agent("td3"), tiny_agent("td3", target_actor=False)
    hparams, batch = td3.default_hparams(), flagged_batch("td3", False, False)
    noise = np.random.default_rng(1).standard_normal(batch.action.shape).astype(np.float32)
    state = random_state(td3)

    @jax.jit
    def losses(state):
        loss = lambda agent, s: agent.internals.critic_loss(s.critic, s, batch, hparams, noise)[0]
        return (
            loss(fast, state._replace(target_actor=None)),
            loss(td3, state._replace(target_actor=state.actor)),  # as tau = 1 keeps it
            loss(td3, state),  # the target actor apart
        )

    fast_loss, td3_with_the_actor, td3_behind = losses(state)
    np.testing.assert_allclose(fast_loss, td3_with_the_actor, rtol=1e-6)
    assert not np.isclose(fast_loss, td3_behind)


def test_target_critics_after_every_critic_step_are_td3s_with_a_policy_delay_of_one():
    td3, fast = tiny_agent("td3"), tiny_agent("td3", target_critic_every_step=True)
    hparams, batch = td3.default_hparams(), flagged_batch("td3", False, False)
    noise = np.random.default_rng(1).standard_normal(batch.action.shape).astype(np.float32)

    @jax.jit
    def steps(state):
        (ours, _), (theirs, _) = (
            a.internals.critic_step(state, batch, hparams, noise) for a in (fast, td3)
        )
        due = jnp.bool_(True)
        stepped = [
            a.internals.actor_step(s, batch.obs, hparams, due)[0]
            for a, s in ((fast, ours), (td3, theirs))
        ]
        return state, ours, theirs, *stepped

    initial, critic_step, td3_critic_step, both_steps, td3_both_steps = steps(random_state(td3))
    # A critic step and an actor step (a delay of 1): the same targets, the same state.
    assert leaves_allclose(both_steps, td3_both_steps, atol=1e-7)
    # A critic step alone (a longer delay): only the option's target critic moves.
    assert not same(critic_step.target_critic, initial.target_critic)
    assert same(td3_critic_step.target_critic, initial.target_critic)


def test_the_actor_maximizes_the_smaller_q_of_the_two_critics():
    for options in ({}, TINY_OPTIONS["distributional"]):
        td3, fast = tiny_agent("td3", **options), tiny_agent("td3", actor_q="min", **options)
        twin = make_critic(TD3Config(hidden_sizes=(16, 16), **options))

        @jax.jit
        def losses(actor, critic, obs, td3=td3, fast=fast, twin=twin):
            actions = td3.internals.actor_apply(actor, obs)
            q = twin.q_values(twin.network.apply(critic, obs, actions))  # (B, 2): the means
            mins = fast.internals.actor_loss(actor, critic, obs)
            return mins, td3.internals.actor_loss(actor, critic, obs), q

        state = random_state(td3)
        obs = np.random.default_rng(5).standard_normal((64, 5)).astype(np.float32)
        mins, first, q = map(np.asarray, losses(state.actor, state.critic, obs))
        assert (q[:, 0] < q[:, 1]).any() and (q[:, 1] < q[:, 0]).any()  # each smaller somewhere
        np.testing.assert_allclose(mins, -q.min(axis=1).mean(), rtol=1e-5)
        np.testing.assert_allclose(first, -q[:, 0].mean(), rtol=1e-5)


def test_adamw_is_optaxs_and_without_weight_decay_adam():
    params = {"w": jnp.array([[0.5, -1.0], [2.0, 0.1]]), "b": jnp.array([0.3, -0.2])}

    @jax.jit
    def both(params):
        out = []
        for decay, reference in (
            (0.1, optax.adamw(1e-2, weight_decay=0.1)),
            (0.0, optax.adam(1e-2)),
        ):
            ours, theirs, optimizer = params, params, network_optimizer(decay)
            opt_state, their_state = optimizer.init(ours), reference.init(theirs)
            for i in range(3):
                grad = jax.tree.map(lambda p, i=i: jnp.sin(p * (i + 1)), ours)
                ours, opt_state = adam_step(ours, grad, opt_state, optimizer, 1e-2)
                updates, their_state = reference.update(grad, their_state, theirs)
                theirs = optax.apply_updates(theirs, updates)
            out.append((ours, theirs))
        return out

    for ours, theirs in both(params):
        assert leaves_allclose(ours, theirs, atol=1e-7)
    assert isinstance(network_optimizer(0.0).init(params), optax.ScaleByAdamState)
    sac = init_shapes(tiny_agent("sac", weight_decay=0.1))  # its temperature never decays
    assert isinstance(sac.alpha_opt, optax.ScaleByAdamState)
    assert not isinstance(sac.actor_opt, optax.ScaleByAdamState)


def test_a_residual_network_is_simbas_block_by_block_and_trains_every_layer():
    module = ResidualMLP((8, 8, 3))
    x = jax.random.normal(jax.random.key(0), (4, 5))

    @jax.jit
    def forward(x):
        params = module.init(jax.random.key(1), x)
        grads = jax.grad(lambda p: jnp.sum(jnp.square(module.apply(p, x))))(params)
        return params["params"], module.apply(params, x), grads

    params, output, grads = jax.tree.map(np.asarray, forward(x))
    shapes = jax.tree.map(np.shape, params)
    assert shapes["Dense_0"]["kernel"] == (5, 8)  # in: to the blocks' width
    assert [shapes[f"Dense_{i}"]["kernel"] for i in (1, 2, 3, 4)] == [(8, 32), (32, 8)] * 2
    assert shapes["Dense_5"]["kernel"] == (8, 3) and len(params) == 6 + 3  # and 3 LayerNorms

    def layer_norm(h, p):
        centered = h - h.mean(-1, keepdims=True)
        return centered / np.sqrt(h.var(-1, keepdims=True) + 1e-6) * p["scale"] + p["bias"]

    dense = lambda h, p: h @ p["kernel"] + p["bias"]
    h = dense(np.asarray(x), params["Dense_0"])
    for block in (0, 1):  # x + Dense(relu(Dense(LayerNorm(x))))
        inner = dense(layer_norm(h, params[f"LayerNorm_{block}"]), params[f"Dense_{2 * block + 1}"])
        h = h + dense(np.maximum(inner, 0.0), params[f"Dense_{2 * block + 2}"])
    expected = dense(layer_norm(h, params["LayerNorm_2"]), params["Dense_5"])
    np.testing.assert_allclose(output, expected, rtol=1e-4, atol=1e-5)
    assert all(np.any(leaf != 0.0) for leaf in jax.tree.leaves(grads["params"]))
    with pytest.raises(ValueError, match="must all be equal"):
        jax.eval_shape(ResidualMLP((8, 4, 3)).init, jax.random.key(1), x)


def test_the_actors_output_layer_starts_small_and_every_other_layer_as_before():
    """FastTD3's init_scale: the actor's output layer N(0, 0.01^2) with zero biases; the same
    key gives every other layer (and the critics) the parameters of TD3's default init."""
    for network in ("mlp", "residual"):
        plain = tiny_agent("td3", network=network, hidden_sizes=(64, 64))
        small = tiny_agent(
            "td3", network=network, hidden_sizes=(64, 64), actor_output_init_std=0.01
        )
        key, hparams = jax.random.key(3), plain.default_hparams()
        before, after = plain.init(key, hparams), small.init(key, hparams)
        torso = "MLP_0" if network == "mlp" else "ResidualMLP_0"
        layers_before, layers_after = before.actor["params"][torso], after.actor["params"][torso]
        dense = [name for name in layers_after if name.startswith("Dense_")]
        output = max(dense, key=lambda name: int(name.split("_")[1]))
        kernel = np.asarray(layers_after[output]["kernel"])
        assert kernel.shape == (64, 2) and 0.008 < kernel.std() < 0.012
        assert not np.asarray(layers_after[output]["bias"]).any()
        assert np.asarray(layers_before[output]["kernel"]).std() > 0.05  # flax's default
        others = {name: value for name, value in layers_after.items() if name != output}
        assert same(others, {name: layers_before[name] for name in others})
        assert same(after.critic, before.critic) and same(after.target_critic, before.target_critic)


def test_the_actors_own_widths_leave_the_critics_and_default_to_theirs():
    """FastTD3's actor is narrower than its critics (512-256-128 under 1024-512-256):
    agent.actor_hidden_sizes sets the actor's layers alone; unset, the actor is `hidden_sizes`'s
    (the same parameters as before the option)."""
    kernels = lambda tree: [tree[k]["kernel"].shape for k in sorted(tree)]
    for algo in ("td3", "sac"):
        same = init_shapes(tiny_agent(algo))
        assert same == init_shapes(tiny_agent(algo, actor_hidden_sizes=None))
        narrow = init_shapes(tiny_agent(algo, actor_hidden_sizes=(8, 4)))
        assert kernels(narrow.actor["params"]["MLP_0"])[:2] == [(5, 8), (8, 4)]
        assert narrow.critic == same.critic and narrow.actor != same.actor
    config = load_config(None, ["agent.actor_hidden_sizes=[32, 16]"])
    assert (
        config.agent["actor_hidden_sizes"] == (32, 16)
        and load_config(None, []).agent["actor_hidden_sizes"] is None
    )
    refusals = {
        "agent.actor_hidden_sizes=[0]": "agent.actor_hidden_sizes",
        "agent.actor_hidden_sizes=[8, 4]": "agent.actor_hidden_sizes: must be equal widths",
    }
    for override, message in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [override, "agent.network=residual", "agent.hidden_sizes=[8, 8]"])


def test_residual_agents_have_residual_actors_and_critics():
    options = {"network": "residual", **TINY_OPTIONS["distributional"]}
    for algo in ("td3", "sac"):
        state = init_shapes(tiny_agent(algo, **options))
        assert "ResidualMLP_0" in state.actor["params"]
        assert set(state.critic["params"]) == {"ResidualMLP_0", "ResidualMLP_1"}
    batch = flagged_batch("td3", False, False)
    twin = make_critic(TD3Config(hidden_sizes=(16, 16), **options))
    outputs = jax.eval_shape(twin.network.apply, state.critic, batch.obs, batch.action)
    assert outputs.shape == (8, 2, 11)
    # Its policies act through JAX: the collectors' numpy MLP has no LayerNorm.
    td3 = tiny_agent("td3", network="residual")
    actor = init_shapes(td3).actor
    stacked = jax.tree.map(lambda s: jax.ShapeDtypeStruct((1, *s.shape), s.dtype), actor)
    published = (stacked, population.broadcast_hparams(td3.default_hparams(), 1), np.int32(0))
    assert numpy_policy_for("td3", TINY_SPECS["td3"], published, 1, 1) is None


def test_the_config_takes_the_options_and_refuses_bad_values_naming_the_field():
    sets = [f"agent.{name}={str(value).lower()}" for name, value in FASTTD3.items()]
    config = load_config(None, [*sets, "agent.hidden_sizes=[64, 64]"])
    assert {name: config.agent[name] for name in FASTTD3} == FASTTD3
    refusals = {
        "agent.network=simba": "agent.network: must be one of mlp, residual, simbav2, got 'simba'",
        "agent.actor_q=mean": "agent.actor_q: must be one of first, min, got 'mean'",
        "agent.weight_decay=-0.1": "agent.weight_decay: must be >= 0",
        "agent.exploration_std_min=-1": "agent.exploration_std_min: must be >= 0",
        "agent.actor_output_init_std=-1": "agent.actor_output_init_std: must be >= 0",
        "agent.network=residual": "agent.hidden_sizes: must be equal widths with agent.network",
    }
    for override, message in refusals.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_config(None, [override, "agent.hidden_sizes=[64, 32]"])
    # CEM-RL's and DvD's shared critic learns from the members' target actors, on actor steps.
    shared = {"target_actor": "false", "target_critic_every_step": "true"}
    for name, value in shared.items():
        with pytest.raises(ConfigError, match=f"agent.{name}: strategy cemrl's shared critic"):
            load_config(CONFIGS / "td3_cemrl_hopper_cpu.yaml", [f"agent.{name}={value}"])


# --- per-episode exploration stds ---------------------------------------------------------------


def test_each_lanes_exploration_std_lies_between_std_min_and_exploration_noise():
    agent = tiny_agent("td3", exploration_std_min=0.05)
    hparams = agent.default_hparams()._replace(exploration_noise=jnp.float32(0.45))
    obs, key = 0.01 * jax.random.normal(jax.random.key(1), (4, 5)), jax.random.key(2)
    draws = jnp.array([0.0, 0.25, 0.5, 0.999])

    @jax.jit
    def acts(actor):
        explore = agent.act(actor, obs, key, hparams, True, 0, draws)
        return explore, agent.act(actor, obs, key, hparams, False, 0)  # greedy: no draws

    noisy, mean = acts(random_state(agent).actor)
    std = (0.05 + draws * (0.45 - 0.05)) * 2.0  # in units of the action half-range, 2
    expected = np.clip(mean + std[:, None] * jax.random.normal(key, (4, 2)), -2.0, 2.0)
    np.testing.assert_allclose(noisy, expected, rtol=1e-5, atol=1e-6)
    assert agent.episode_draws and not tiny_agent("td3").episode_draws
    with pytest.raises(ValueError, match="episode draws"):
        jax.eval_shape(lambda a: agent.act(a, obs, key, hparams, True, 0), init_shapes(agent).actor)


def test_device_lanes_draw_anew_at_each_episode_start_and_act_with_it():
    require("gymnax")
    env = make_device_env("gymnax/Pendulum-v1")
    agent = make_agent("td3", env.spec, hidden_sizes=(8,), exploration_std_min=0.05)
    hparams = population.broadcast_hparams(agent.default_hparams(), 2)
    lanes = EnvLanes(env, 6, jax.random.key(1), None, None, False, agent.episode_draws)
    assert lanes.shapes().episode_draw.shape == (6,)
    # 2 members x 3 lanes, one step per chunk, episodes of 3 steps and a reset step.
    members = device_rollout.MemberLanes(env, 3, agent, env.spec, lambda s: s.actor, 2, 3, 0, 1)

    states = random_state(agent, members=2)

    @jax.jit
    def chunks(key):
        lanes = device_rollout.with_episode_draws(device_rollout.init(env, key, 6))

        def one(lanes, step):
            chunk_key = jax.random.fold_in(key, step)
            lanes, rows = device_rollout.member_rollout(
                members, lanes, chunk_key, states, hparams, step
            )
            return lanes, (rows.autoreset[:, 0], lanes.episode_draw)

        return jax.lax.scan(one, lanes, jnp.arange(14))[1]

    resets, draws = map(np.asarray, chunks(jax.random.key(0)))  # (steps, lanes): after each
    changed = np.diff(draws, axis=0, prepend=0.0) != 0.0
    np.testing.assert_array_equal(changed, resets)  # made at the reset steps, held between
    assert resets[::4].all() and resets.sum() == 4 * 6
    assert np.all((draws >= 0.0) & (draws < 1.0)) and len(np.unique(draws[0])) == 6


class FixedDraws:
    """In place of the numpy generator: the uniforms given, in turn, and normals of 1 (the
    noise an action shows is then its std)."""

    def __init__(self, uniforms):
        self.uniforms = list(uniforms)

    def random(self, size, dtype):
        return np.asarray(self.uniforms.pop(0), dtype)

    def standard_normal(self, shape, dtype):
        return np.ones(shape, dtype)


def test_numpy_collectors_draw_each_slots_std_at_its_episode_starts():
    agent = tiny_agent("td3", exploration_std_min=0.1)
    hparams = population.broadcast_hparams(agent.default_hparams(), 2, exploration_noise=[0.5, 0.9])
    actor = random_state(agent, members=2).actor
    published = jax.tree.map(np.asarray, (actor, hparams, np.int32(0)))
    policy = numpy_policy_for("td3", TINY_SPECS["td3"], published, 2, 1, 0.1)
    first, second = [0.0, 0.5], [0.25, 0.75]
    acting = NumpyActing(policy, FixedDraws([first, second]))
    greedy = NumpyActing(policy._replace(exploration_std_min=None), FixedDraws([]))
    for actor_acting, noise in ((acting, hparams.exploration_noise), (greedy, np.zeros(2))):
        leaves = jax.tree.leaves((actor, hparams._replace(exploration_noise=noise), np.int32(0)))
        actor_acting.set_policy(*numpy_policy.slots_policy(policy, np.arange(2))(leaves))
    obs = np.zeros((2, 5), np.float32)
    std = lambda draws: ((0.1 + np.array(draws) * (np.array([0.5, 0.9]) - 0.1)) * 2.0)[:, None]
    mean = greedy(obs, 0)
    np.testing.assert_allclose(acting(obs, 0) - mean, np.broadcast_to(std(first), (2, 2)))
    np.testing.assert_allclose(acting(obs, 1, None) - mean, np.broadcast_to(std(first), (2, 2)))
    held = acting(obs, 2, np.array([False, True])) - mean  # slot 1's next episode starts
    np.testing.assert_allclose(held, np.broadcast_to(std([first[0], second[1]]), (2, 2)))


def test_jitted_collectors_keep_each_slots_draw_until_its_episode_starts():
    agent = tiny_agent("td3", exploration_std_min=0.1)
    hparams = population.broadcast_hparams(agent.default_hparams(), 3)
    acting = JaxActing(agent, 3, 1, jax.random.key(1))
    acting.set_policy(random_state(agent, members=3).actor, hparams)
    obs = np.zeros((3, 5), np.float32)
    acting(obs, 0)
    first = np.asarray(acting._draws)
    acting(obs, 1, np.zeros(3, bool))
    np.testing.assert_array_equal(acting._draws, first)
    acting(obs, 2, np.array([True, False, False]))
    after = np.asarray(acting._draws)
    assert after[0] != first[0] and np.array_equal(after[1:], first[1:])
    assert np.all((after >= 0.0) & (after < 1.0)) and len(np.unique(first)) == 3
