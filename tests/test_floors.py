"""fastpop.bench.floors: the one floor of a population step (issue 58, item 2), pinned.

floor = max(FLOPs at the compute dtype's matmul rate, parameter-state bytes at the measured
bandwidth); XLA's bytes accessed sit beside it and never move the verdict."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

from fastpop.bench import floors
from tests.helpers import TINY_SPECS, tiny_agent


def linear_layers(sizes) -> int:
    """Parameters of dense layers of these widths (weights and biases)."""
    return sum(n_in * n_out + n_out for n_in, n_out in itertools.pairwise(sizes))


def test_td3_state_bytes_count_each_tree_as_its_steps_run():
    """TD3 (16-16 networks): the critic's parameters, gradients and Adam moments every step,
    the actor's and the targets' writes on 1 / policy_delay of the steps, the targets read
    every step. Counted by hand from the layer widths."""
    agent = tiny_agent("td3")
    hparams = agent.default_hparams()
    spec = TINY_SPECS["td3"]
    obs, act = spec.obs_shape[0], spec.action_dim
    actor = 4 * linear_layers([obs, 16, 16, act])
    critic = 4 * 2 * linear_layers([obs + act, 16, 16, 1])  # twin critics
    delay = int(hparams.policy_delay)
    assert delay == 2
    # Adam's two moments are as large as the parameters (its step count: 4 bytes more)
    optimised = lambda n: 4 * n + 2 * (2 * n + 4)
    expected = optimised(critic) + optimised(actor) / delay
    expected += (actor + critic) + (actor + critic) / delay  # targets: read, written
    assert floors.state_bytes_per_update(agent, hparams) == pytest.approx(expected)
    # every step delayed-free: the actor and targets written every step
    every = floors.state_bytes_per_update(agent, hparams._replace(policy_delay=np.int32(1)))
    assert every == pytest.approx(optimised(critic) + optimised(actor) + 2 * (actor + critic))
    # FastTD3's option: the target critics written after every critic step, not delayed
    fast = tiny_agent("td3", target_critic_every_step=True)
    written_each_step = expected + critic - critic / delay
    assert floors.state_bytes_per_update(fast, hparams) == pytest.approx(written_each_step)


def test_sac_and_dqn_state_bytes_are_read_from_their_shapes():
    sac = tiny_agent("sac")
    hparams = sac.default_hparams()
    state = jax.eval_shape(sac.init, jax.random.key(0), hparams)
    trees = {name: floors.tree_bytes(getattr(state, name)) for name in state._fields}
    expected = sum(
        4 * trees[tree] + 2 * trees[moments]
        for tree, moments in (("critic", "critic_opt"), ("actor", "actor_opt"))
    )
    expected += 4 * trees["log_alpha"] + 2 * trees["alpha_opt"] + 2 * trees["target_critic"]
    assert floors.state_bytes_per_update(sac, hparams) == pytest.approx(expected)
    dqn = tiny_agent("dqn")
    assert floors.state_bytes_per_update(dqn, dqn.default_hparams()) > 0


def row(**fields) -> dict:
    base = {
        "impl": "vectorized",
        "population": 10,
        "seconds_per_call": 0.01,  # 10 steps: 1 ms a step
        "flops_per_update": 2e6,
        "state_bytes_per_update": 5e5,
        "bytes_per_update": 4e6,
        "kernels_per_update_step": 50.0,
    }
    return base | fields


RATES = {"matmul_gflops_per_s": 100_000.0, "memory_gbps": 1000.0}


def test_the_floor_is_the_larger_term_and_xla_bytes_are_not_judged():
    rows = [row(), row(state_bytes_per_update=1e3), {"impl": "sequential", "population": 10}]
    floors.add_floors(rows, RATES, steps=10)
    state_bound, matmul_bound, sequential = rows
    # 10 members x 5e5 bytes at 1e12 B/s = 5 us; 10 x 2e6 FLOPs at 1e14 FLOP/s = 0.2 us
    assert state_bound["state_floor_seconds"] == pytest.approx(5e-6)
    assert state_bound["compute_floor_seconds"] == pytest.approx(2e-7)
    assert state_bound["floor_seconds"] == pytest.approx(5e-6)
    assert state_bound["floor_bound"] == "state traffic"
    assert state_bound["times_floor"] == pytest.approx(1e-3 / 5e-6)
    # XLA's 4e6 bytes a member (40 us) is printed, never the floor
    assert state_bound["xla_bytes_seconds"] == pytest.approx(4e-5)
    assert matmul_bound["floor_seconds"] == pytest.approx(2e-7)
    assert matmul_bound["floor_bound"] == "matmul"
    assert matmul_bound["times_floor"] == pytest.approx(1e-3 / 2e-7)
    assert matmul_bound["matmul_rate_fraction"] == pytest.approx(2e-7 / 1e-3)
    assert "times_floor" not in sequential


def test_a_bfloat16_row_is_judged_at_the_bfloat16_matmul_rate():
    rates = RATES | {"matmul_gflops_per_s_bfloat16": 400_000.0}
    rows = [
        row(state_bytes_per_update=1.0, compute_dtype="bfloat16"),
        row(state_bytes_per_update=1.0),
    ]
    floors.add_floors(rows, rates, steps=10)
    assert rows[0]["floor_seconds"] == pytest.approx(rows[1]["floor_seconds"] / 4)
    assert rows[0]["matmul_peak_gflops_per_s"] == 400_000.0
    # without a bfloat16 rate measured, the default precision's stands in
    fallback = [row(state_bytes_per_update=1.0, compute_dtype="bfloat16")]
    floors.add_floors(fallback, RATES, steps=10)
    assert fallback[0]["floor_seconds"] == pytest.approx(rows[1]["floor_seconds"])


def test_an_unknown_algorithm_is_named():
    agent = tiny_agent("td3")._replace(name="ppo")
    with pytest.raises(ValueError, match="no state-traffic floor for 'ppo'; known: td3, sac"):
        floors.state_bytes_per_update(agent, agent.default_hparams())
