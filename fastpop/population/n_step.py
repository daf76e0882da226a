"""n-step windows of a replay lane: the rows a transition's return spans, inside jit.

A window starts at a sampled row and takes up to `n` consecutive rows of its lane. It stops
after a row that ends an episode (terminated or truncated: the next row is the reset step that
holds the final observation), and before a row that is not written yet or that starts an
episode without a reset step (a restarted collector's fresh stream), so it never reaches into
another episode. `steps` counts the rows taken (at least 1); the rewards past them are zero, so
that the return is the plain discounted sum (`agents.losses.n_step_return`). A window ended by
a termination drops the bootstrap; one ended by a truncation or cut short bootstraps from the
observation after its last row, discounted by `discount ** steps`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Window(NamedTuple):
    """Per transition of a batch: (B, n) rewards (zero past `steps`), (B,) steps taken, and the
    last row's flags and index (its successor holds the next observation)."""

    rewards: jax.Array
    steps: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    last_row: jax.Array


def window(rows, position, size, lane_capacity: int, lane, row, n: int, limit=None) -> Window:
    """The n-step windows starting at (`lane`, `row`), (B,) each, of one buffer whose ring
    holds `size` rows written up to `position` (exclusive). `limit`: a traced n of the member's
    own (its hparam `n_step`), clipped to 1..n; the window's shape stays n, the steps past it
    are not taken, exactly as if `n` were `limit` (None: n)."""
    offsets = jnp.arange(n)
    at = (row[:, None] + offsets) % lane_capacity  # (B, n): the rows a window may take
    lanes = lane[:, None]
    after = (at + 1) % lane_capacity
    oldest = (position - size) % lane_capacity
    # A row's successor is written when it is younger than the newest row.
    written = ((row - oldest) % lane_capacity)[:, None] + offsets + 1 < size
    ended = rows.terminated[lanes, at] | rows.truncated[lanes, at]
    usable = written & ~rows.episode_start[lanes, after]
    # Step k is taken when every step before it was taken and did not end its episode; the
    # first step always (the sampler drew a valid start).
    goes_on = jnp.concatenate([jnp.ones_like(ended[:, :1]), ~ended[:, :-1] & usable[:, 1:]], 1)
    if limit is not None:
        goes_on &= offsets < jnp.clip(limit, 1, n)
    taken = jnp.cumprod(goes_on, axis=1).astype(bool)
    steps = jnp.sum(taken, axis=1).astype(jnp.int32)
    last = jnp.take_along_axis(at, (steps - 1)[:, None], axis=1)[:, 0]
    return Window(
        rewards=jnp.where(taken, rows.reward[lanes, at], 0.0),
        steps=steps,
        terminated=rows.terminated[lane, last],
        truncated=rows.truncated[lane, last],
        last_row=last,
    )
