"""Per-transition losses of TD3, SAC and DQN, in the style of rlax's `value_learning`.

Every function here takes the arrays of ONE transition, after the agent has applied its
networks (Q-values, log-probabilities, the target actor's action), and returns a scalar. An
agent averages a batch with `jnp.mean(jax.vmap(loss)(...))`; a population adds one more vmap.
Per transition rather than per batch, so that the rank asserts say exactly what one example is
(a twin critic is shape (2,), a DQN head (num_actions,), a reward rank 0) and both the batch and
the population axis are added the same way; and so that each loss can be checked by hand on a
two-number example without building a network.

Targets are wrapped in `stop_gradient`: a critic is regressed onto a fixed target.

Time limits are not terminals: `terminated` is the only flag that stops the bootstrap. There is
deliberately no `truncated` argument: a transition cut by a time limit bootstraps like any other.
"""

from __future__ import annotations

from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

Scalar = chex.Numeric


def bootstrap_multiplier(discount: Scalar, terminated: chex.Array) -> chex.Array:
    """discount * (1 - terminated): what the next state's value is multiplied by."""
    chex.assert_rank([discount, terminated], 0)
    return discount * (1.0 - jnp.asarray(terminated).astype(jnp.float32))


def bootstrap_target(
    reward: chex.Array, discount: Scalar, terminated: chex.Array, next_value: chex.Array
) -> chex.Array:
    """reward + discount * next_value, dropping the bootstrap only where the episode terminated."""
    chex.assert_rank([reward, next_value], 0)
    bootstrap = bootstrap_multiplier(discount, terminated)
    return jax.lax.stop_gradient(reward + bootstrap * next_value)


def n_step_return(
    rewards: chex.Array, steps: chex.Array, discount: Scalar
) -> tuple[chex.Array, chex.Array]:
    """An n-step transition's discounted reward sum and its bootstrap's discount:
    sum_k discount**k * rewards[k] (the rewards past `steps` are zero) and discount**steps."""
    chex.assert_rank([rewards, steps, discount], [1, 0, 0])
    powers = discount ** jnp.arange(rewards.shape[0], dtype=jnp.float32)
    return jnp.sum(powers * rewards), discount ** steps.astype(jnp.float32)


def discounted_rewards(batch, discount: Scalar) -> tuple[chex.Array, chex.Array]:
    """(reward, discount), each (batch,), of a batch's transitions: one-step ones keep their
    reward and the member's discount, n-step ones (`batch.steps` given) `n_step_return`'s."""
    if batch.steps is None:
        return batch.reward, jnp.broadcast_to(discount, batch.reward.shape)
    return jax.vmap(n_step_return, in_axes=(0, 0, None))(batch.reward, batch.steps, discount)


def reward_rank(batch) -> int:
    """The rank of a batch's rewards: (batch,) one-step, (batch, n) n-step."""
    return 1 if batch.steps is None else 2


def td3_target_action(
    target_action: chex.Array,
    standard_normal: chex.Array,
    policy_noise: Scalar,
    noise_clip: Scalar,
    action_low: float,
    action_high: float,
) -> chex.Array:
    """Target policy smoothing (Fujimoto et al., 2018): the target actor's action plus clipped
    Gaussian noise, kept within the action bounds.

    `standard_normal` is an N(0, 1) draw of the action's shape; `policy_noise` (its std) and
    `noise_clip` are in units of the action half-range, as in TD3HParams.
    """
    chex.assert_rank([target_action, standard_normal, policy_noise, noise_clip], [1, 1, 0, 0])
    chex.assert_equal_shape([target_action, standard_normal])
    half_range = (action_high - action_low) / 2.0
    noise = jnp.clip(standard_normal * policy_noise, -noise_clip, noise_clip) * half_range
    return jnp.clip(target_action + noise, action_low, action_high)


def td3_critic_loss(
    q_values: chex.Array,
    reward: chex.Array,
    discount: Scalar,
    terminated: chex.Array,
    next_target_q_values: chex.Array,
) -> chex.Array:
    """Sum over the twin critics of the squared error to the clipped double-Q target.

    q_values: (2,) both critics at the stored (obs, action).
    next_target_q_values: (2,) both target critics at (next_obs, smoothed target action); the
    target bootstraps from their minimum.
    """
    chex.assert_shape([q_values, next_target_q_values], (2,))
    target = bootstrap_target(reward, discount, terminated, jnp.min(next_target_q_values))
    return jnp.sum(jnp.square(q_values - target))


def td3_actor_loss(q_values: chex.Array) -> chex.Array:
    """-Q1(obs, actor(obs)): the deterministic policy gradient follows the first critic only."""
    chex.assert_shape(q_values, (2,))
    return -q_values[0]


def td3_min_actor_loss(q_values: chex.Array) -> chex.Array:
    """-min(Q1, Q2)(obs, actor(obs)): FastTD3's actor, on the clipped double Q its critics'
    targets use (a distributional critic's q_values: each critic's mean)."""
    chex.assert_shape(q_values, (2,))
    return -jnp.min(q_values)


def sac_critic_loss(
    q_values: chex.Array,
    reward: chex.Array,
    discount: Scalar,
    terminated: chex.Array,
    next_target_q_values: chex.Array,
    next_log_prob: chex.Array,
    alpha: Scalar,
    reward_scale: Scalar,
) -> chex.Array:
    """Sum over the twin critics of the squared error to the soft clipped double-Q target.

    The next state's soft value is min(target Q1, Q2)(s', a') - alpha * log pi(a'|s') for an
    action a' sampled from the current policy; the reward is scaled by `reward_scale`.
    """
    chex.assert_shape([q_values, next_target_q_values], (2,))
    chex.assert_rank([next_log_prob, alpha, reward_scale], 0)
    next_value = jnp.min(next_target_q_values) - alpha * next_log_prob
    target = bootstrap_target(reward * reward_scale, discount, terminated, next_value)
    return jnp.sum(jnp.square(q_values - target))


def sac_actor_loss(q_values: chex.Array, log_prob: chex.Array, alpha: Scalar) -> chex.Array:
    """alpha * log pi(a|s) - min(Q1, Q2)(s, a) for a reparameterised action a ~ pi(s).

    `alpha` enters as a constant: the temperature has its own loss.
    """
    chex.assert_shape(q_values, (2,))
    chex.assert_rank([log_prob, alpha], 0)
    return alpha * log_prob - jnp.min(q_values)


def sac_temperature_loss(
    log_alpha: chex.Array, log_prob: chex.Array, target_entropy: Scalar
) -> chex.Array:
    """-log_alpha * (log pi(a|s) + target_entropy), the policy term held constant.

    Its gradient raises alpha while the policy's entropy (-log pi) is below the target, and
    lowers it above. Learned in log space so alpha stays positive.
    """
    chex.assert_rank([log_alpha, log_prob, target_entropy], 0)
    return -(log_alpha * jax.lax.stop_gradient(log_prob + target_entropy))


def dqn_loss(
    q_values: chex.Array,
    action: chex.Array,
    reward: chex.Array,
    discount: Scalar,
    terminated: chex.Array,
    next_target_q_values: chex.Array,
    next_selector_q_values: chex.Array,
    huber_delta: float = 1.0,
) -> chex.Array:
    """Huber loss of Q(s, a) against r + discount * Q_target(s', argmax Q_selector(s', .)).

    Double DQN (van Hasselt et al., 2016) passes the online network's next-state values as the
    selector; plain DQN passes the target network's values for both (the max of the target).
    """
    chex.assert_rank([q_values, action, next_target_q_values, next_selector_q_values], [1, 0, 1, 1])
    chex.assert_type(action, int)
    chex.assert_equal_shape([q_values, next_target_q_values, next_selector_q_values])
    next_q = next_target_q_values[jnp.argmax(next_selector_q_values)]
    target = bootstrap_target(reward, discount, terminated, next_q)
    return optax.losses.huber_loss(q_values[action], target, delta=huber_delta)


# --- distributional (C51) critics ----------------------------------------------------------------
#
# A distributional critic (Bellemare et al., 2017, as FastTD3 uses it) outputs, per twin, logits
# over `num_atoms` fixed returns `support` (evenly spaced from v_min to v_max); its Q is the mean
# of that distribution. Its target is the target critic's next-state distribution moved to
# reward + bootstrap * z and projected back onto the support. These losses take the per-example
# `bootstrap` multiplier (discount * (1 - terminated) for one step; discount**n * (1 -
# terminated) for an n-step return, whose discounted reward sum is then `reward`), not the
# discount and the flag.


class MemberSupport(NamedTuple):
    """A member's own support (its hparams v_min and v_max, traced: PBT may change them without
    recompiling), in place of the agent's constant one: its atoms and the grid that
    `categorical_projection` reads, in float32 (`member_support`)."""

    atoms: jax.Array  # (num_atoms,) returns, evenly spaced from v_min to v_max
    v_min: jax.Array
    atoms_per_unit: jax.Array  # (num_atoms - 1) / (v_max - v_min)


def member_support(v_min, v_max, num_atoms: int) -> MemberSupport:
    """The support of `num_atoms` returns from `v_min` to `v_max` (traced scalars)."""
    v_min, v_max = jnp.asarray(v_min, jnp.float32), jnp.asarray(v_max, jnp.float32)
    # Atom i at v_min + i * spacing, as numpy's linspace makes the constant support: where the
    # spacing is a float32 number (20 / 10, 500 / 100), the same atoms bit for bit.
    spacing = (v_max - v_min) / (num_atoms - 1)
    atoms = v_min + jnp.arange(num_atoms, dtype=jnp.float32) * spacing
    return MemberSupport(atoms.at[-1].set(v_max), v_min, (num_atoms - 1) / (v_max - v_min))


def support_atoms(support) -> chex.Array:
    """The returns of a support: a constant (num_atoms,) array, or a `MemberSupport`'s atoms."""
    return support.atoms if isinstance(support, MemberSupport) else support


def categorical_mean(logits: chex.Array, support) -> chex.Array:
    """The mean of the distributions of `logits` (any leading axes, atoms last) over `support`
    (constant or a `MemberSupport`): a distributional critic's Q."""
    atoms = support_atoms(support)
    chex.assert_rank(atoms, 1)
    chex.assert_axis_dimension(logits, -1, atoms.shape[0])
    return jnp.sum(jax.nn.softmax(logits, axis=-1) * atoms, axis=-1)


def support_grid(support) -> tuple[float, float]:
    """v_min and the atoms per unit of return of `support` (evenly spaced, increasing), in double
    precision, from its ends: a constant of the agent, never a traced value. The float32
    spacing support[1] - support[0] is off by up to half an ulp of the atoms it was taken from:
    0.4 (51 atoms on [-10, 10]) put every position up to 5e-5 of a spacing off, moving that
    much of the mass to a neighbour and splitting an atom at 0.0 between two points."""
    try:
        ends = np.asarray(support, np.float64)[[0, -1]]
    except jax.errors.TracerArrayConversionError as error:
        raise TypeError(
            "a distributional critic's support must be a constant (a numpy array), not a "
            "traced value: close over it instead of passing it through jit or vmap"
        ) from error
    v_min, v_max = float(ends[0]), float(ends[1])
    return v_min, (len(support) - 1) / (v_max - v_min)


def categorical_projection(atoms: chex.Array, probs: chex.Array, support) -> chex.Array:
    """The distribution with mass probs[i] at atoms[i], projected onto `support` (evenly spaced,
    increasing; a constant, whose grid `support_grid` reads in double precision, or a
    `MemberSupport`, whose grid is float32): each atom is clipped to [support[0], support[-1]]
    and its mass split between the two support points around it, in proportion to its
    closeness to each (Bellemare et al., 2017, eq. 7); an atom on a support point gives it all
    its mass.

    A scatter-add of 2 * len(atoms) masses: the same numbers as the dense form sum_i probs[i] *
    max(0, 1 - |clip(atoms[i]) - support[j]| / spacing) (rlax's), a tenth of its time on a CPU
    at 101 atoms (len(atoms) * len(support) products).
    """
    points = support_atoms(support)
    chex.assert_rank([atoms, probs, points], 1)
    chex.assert_equal_shape([atoms, probs])
    last = points.shape[0] - 1
    if isinstance(support, MemberSupport):
        v_min, atoms_per_unit = support.v_min, support.atoms_per_unit
    else:
        v_min, atoms_per_unit = support_grid(support)
    # (atom - v_min) * (num_atoms - 1) / (v_max - v_min), the ratio rounded to float32 once;
    # clipped as positions, so that rounding never puts an index past either end.
    position = jnp.clip((atoms - v_min) * atoms_per_unit, 0.0, last)
    lower, upper = jnp.floor(position), jnp.ceil(position)
    # On a support point lower == upper: all the mass goes there, through `to_lower`.
    to_lower = probs * (upper - position + (lower == upper))
    to_upper = probs * (position - lower)
    projected = jnp.zeros(points.shape, probs.dtype).at[lower.astype(jnp.int32)].add(to_lower)
    return projected.at[upper.astype(jnp.int32)].add(to_upper)


def categorical_target(
    reward: chex.Array,
    bootstrap: chex.Array,
    next_probs: chex.Array,
    support,
    next_shift: chex.Array = 0.0,
) -> chex.Array:
    """The projection of reward + bootstrap * (Z' + next_shift), Z' of `next_probs` on
    `support`, held constant. `next_shift` moves every next-state atom alike (SAC: -alpha *
    log pi(a'|s'), the soft value's entropy term)."""
    points = support_atoms(support)
    chex.assert_rank([reward, bootstrap, next_probs, points, next_shift], [0, 0, 1, 1, 0])
    atoms = reward + bootstrap * (points + next_shift)
    return jax.lax.stop_gradient(categorical_projection(atoms, next_probs, support))


def categorical_twin_critic_loss(
    logits: chex.Array,
    reward: chex.Array,
    bootstrap: chex.Array,
    next_target_logits: chex.Array,
    support: chex.Array,
    next_shift: chex.Array = 0.0,
) -> chex.Array:
    """Sum over the twin critics of the cross-entropy of each one's distribution (`logits`,
    (2, num_atoms)) against ONE projected target: of the two target critics' projected
    distributions, the one whose mean is the smaller (clipped double Q, the distribution kept
    whole), the second where they tie: FastTD3's choice.

    Projected first, then compared: the clipping to [v_min, v_max] can reverse the order of the
    means (mass clipped up at v_min raises a mean, mass clipped down at v_max lowers it).
    """
    chex.assert_rank([logits, next_target_logits], 2)
    chex.assert_equal_shape([logits, next_target_logits])
    points = support_atoms(support)
    chex.assert_shape(logits, (2, points.shape[0]))
    next_probs = jax.nn.softmax(next_target_logits, axis=-1)
    # The support closed over, not mapped: a constant (`support_grid`) or the member's own.
    project = jax.vmap(
        lambda probs: categorical_target(reward, bootstrap, probs, support, next_shift)
    )
    targets = project(next_probs)
    means = targets @ points
    target = jnp.where(means[0] < means[1], targets[0], targets[1])
    return jnp.sum(optax.softmax_cross_entropy(logits, target[None, :]))


def td3_distributional_critic_loss(
    logits: chex.Array,
    reward: chex.Array,
    bootstrap: chex.Array,
    next_target_logits: chex.Array,
    support: chex.Array,
) -> chex.Array:
    """TD3's critic loss for distributional twin critics: `categorical_twin_critic_loss` of the
    target critics at (next_obs, smoothed target action).

    logits: (2, num_atoms) both critics at the stored (obs, action); next_target_logits: (2,
    num_atoms); reward, bootstrap: scalars (`bootstrap_multiplier`); support: (num_atoms,).
    """
    return categorical_twin_critic_loss(logits, reward, bootstrap, next_target_logits, support)


def sac_distributional_critic_loss(
    logits: chex.Array,
    reward: chex.Array,
    bootstrap: chex.Array,
    next_target_logits: chex.Array,
    next_log_prob: chex.Array,
    alpha: Scalar,
    reward_scale: Scalar,
    support: chex.Array,
) -> chex.Array:
    """SAC's critic loss for distributional twin critics: the soft value's entropy term shifts
    the next-state distribution, reward_scale * reward + bootstrap * (Z' - alpha * log pi(a'|s'))
    projected, for both target critics' Z' at (next_obs, a' ~ pi), the projection of smaller
    mean taken (`categorical_twin_critic_loss`).

    Shapes as `td3_distributional_critic_loss`; next_log_prob, alpha, reward_scale: scalars.
    """
    chex.assert_rank([next_log_prob, alpha, reward_scale], 0)
    shift = -alpha * next_log_prob
    scaled = reward * reward_scale
    return categorical_twin_critic_loss(
        logits, scaled, bootstrap, next_target_logits, support, shift
    )
