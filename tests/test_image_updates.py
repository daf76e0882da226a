"""Atari agents on a CPU: K updates as K calls of a loop-free one-update program
(population.updates_per_program), the same numbers whichever executor runs them."""

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop import population
from fastpop.compilation import compile_stats
from fastpop.population import UpdatePlan, chunked
from fastpop.run.parts import run_execution
from tests.helpers import (
    TINY_SPECS,
    leaves_allclose,
    program_names,
    random_buffers,
    sampler,
    stacked_hparams,
    tiny_agent,
)

UPDATES = 3  # per call
SIZE = 3
KEY = jax.random.key(1)


def test_atari_frames_on_a_cpu_compile_one_update_with_no_loop_and_others_one_scan():
    atari, vector = TINY_SPECS["dqn_atari"], TINY_SPECS["dqn"]
    assert population.updates_per_program(atari.obs_shape, atari.obs_dtype, UPDATES) == 1
    assert population.updates_per_program(vector.obs_shape, vector.obs_dtype, UPDATES) == UPDATES

    agent = tiny_agent("dqn_atari")
    spec, buffers = random_buffers("dqn_atari", SIZE)
    hparams = stacked_hparams(agent, SIZE)
    states = population.init_population(agent, jax.random.key(0), hparams)

    def loop_convolutions(updates: int) -> int:
        plan = UpdatePlan(agent, sampler(spec, agent.batch_size), updates)
        update = population.vectorized(plan).update  # the whole population: one jit
        return convolutions_in_loops(jax.make_jaxpr(update)(states, buffers, hparams, KEY).jaxpr)

    # XLA:CPU runs convolutions in a loop ~13x slower; a scan, even of length 1, is a loop.
    assert loop_convolutions(1) == 0
    assert loop_convolutions(UPDATES) > 0


def convolutions_in_loops(jaxpr, in_loop: bool = False) -> int:
    """Convolutions of `jaxpr` inside a scan or while loop, at any depth."""
    count = 0
    for equation in jaxpr.eqns:
        name = equation.primitive.name
        count += in_loop and name == "conv_general_dilated"
        looped = in_loop or name in ("scan", "while")
        for value in equation.params.values():
            for inner in value if isinstance(value, tuple) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's own
                if hasattr(inner, "eqns"):
                    count += convolutions_in_loops(inner, looped)
    return count


def run_repeated(execution: str, agent, spec, buffers, hparams, states):
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 1)
    executor = population.make_executor(execution, plan)
    update = population.repeated(executor.update, UPDATES)
    states = executor.adopt(population.copy_tree(states))
    member_buffers, member_hparams = executor.adopt(buffers), executor.adopt(hparams)
    for call in range(2):
        key = jax.random.key(100 + call)
        states, metrics = update(states, member_buffers, member_hparams, key)
    return executor.release(states), metrics


def test_k_calls_of_one_update_equal_between_executors_and_keep_k_metrics_per_member():
    agent = tiny_agent("dqn_atari")
    spec, buffers = random_buffers("dqn_atari", SIZE)
    hparams = stacked_hparams(agent, SIZE, learning_rate=[1e-3, 3e-4, 3e-3])
    states = population.init_population(agent, jax.random.key(0), hparams)
    vec_states, vec_metrics = run_repeated("vectorized", agent, spec, buffers, hparams, states)
    seq_states, seq_metrics = run_repeated("sequential", agent, spec, buffers, hparams, states)
    assert leaves_allclose(vec_states, seq_states)
    for name, values in vec_metrics.items():
        assert values.shape == (SIZE, UPDATES), name
        np.testing.assert_allclose(values, seq_metrics[name], rtol=1e-4, atol=1e-5)
    # Each member made 2 calls x UPDATES updates: DQN counts its own steps.
    assert np.asarray(vec_states.step).tolist() == [2 * UPDATES] * SIZE
    assert not leaves_allclose(vec_states, states)


def test_a_repeated_update_uses_a_key_of_its_own_per_call():
    """Call i gets key i of split(key, calls): its three calls are not one update thrice."""
    agent = tiny_agent("dqn_atari")
    spec, buffers = random_buffers("dqn_atari", SIZE)
    hparams = stacked_hparams(agent, SIZE)
    states = population.init_population(agent, jax.random.key(0), hparams)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 1)
    update = population.repeated(population.vectorized(plan).update, UPDATES)
    _, metrics = update(population.copy_tree(states), buffers, hparams, jax.random.key(1))
    losses = np.asarray(metrics["loss"])
    assert len(np.unique(losses[0])) == UPDATES  # three batches, three losses


def test_members_one_at_a_time_leave_the_stacked_states_once_per_repeated_call(monkeypatch):
    """Members updated one at a time (convolutions on a CPU) make all of a repeated update's
    calls on arrays of their own, taken out of the stacked states once per call of K updates,
    not at every update (vectorized DQN ran 1.5x slower than sequential so), with the numbers
    of the calls made in turn; its programs compile ahead from shapes."""
    agent = tiny_agent("dqn_atari")
    spec, buffers = random_buffers("dqn_atari", SIZE)
    hparams = stacked_hparams(agent, SIZE, learning_rate=[1e-3, 3e-4, 3e-3])
    states = population.init_population(agent, jax.random.key(0), hparams)
    executor = population.vectorized(UpdatePlan(agent, sampler(spec, 8), 1), members_per_chunk=1)
    update = population.repeated(executor.update, UPDATES)
    arrays = (population.copy_tree(states), buffers, hparams, KEY)
    update.compile_ahead(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arrays))
    compiled = program_names(compile_stats.BACKEND)
    taken, take = [], chunked.take_member
    monkeypatch.setattr(chunked, "take_member", lambda tree, i: taken.append(i) or take(tree, i))
    repeated_states, repeated_metrics = update(*arrays)
    assert taken == list(range(SIZE))
    assert not {"jit(take_member)", "jit(update_member)", "jit(put_member)"} & set(compiled)

    call_keys = jax.random.split(KEY, UPDATES)
    in_turn = chunked.calls_in_turn(
        executor.update, population.copy_tree(states), *arrays[1:3], call_keys
    )
    assert len(taken) == SIZE * (1 + UPDATES)  # calls made in turn: every member at every call
    assert leaves_allclose(repeated_states, in_turn[0], atol=0.0)
    for name, values in repeated_metrics.items():
        np.testing.assert_array_equal(values, in_turn[1][name])


def test_a_run_updates_atari_members_one_at_a_time_with_the_program_compiled_ahead():
    """On a CPU and one device a run's Atari population uses the sequential executor whatever
    population.execution says; its member program compiles from shapes during the warm-up
    (`Learner.compile_update_ahead`), so the first update compiles none."""
    config = config_lib.config_from_dict({"name": "t", "algo": "dqn", "env": {"id": "CartPole-v1"}})
    assert config.population.execution == "vectorized"
    assert run_execution(config, TINY_SPECS["dqn_atari"]) == "sequential"
    assert run_execution(config, TINY_SPECS["dqn"]) == "vectorized"

    agent = tiny_agent("dqn_atari")
    spec, buffers = random_buffers("dqn_atari", SIZE)
    hparams = stacked_hparams(agent, SIZE)
    states = population.init_population(agent, jax.random.key(0), hparams)
    executor = population.make_executor("sequential", UpdatePlan(agent, sampler(spec, 8), 1))
    update = population.repeated(executor.update, UPDATES)
    arrays = (*map(executor.adopt, (states, buffers, hparams)), KEY)
    update.compile_ahead(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arrays))
    compiled = program_names(compile_stats.BACKEND)
    update(*arrays)
    assert "jit(run)" not in compiled, compiled
