"""Per-transition losses against hand-computed numbers; vmap (batch, members) equals a loop;
terminated masks the bootstrap and truncated does not, in the losses and in the agents."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.agents import losses
from fastpop.agents.base import polyak, select_tree
from fastpop.types import Transition
from tests.helpers import TINY_OPTIONS, TINY_SPECS, tiny_agent

f32 = jnp.float32


def close(actual, expected, rtol=1e-6, atol=1e-6):
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol, atol=atol)


# --- hand-computed examples -------------------------------------------------------------------


@pytest.mark.parametrize(("terminated", "expected"), [(False, 0.5 + 0.9 * 3.0), (True, 0.5)])
def test_bootstrap_target_masks_only_terminated(terminated, expected):
    close(losses.bootstrap_target(f32(0.5), f32(0.9), jnp.bool_(terminated), f32(3.0)), expected)


def test_bootstrap_target_stops_gradients():
    grads = jax.grad(losses.bootstrap_target, argnums=(0, 3))(f32(0.5), f32(0.9), False, f32(3.0))
    assert grads == (0.0, 0.0)


def test_td3_target_action_clips_noise_then_action():
    # Half range 2: noise [0.2, -0.6] is clipped to [0.2, -0.5], scaled to [0.4, -1.0], and
    # the second smoothed action, -1.9 - 1.0 = -2.9, is clipped to the bound -2.
    action = losses.td3_target_action(
        jnp.array([0.5, -1.9]), jnp.array([1.0, -3.0]), f32(0.2), f32(0.5), -2.0, 2.0
    )
    close(action, [0.9, -2.0])


@pytest.mark.parametrize(
    ("terminated", "target"), [(False, 0.5 + 0.9 * 3.0), (True, 0.5)], ids=["bootstrap", "end"]
)
def test_td3_critic_loss_by_hand(terminated, target):
    q, next_q = jnp.array([1.0, 2.0]), jnp.array([3.0, 4.0])  # min(next_q) = 3
    args = (f32(0.5), f32(0.9), jnp.bool_(terminated))
    loss = losses.td3_critic_loss(q, *args, next_q)
    close(loss, (1.0 - target) ** 2 + (2.0 - target) ** 2)
    q_grad, next_q_grad = jax.grad(
        lambda q, n: losses.td3_critic_loss(q, *args, n), argnums=(0, 1)
    )(q, next_q)
    close(q_grad, [2 * (1.0 - target), 2 * (2.0 - target)])
    close(next_q_grad, [0.0, 0.0])  # the target is a constant


def test_td3_critic_loss_takes_the_smaller_target_critic():
    low_first = losses.td3_critic_loss(jnp.zeros(2), f32(0.0), f32(1.0), False, jnp.array([1, 5.0]))
    low_second = losses.td3_critic_loss(
        jnp.zeros(2), f32(0.0), f32(1.0), False, jnp.array([5, 1.0])
    )
    close(low_first, 2.0)
    close(low_second, 2.0)


def test_td3_actor_loss_follows_the_first_critic_only():
    q = jnp.array([1.5, -3.0])
    close(losses.td3_actor_loss(q), -1.5)
    close(jax.grad(losses.td3_actor_loss)(q), [-1.0, 0.0])


@pytest.mark.parametrize(
    ("terminated", "target"),
    # reward 0.5 scaled by 2; soft value min(3, 4) - 0.2 * (-1) = 3.2
    [(False, 1.0 + 0.9 * 3.2), (True, 1.0)],
    ids=["bootstrap", "end"],
)
def test_sac_critic_loss_by_hand(terminated, target):
    loss = losses.sac_critic_loss(
        jnp.array([1.0, 2.0]),
        f32(0.5),
        f32(0.9),
        jnp.bool_(terminated),
        jnp.array([4.0, 3.0]),
        next_log_prob=f32(-1.0),
        alpha=f32(0.2),
        reward_scale=f32(2.0),
    )
    close(loss, (1.0 - target) ** 2 + (2.0 - target) ** 2, rtol=1e-6)


def test_sac_actor_loss_by_hand():
    q, log_prob, alpha = jnp.array([1.0, 3.0]), f32(-2.0), f32(0.5)
    close(losses.sac_actor_loss(q, log_prob, alpha), 0.5 * -2.0 - 1.0)
    q_grad, log_prob_grad = jax.grad(losses.sac_actor_loss, argnums=(0, 1))(q, log_prob, alpha)
    close(q_grad, [-1.0, 0.0])  # the smaller critic
    close(log_prob_grad, 0.5)


@pytest.mark.parametrize(
    ("log_prob", "alpha_moves"),
    # entropy -log_prob = -1 above the target -2: alpha shrinks; entropy -3 below it: alpha grows
    [(1.0, "down"), (3.0, "up")],
)
def test_sac_temperature_loss_by_hand(log_prob, alpha_moves):
    log_alpha, target_entropy = f32(math.log(0.5)), f32(-2.0)
    loss = losses.sac_temperature_loss(log_alpha, f32(log_prob), target_entropy)
    close(loss, -math.log(0.5) * (log_prob - 2.0))
    alpha_grad, log_prob_grad = jax.grad(losses.sac_temperature_loss, argnums=(0, 1))(
        log_alpha, f32(log_prob), target_entropy
    )
    close(alpha_grad, -(log_prob - 2.0))
    close(log_prob_grad, 0.0)
    # Gradient descent on log_alpha moves alpha the way the entropy gap asks.
    assert (alpha_grad < 0) == (alpha_moves == "up")


@pytest.mark.parametrize(
    ("selector", "terminated", "delta", "expected"),
    [
        # double: online argmax is action 1, target value 4 -> target 1 + 0.5 * 4 = 3, error 0.5
        ("online", False, 1.0, 0.5 * 0.5**2),
        # plain: target argmax is action 0, value 10 -> target 6, error 3.5 (linear part)
        ("target", False, 1.0, 3.5 - 0.5),
        ("target", False, 2.0, 2.0 * (3.5 - 1.0)),
        # terminated: target 1, error 1.5
        ("online", True, 1.0, 1.5 - 0.5),
        ("online", True, 2.0, 0.5 * 1.5**2),
    ],
)
def test_dqn_loss_by_hand(selector, terminated, delta, expected):
    next_target_q, next_online_q = jnp.array([10.0, 4.0, 6.0]), jnp.array([0.0, 5.0, 1.0])
    loss = losses.dqn_loss(
        jnp.array([1.0, 2.5, 0.0]),
        jnp.int32(1),
        f32(1.0),
        f32(0.5),
        jnp.bool_(terminated),
        next_target_q,
        next_online_q if selector == "online" else next_target_q,
        huber_delta=delta,
    )
    close(loss, expected)


def test_losses_reject_wrong_ranks():
    with pytest.raises(AssertionError):
        losses.td3_critic_loss(
            jnp.zeros((4, 2)), jnp.zeros(4), f32(0.9), jnp.zeros(4), jnp.zeros(2)
        )
    with pytest.raises(AssertionError):  # three critics are not a twin
        losses.td3_actor_loss(jnp.zeros(3))
    with pytest.raises(AssertionError):  # a float action index
        losses.dqn_loss(jnp.zeros(3), f32(1), f32(0), f32(1), False, jnp.zeros(3), jnp.zeros(3))


# --- vmap over (members, batch) equals the per-transition loop ----------------------------------

MEMBERS, BATCH, ATOMS = 3, 4, 5
# A distributional critic's support is a constant of the agent, the same for every member
# (`losses.support_grid`): closed over, not an input.
SUPPORT = np.linspace(-2.0, 2.0, ATOMS, dtype=np.float32)


def random_inputs(seed):
    """Per-transition arrays shaped (MEMBERS, BATCH, ...) and per-member scalars (MEMBERS,)."""
    rng = np.random.default_rng(seed)

    def normal(*shape):
        return jnp.asarray(rng.normal(size=(MEMBERS, *shape)), jnp.float32)

    return {
        "q2": normal(BATCH, 2),
        "next_q2": normal(BATCH, 2),
        "q3": normal(BATCH, 3),
        "next_q3": normal(BATCH, 3),
        "selector_q3": normal(BATCH, 3),
        "action3": jnp.asarray(rng.integers(0, 3, size=(MEMBERS, BATCH)), jnp.int32),
        "action2": jnp.tanh(normal(BATCH, 2)) * 2.0,
        "noise2": normal(BATCH, 2),
        "reward": normal(BATCH),
        "log_prob": normal(BATCH),
        "terminated": jnp.asarray(rng.random((MEMBERS, BATCH)) < 0.5),
        "discount": jnp.asarray(rng.uniform(0.9, 0.999, MEMBERS), jnp.float32),
        "alpha": jnp.asarray(rng.uniform(0.05, 0.5, MEMBERS), jnp.float32),
        "scale": jnp.asarray(rng.uniform(0.1, 5.0, MEMBERS), jnp.float32),
        "log_alpha": jnp.asarray(rng.normal(size=MEMBERS), jnp.float32),
        "logits": normal(BATCH, 2, ATOMS),
        "next_logits": normal(BATCH, 2, ATOMS),
        "bootstrap": jnp.asarray(rng.uniform(0.0, 0.99, (MEMBERS, BATCH)), jnp.float32),
    }


# name -> (loss, input names, whether each is per transition (else per member))
VMAP_CASES = {
    "td3_target_action": (
        lambda a, n, s, c: losses.td3_target_action(a, n, s, c, -2.0, 2.0),
        [("action2", True), ("noise2", True), ("alpha", False), ("scale", False)],
    ),
    "td3_critic": (
        losses.td3_critic_loss,
        [
            ("q2", True),
            ("reward", True),
            ("discount", False),
            ("terminated", True),
            ("next_q2", True),
        ],
    ),
    "td3_actor": (losses.td3_actor_loss, [("q2", True)]),
    "sac_critic": (
        losses.sac_critic_loss,
        [
            ("q2", True),
            ("reward", True),
            ("discount", False),
            ("terminated", True),
            ("next_q2", True),
            ("log_prob", True),
            ("alpha", False),
            ("scale", False),
        ],
    ),
    "sac_actor": (losses.sac_actor_loss, [("q2", True), ("log_prob", True), ("alpha", False)]),
    "sac_temperature": (
        losses.sac_temperature_loss,
        [("log_alpha", False), ("log_prob", True), ("discount", False)],
    ),
    "td3_distributional_critic": (
        lambda *args: losses.td3_distributional_critic_loss(*args, SUPPORT),
        [("logits", True), ("reward", True), ("bootstrap", True), ("next_logits", True)],
    ),
    "sac_distributional_critic": (
        lambda *args: losses.sac_distributional_critic_loss(*args, SUPPORT),
        [
            ("logits", True),
            ("reward", True),
            ("bootstrap", True),
            ("next_logits", True),
            ("log_prob", True),
            ("alpha", False),
            ("scale", False),
        ],
    ),
    "dqn": (
        losses.dqn_loss,
        [
            ("q3", True),
            ("action3", True),
            ("reward", True),
            ("discount", False),
            ("terminated", True),
            ("next_q3", True),
            ("selector_q3", True),
        ],
    ),
}


def one_transition(args, inputs, member, row):
    return [
        arg[member, row] if per_transition else arg[member]
        for arg, (_, per_transition) in zip(args, inputs, strict=True)
    ]


@pytest.mark.parametrize("case", sorted(VMAP_CASES))
def test_vmap_over_members_and_batch_equals_loop(case):
    loss, inputs = VMAP_CASES[case]
    values = random_inputs(seed=len(case))
    args = [values[name] for name, _ in inputs]
    batch_axes = tuple(0 if per_transition else None for _, per_transition in inputs)
    batched = jax.jit(jax.vmap(jax.vmap(loss, in_axes=batch_axes)))(*args)
    looped = np.asarray(
        [
            [loss(*one_transition(args, inputs, member, row)) for row in range(BATCH)]
            for member in range(MEMBERS)
        ]
    )
    chex.assert_trees_all_close(batched, jnp.asarray(looped), rtol=1e-6, atol=1e-6)
    # Real inputs, not a degenerate all-zero example.
    assert np.unique(np.asarray(batched).round(4)).size > MEMBERS


# --- the agents: truncated never changes a loss, terminated does --------------------------------


def flagged_batch(name, terminated, truncated, batch_size=8, seed=0):
    spec = TINY_SPECS[name]
    keys = jax.random.split(jax.random.key(seed), 4)
    if spec.discrete:
        action = jax.random.randint(keys[1], (batch_size,), 0, spec.num_actions)
    else:
        action = jax.random.uniform(keys[1], (batch_size, spec.action_dim), minval=-2, maxval=2)
    flags = jnp.arange(batch_size) % 2 == 0  # half the rows carry the flag
    return Transition(
        obs=jax.random.normal(keys[0], (batch_size, *spec.obs_shape)),
        action=action,
        reward=jax.random.normal(keys[2], (batch_size,)),
        next_obs=jax.random.normal(keys[3], (batch_size, *spec.obs_shape)),
        terminated=flags & terminated,
        truncated=flags & truncated,
    )


@pytest.mark.parametrize(
    ("name", "metric", "options"),
    [
        ("td3", "critic_loss", None),
        ("sac", "critic_loss", None),
        ("dqn", "loss", None),
        ("td3", "critic_loss", "distributional"),
        ("sac", "critic_loss", "distributional"),
        ("dqn", "loss", "dueling"),
    ],
)
def test_agents_bootstrap_through_truncation_not_termination(name, metric, options):
    agent = tiny_agent(name, **TINY_OPTIONS.get(options, {}))
    hparams = agent.default_hparams()
    state = agent.init(jax.random.key(3), hparams)
    update = jax.jit(agent.update)

    def loss_of(terminated, truncated):
        batch = flagged_batch(name, terminated, truncated)
        return float(update(state, batch, hparams, jax.random.key(4))[1][metric])

    plain = loss_of(terminated=False, truncated=False)
    assert loss_of(terminated=False, truncated=True) == plain
    assert abs(loss_of(terminated=True, truncated=False) - plain) > 1e-4


# --- base: Polyak averaging and tree selection --------------------------------------------------


def test_polyak_moves_target_tau_of_the_way_to_online():
    target = {"w": jnp.array([1.0, -2.0]), "b": f32(0.0)}
    online = {"w": jnp.array([3.0, 2.0]), "b": f32(4.0)}
    averaged = polyak(target, online, f32(0.25))
    close(averaged["w"], [1.5, -1.0])
    close(averaged["b"], 1.0)
    # Per-member tau under vmap, as a population applies it.
    taus = jnp.array([0.0, 0.5, 1.0])
    stacked = jax.vmap(polyak, in_axes=(None, None, 0))(target, online, taus)
    close(stacked["w"], [[1.0, -2.0], [2.0, 0.0], [3.0, 2.0]])


def test_select_tree_per_member():
    on_true, on_false = {"w": jnp.ones((3, 2))}, {"w": jnp.zeros((3, 2))}
    chosen = jax.vmap(select_tree)(jnp.array([True, False, True]), on_true, on_false)
    close(chosen["w"], [[1, 1], [0, 0], [1, 1]])
