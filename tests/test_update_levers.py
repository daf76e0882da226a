"""The levers of the population update and the strongest sequential baseline: each
computes the same update as today's, from the same state and the same random draws."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fastpop import population
from fastpop.agents import make_agent
from fastpop.bench import anatomy, levers
from fastpop.bench.common import FLAT_RATIO
from fastpop.population import UpdatePlan
from tests.helpers import TINY_SPECS, random_buffers, sampler, stacked_hparams, tiny_update_bench

SIZE, UPDATES = 3, 4


def leaves_allclose(a, b, atol=1e-5) -> bool:
    """Every leaf equal up to float rounding; NaN where the other has NaN (TD3's actor loss of
    a member whose actor step was not due)."""
    return all(
        np.allclose(np.asarray(x, np.float64), np.asarray(y, np.float64), atol, 1e-5, True)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def lever_agent(name: str, **fields):
    algo = "dqn" if name.startswith("dqn") else name
    return make_agent(algo, TINY_SPECS[name], hidden_sizes=(16, 16), batch_size=8, **fields)


def run_update(agent, states, plan_fields=None, execution="vectorized", key=3):
    """One call of UPDATES updates per member from `states` (copied) on the tiny buffers."""
    name = "dqn" if agent.name == "dqn" else agent.name
    spec, buffers = random_buffers(name, SIZE)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), UPDATES)._replace(
        **(plan_fields or {})
    )
    executor = population.make_executor(execution, plan)
    hparams = stacked_hparams(agent, SIZE, **member_delays(agent))
    trees = [executor.adopt(t) for t in (population.copy_tree(states), buffers, hparams)]
    new_states, metrics = executor.update(*trees, jax.random.key(key))
    return executor.release(new_states), metrics


def member_delays(agent) -> dict:
    # members with different actor schedules: the conditional's both outcomes are exercised
    return {"policy_delay": [1, 2, 3]} if agent.name == "td3" else {}


def initial_states(agent):
    return population.init_population(agent, jax.random.key(0), stacked_hparams(agent, SIZE))


@pytest.mark.parametrize("name", ["td3", "sac", "dqn"])
def test_drawing_every_steps_numbers_at_once_changes_no_number(name):
    agent = lever_agent(name)
    states = initial_states(agent)
    once, metrics_once = run_update(agent, states)
    per_step, metrics_per_step = run_update(agent, states, {"draws_once": False})
    assert leaves_allclose(once, per_step, atol=1e-5)
    assert leaves_allclose(metrics_once, metrics_per_step, atol=1e-5)
    # and the update did something: the states moved
    assert not leaves_allclose(once, states, atol=1e-6)


def test_the_draws_are_the_very_numbers_each_step_drew():
    agent = lever_agent("sac")
    step_keys = jax.vmap(jax.random.split)(jax.random.split(jax.random.key(5), UPDATES))
    at_once = jax.vmap(agent.draw)(step_keys[:, 1])
    for step in range(UPDATES):
        one = agent.draw(step_keys[step, 1])
        assert all(np.array_equal(a[step], b) for a, b in zip(at_once, one, strict=True))


def test_an_unrolled_scan_computes_the_same_updates():
    # the executor's loop, whatever the agent: TD3's conditional actor step is the harder case
    agent = lever_agent("td3")
    states = initial_states(agent)
    rolled, _ = run_update(agent, states)
    unrolled, _ = run_update(agent, states, {"unroll": 2})
    assert leaves_allclose(rolled, unrolled, atol=1e-5)


def test_members_in_turn_in_one_program_equal_the_sequential_and_vectorized_updates():
    agent = lever_agent("td3")  # members with different actor schedules (member_delays)
    states = initial_states(agent)
    in_one, _ = run_update(agent, states, execution="sequential-in-one-program")
    sequential, _ = run_update(agent, states, execution="sequential")
    vectorized, _ = run_update(agent, states, execution="vectorized")
    assert leaves_allclose(in_one, sequential, atol=1e-5)
    assert leaves_allclose(in_one, vectorized, atol=1e-5)


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_bfloat16_matmuls_stay_near_float32_with_float32_parameters(name):
    agent, bf16 = lever_agent(name), lever_agent(name, compute_dtype="bfloat16")
    states = initial_states(agent)
    full, full_metrics = run_update(agent, states)
    half, half_metrics = run_update(bf16, states)
    assert all(leaf.dtype != jax.numpy.bfloat16 for leaf in jax.tree.leaves(half))
    assert not leaves_allclose(full, half, atol=1e-7)  # it does compute differently
    np.testing.assert_allclose(
        half_metrics["critic_loss"], full_metrics["critic_loss"], rtol=0.05, atol=1e-3
    )


def test_fused_pallas_mlps_compute_the_same_updates_from_the_same_parameters():
    # TD3: its actor's gradient through the critic's input, members with different actor delays
    # (SAC's torso, ReLU on its last layer too, is tests/test_pallas_mlp.py's)
    agent, fused = lever_agent("td3"), lever_agent("td3", mlp_kernel="pallas")
    states = initial_states(agent)
    assert leaves_allclose(initial_states(fused), states, atol=0.0)
    xla, xla_metrics = run_update(agent, states)
    pallas, pallas_metrics = run_update(fused, states)
    assert leaves_allclose(xla, pallas, atol=1e-5)
    assert leaves_allclose(xla_metrics, pallas_metrics, atol=1e-5)
    assert not leaves_allclose(xla, states, atol=1e-6)


def test_a_lever_that_fails_to_compile_is_recorded_and_the_other_rows_are_timed(monkeypatch):
    from fastpop.agents import pallas_mlp
    from fastpop.bench.random_replay import random_replay
    from fastpop.bench.update import bench_update, make_setups

    settings = tiny_update_bench()._replace(anatomy_from=1000)
    impls = [levers.parse(name) for name in ("vectorized", "vectorized+pallas-mlp")]
    spec, buffers = random_replay("td3", 2, jax.random.key(0), None)
    setups = make_setups(settings, impls, spec, buffers)
    # XLA sees no FLOPs inside a Pallas kernel: the lever is counted as the update it computes
    assert setups["vectorized+pallas-mlp"].cost == setups["vectorized"].cost

    def out_of_room(*args, **kwargs):
        raise RuntimeError("out of resource: shared memory")  # as Triton says it

    monkeypatch.setattr(pallas_mlp, "fused_mlp", out_of_room)
    lines = []
    result = bench_update(settings, [2], [impl.name for impl in impls], log=lines.append)
    assert [row["impl"] for row in result["rows"]] == ["vectorized"]
    assert result["rows"][0]["agent_updates_per_s"] > 0
    failure = result["failed"]["vectorized+pallas-mlp"][2]
    assert failure == "RuntimeError: out of resource: shared memory"
    assert any("vectorized+pallas-mlp P=2: failed, RuntimeError" in line for line in lines)


def test_a_lever_name_is_checked_and_applies_to_the_vectorized_update_only():
    impl = levers.parse("vectorized+bf16+unroll-2")
    assert impl.agent == {"compute_dtype": "bfloat16"} and impl.plan == {"unroll": 2}
    with pytest.raises(ValueError, match=r"unknown lever 'fast'.*draws-per-step"):
        levers.parse("vectorized+fast")
    with pytest.raises(ValueError, match="vectorized update only"):
        levers.parse("sequential+bf16")
    with pytest.raises(ValueError, match="unknown implementation 'jax'"):
        levers.parse("jax")


def test_headline_ratios_are_against_the_best_sequential_and_the_best_pytorch_row():
    rows = [
        {"impl": "vectorized", "population": 8, "agent_updates_per_s": 800.0},
        {"impl": "sequential", "population": 8, "agent_updates_per_s": 50.0},
        {"impl": "sequential-in-one-program", "population": 8, "agent_updates_per_s": 100.0},
        {"impl": "torch", "population": 8, "agent_updates_per_s": 10.0},
        {"impl": "torch-func", "population": 8, "agent_updates_per_s": 200.0},
    ]
    levers.add_speedups(rows)
    assert rows[0]["speedup_over_sequential"] == 16.0
    assert rows[0]["speedup_over_best_sequential"] == 8.0
    assert rows[0]["speedup_over_best_torch"] == 4.0


def test_drawing_once_per_call_halves_the_kernels_of_a_population_update_step():
    """XLA:CPU rolls every threefry draw into a loop of its own: drawn at every step, a TD3
    update step launched over three times the kernels (the acceptance's count at P = 80 is in
    results/bench/README.md; here the same program at a tiny size)."""
    agent = lever_agent("td3")
    spec, buffers = random_buffers("td3", SIZE)
    hparams = stacked_hparams(agent, SIZE)
    states = initial_states(agent)
    counts = {}
    for once in (True, False):
        plan = UpdatePlan(agent, sampler(spec, 8), UPDATES, draws_once=once)
        program = population.vectorized(plan).update
        text = program.lower(states, buffers, hparams, jax.random.key(0)).compile().as_text()
        counts[once] = anatomy.kernels_per_call(text, taken=0.5) / UPDATES
    assert counts[True] <= counts[False] / 2


def test_the_update_benchmark_times_every_jax_implementation_and_lever_with_its_floor():
    from fastpop.bench.update import bench_update

    settings = tiny_update_bench()._replace(kernel_times=True)
    impls = [
        "vectorized",
        "sequential-in-one-program",
        "vectorized+draws-per-step+unroll-2",
    ]
    lines = []
    result = bench_update(settings, [2], impls, log=lines.append)
    rows = {row["impl"]: row for row in result["rows"]}
    assert set(rows) == set(impls)
    for name in impls:
        assert rows[name]["agent_updates_per_s"] > 0
        assert rows[name]["speedup_over_best_sequential"] > 0
        # its rounds' agreement, as the PyTorch rows have it
        rounds = rows[name]["seconds_per_call_rounds"]
        assert rows[name]["rounds_ratio"] == pytest.approx(max(rounds) / min(rounds))
        assert rows[name]["rounds_flat"] == (rows[name]["rounds_ratio"] <= FLAT_RATIO)
    for name in ("vectorized", "vectorized+draws-per-step+unroll-2"):
        row = rows[name]
        assert row["times_floor"] > 0 and row["kernels_per_update_step"] > 0
        assert any(line.startswith(f"td3 {name} P=2: step") for line in lines)
        # the profiler's kernels of the row's own call (fastpop.bench.kernel_times)
        times = row["kernel_times"]
        assert times["kernels_per_call"] > 0 and times["top_kernels"]
        assert 0 < times["busy_seconds_per_call"] <= times["wall_seconds_per_call"]
        assert any(line.startswith(f"td3 {name} P=2: kernels busy") for line in lines)
    assert "times_floor" not in rows["sequential-in-one-program"]
    assert "kernel_times" not in rows["sequential-in-one-program"]
