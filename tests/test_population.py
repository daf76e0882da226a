"""Vectorized == sequential, members really differ, no recompiles, stacking helpers."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import population
from fastpop.compilation import compile_stats
from fastpop.population import UpdatePlan, chunked, chunking, stacking, tuning_cache
from tests.helpers import (
    TINY_OPTIONS,
    leaves_allclose,
    program_names,
    random_buffers,
    sampler,
    stacked_hparams,
    tiny_agent,
)

# Members deliberately differ in every hparam kind, including TD3's policy delay (so the
# population-wide actor branch runs while some members are not due).
PER_MEMBER = {
    "td3": {"actor_lr": [1e-3, 3e-4, 3e-3], "policy_delay": [1, 2, 3], "tau": [0.005, 0.01, 0.1]},
    "sac": {"critic_lr": [1e-3, 3e-4, 3e-3], "reward_scale": [1.0, 5.0, 0.1]},
    "dqn": {"learning_rate": [1e-3, 3e-4, 3e-3], "target_update_period": [1, 2, 3]},
    "dqn_atari": {"learning_rate": [1e-3, 3e-4, 3e-3], "target_update_period": [1, 2, 3]},
}


def run_executor(execution, agent, spec, buffers, hparams, states, calls=2, updates=4, name=None):
    batches = sampler(spec, agent.batch_size, agent.n_step)
    executor = population.make_executor(execution, UpdatePlan(agent, batches, updates))
    states = executor.adopt(population.copy_tree(states))
    member_buffers, member_hparams = executor.adopt(buffers), executor.adopt(hparams)
    metrics = None
    for call in range(calls):
        states, metrics = executor.update(
            states, member_buffers, member_hparams, jax.random.key(100 + call)
        )
    if execution == "vectorized" and name == "dqn_atari":
        # Vmapped per-member conv weights become grouped convolutions, slow on XLA:CPU: the
        # members of an image agent run one after another (same numbers, tested here).
        assert executor.update.chosen == {3: 1} and "convolutions" in executor.update.how[3]
    return executor.release(states), metrics


# Each algorithm as configured by default, and with every option that changes its update at
# once (FastTD3's recipe: a C51 critic with LayerNorm, n-step returns, observation
# normalization; DQN's dueling head): each option is one more piece of the same program.
RECIPE = {"n_step": 3, "observation_norm": True}
EQUIVALENCE_CASES = [
    *(pytest.param(name, {}, id=name) for name in ("td3", "sac", "dqn", "dqn_atari")),
    *(
        pytest.param(name, {**TINY_OPTIONS["distributional"], **RECIPE}, id=f"{name}-recipe")
        for name in ("td3", "sac")
    ),
    pytest.param("dqn", {**TINY_OPTIONS["dueling"], **RECIPE}, id="dqn-recipe"),
]


@pytest.mark.parametrize("name, options", EQUIVALENCE_CASES)
def test_vectorized_equals_sequential(name, options):
    agent = tiny_agent(name, **options)
    size = 3
    spec, buffers = random_buffers(name, size)
    hparams = stacked_hparams(agent, size, **PER_MEMBER[name])
    states = population.init_population(agent, jax.random.key(0), hparams)
    updates = 1 if name == "dqn_atari" else 4  # a run's Atari program on a CPU: no loop
    vec_states, vec_metrics = run_executor(
        "vectorized", agent, spec, buffers, hparams, states, updates=updates, name=name
    )
    seq_states, seq_metrics = run_executor(
        "sequential", agent, spec, buffers, hparams, states, updates=updates
    )
    assert leaves_allclose(vec_states, seq_states)
    for key in vec_metrics:
        np.testing.assert_allclose(vec_metrics[key], seq_metrics[key], rtol=1e-4, atol=1e-5)
    # The update really moved the states away from their initial values.
    assert not leaves_allclose(vec_states, states)
    if options.get("observation_norm"):  # every observation of a member's 2 x 4 batches
        assert np.all(vec_states.observation_norm.count == 2 * updates * agent.batch_size)


@pytest.mark.optimized  # bit for bit against O2
@pytest.mark.parametrize("name", ["td3", "sac", "dqn", "dqn_atari"])
def test_the_init_compiled_for_a_short_compile_makes_the_members_of_a_default_compile(name):
    agent = tiny_agent(name)
    hparams = stacked_hparams(agent, 3, **PER_MEMBER[name])
    key = jax.random.key(7)
    members = population.init_population(agent, key, hparams)  # LLVM's O1 (RARELY_RUN)
    default = jax.jit(jax.vmap(agent.init), compiler_options={"xla_backend_optimization_level": 2})
    expected = default(jax.random.split(key, 3), hparams)
    for made, wanted in zip(jax.tree.leaves(members), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(np.asarray(made), np.asarray(wanted))  # bit for bit
    # Inside another program it is traced as part of that one (no options of its own).
    shapes = jax.eval_shape(lambda k: population.init_population(agent, k, hparams), key)
    assert jax.tree.structure(shapes) == jax.tree.structure(members)


@pytest.mark.parametrize(
    "name,zero_rates",
    [
        ("td3", {"actor_lr": 0.0, "critic_lr": 0.0}),
        ("sac", {"actor_lr": 0.0, "critic_lr": 0.0, "alpha_lr": 0.0}),
        ("dqn", {"learning_rate": 0.0}),
    ],
)
def test_member_with_zero_learning_rate_keeps_its_parameters(name, zero_rates):
    agent = tiny_agent(name)
    size = 3
    spec, buffers = random_buffers(name, size)
    per_member = {field: [rate, 1e-3, 1e-3] for field, rate in zero_rates.items()}
    hparams = stacked_hparams(agent, size, **per_member)
    states = population.init_population(agent, jax.random.key(0), hparams)
    new_states, _ = run_executor("vectorized", agent, spec, buffers, hparams, states)
    policy_before = population.member_policies(agent, states)
    policy_after = population.member_policies(agent, new_states)
    assert leaves_allclose(
        population.member(policy_after, 0), population.member(policy_before, 0), atol=0.0
    )
    for i in (1, 2):
        assert not leaves_allclose(
            population.member(policy_after, i), population.member(policy_before, i)
        )


def test_td3_actor_waits_for_its_policy_delay():
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 2)
    hparams = stacked_hparams(agent, 2, policy_delay=[1, 3])
    states = population.init_population(agent, jax.random.key(0), hparams)
    actors = [population.copy_tree(states.actor)]
    executor = population.vectorized(
        UpdatePlan(agent, sampler(spec, agent.batch_size), num_updates=1)
    )
    for call in range(3):
        states, metrics = executor.update(states, buffers, hparams, jax.random.key(call))
        actors.append(population.copy_tree(states.actor))
        # Member 1 (delay 3) reports an actor loss only on its third critic step.
        assert np.isnan(metrics["actor_loss"][1, 0]) == (call < 2)
    member_actor = lambda i, t: population.member(actors[t], i)
    for t in range(1, 4):
        assert not leaves_allclose(member_actor(0, t), member_actor(0, t - 1))
    assert leaves_allclose(member_actor(1, 2), member_actor(1, 0), atol=0.0)
    assert not leaves_allclose(member_actor(1, 3), member_actor(1, 2))


def test_changing_hparam_values_does_not_recompile():
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 2)
    executor = population.vectorized(
        UpdatePlan(agent, sampler(spec, agent.batch_size), num_updates=2)
    )
    hparams = stacked_hparams(agent, 2)
    states = population.init_population(agent, jax.random.key(0), hparams)
    for call, lr in enumerate([1e-4, 1e-3, 5e-2]):
        changed = hparams._replace(
            actor_lr=jnp.full((2,), lr), policy_delay=jnp.full((2,), call + 1, jnp.int32)
        )
        states, _ = executor.update(states, buffers, changed, jax.random.key(call))
    assert executor.update._cache_size() == 1


# 4 members: one program; 20: sliced leaf by leaf (its compile grows faster than P)
@pytest.mark.parametrize("size", [4, stacking.UNSTACK_IN_ONE_PROGRAM_UP_TO + 4])
def test_stack_unstack_gather_round_trip(size):
    tree = {"w": jnp.arange(3.0 * size).reshape(size, 3), "step": jnp.arange(size)}
    members = population.unstack(tree)
    assert len(members) == size
    np.testing.assert_array_equal(members[size - 1]["w"], tree["w"][size - 1])
    assert leaves_allclose(population.stack(members), tree, atol=0.0)
    gathered = population.gather(tree, jnp.array([3, 3, 0, 1]))
    np.testing.assert_array_equal(gathered["step"], [3, 3, 0, 1])
    np.testing.assert_array_equal(gathered["w"][0], tree["w"][3])


def test_broadcast_hparams_errors_name_the_field():
    agent = tiny_agent("td3")
    with pytest.raises(ValueError, match=r"unknown hparams.*learning_rate"):
        stacked_hparams(agent, 2, learning_rate=[1.0, 2.0])
    with pytest.raises(ValueError, match="'actor_lr' has 3 values for 2 members"):
        stacked_hparams(agent, 2, actor_lr=[1.0, 2.0, 3.0])


def test_unknown_execution_is_refused():
    agent = tiny_agent("td3")
    with pytest.raises(ValueError, match="choose one of vectorized, sequential"):
        population.make_executor("parallel", UpdatePlan(agent, lambda b, k: None, 1))


@pytest.mark.parametrize("members_per_chunk", [1, 2])
@pytest.mark.parametrize("shared_replay", [False, True])
def test_chunked_vectorized_equals_sequential(shared_replay, members_per_chunk):
    """Members vmapped in chunks (the CPU default) give the same numbers as one vmap."""
    agent = tiny_agent("td3")
    size = 4
    spec, buffers = random_buffers("td3", size)
    if shared_replay:
        buffers = population.member(buffers, 0)
    hparams = stacked_hparams(agent, size, policy_delay=[1, 2, 1, 3])
    states = population.init_population(agent, jax.random.key(0), hparams)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 3, shared_replay)
    results = []
    for executor in (
        population.vectorized(plan, members_per_chunk=members_per_chunk),
        population.vectorized(plan),
        population.sequential(plan),
    ):
        member_buffers = buffers if shared_replay else executor.adopt(buffers)
        new_states, _ = executor.update(
            executor.adopt(population.copy_tree(states)),
            member_buffers,
            executor.adopt(hparams),
            jax.random.key(5),
        )
        results.append(executor.release(new_states))
    assert leaves_allclose(results[0], results[1])
    assert leaves_allclose(results[0], results[2])
    assert not leaves_allclose(results[0], states)


def tuned_vs_sequential():
    """A `make_executor` vectorized executor (CPU: members per chunk chosen) against the
    sequential one, same numbers; returns the vectorized executor's update for inspection.
    (The shapes of test_chunked_vectorized_equals_sequential: compiled programs are reused.)"""
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 4)
    hparams = stacked_hparams(agent, 4, policy_delay=[1, 2, 1, 3])
    states = population.init_population(agent, jax.random.key(0), hparams)
    sample = sampler(spec, agent.batch_size)
    plan = UpdatePlan(agent, sample, 3)
    tuned = population.make_executor("vectorized", plan)
    results = []
    for executor in (tuned, population.sequential(plan)):
        new_states, _ = executor.update(
            executor.adopt(population.copy_tree(states)),
            executor.adopt(buffers),
            executor.adopt(hparams),
            jax.random.key(5),
        )
        results.append(executor.release(new_states))
    assert leaves_allclose(results[0], results[1])
    assert not leaves_allclose(results[0], states)
    return tuned.update


def test_members_per_chunk_is_measured_once_and_cached(monkeypatch, tmp_path):
    """Past the small-population shortcut the chunk size is measured (timings are not
    asserted; at the first call, as a benchmark measures it), stored on disk, reused by the
    next executor, and numbers stay sequential's."""
    monkeypatch.setattr(chunking, "_measure_later", False)  # (restored after the test)
    monkeypatch.setattr(chunking, "SMALL_POPULATION_BYTES", 0)
    monkeypatch.setattr(chunking, "CALIBRATION_ROUNDS", 1)
    monkeypatch.setattr(tuning_cache, "_memory", {})
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    update = tuned_vs_sequential()
    assert (tmp_path / "tuning.json").exists()
    monkeypatch.setattr(tuning_cache, "_memory", {})  # a new process: from the file
    update = tuned_vs_sequential()
    assert update.chosen[4] in chunking.candidates(4) and "before" in update.how[4]


@pytest.mark.parametrize("in_a_benchmark", [False, True])
def test_a_measurement_under_load_is_made_again_a_bounded_number_of_times(
    monkeypatch, tmp_path, in_a_benchmark
):
    """A run starts with the rule of thumb (8 members per chunk on a CPU: all 4 here), so that
    its first update waits for no measurement, and after REMEASURE_AFTER_CALLS update calls
    times its next calls with each candidate in turn (rotating rounds, the first one untimed);
    its later calls use the measured choice. Rounds that disagree (a loaded machine) are
    measured again by the next run (a new process: the cache read from its file), which starts
    with the earlier choice, but only NOISY_MEASUREMENTS times in all: a machine that is never
    quiet must not pay for the measurement at every run. A benchmark's measures at its first
    call, on copies of the states, so that no timed call includes one."""
    if in_a_benchmark:
        chunking.measure_at_first_call()
    monkeypatch.setattr(chunking, "SMALL_POPULATION_BYTES", 0)
    monkeypatch.setattr(chunking, "CALIBRATION_ROUNDS", 1)
    monkeypatch.setattr(chunking, "REMEASURE_AFTER_CALLS", 2)
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    pick = chunking.pick_chunk
    choices = iter([1, 2, 4])  # each measurement picks another chunk size, its rounds disagreeing
    monkeypatch.setattr(chunking, "pick_chunk", lambda r: (next(choices), pick(r)[1], False))
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 4)
    hparams = stacked_hparams(agent, 4)
    states = population.init_population(agent, jax.random.key(0), hparams)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 3)

    measuring_calls = len(chunking.rotating_rounds(chunking.candidates(4)))  # 2 rounds of 3
    calls = chunking.REMEASURE_AFTER_CALLS + measuring_calls + 2

    def one_run() -> tuple[list[int], list[int]]:
        """(the update calls the progress line says measure, -1 for a measurement before the
        first call on copies of the states; the members per chunk each call ran), in a new
        process."""
        monkeypatch.setattr(tuning_cache, "_memory", {})
        update = population.make_executor("vectorized", plan).update
        measured, used, calibrate = [], [], update.calibrate
        update.calibrate = lambda *args: measured.append(-1) or calibrate(*args)
        update.chunk_for(states, buffers, hparams, jax.random.key(5))  # the first call's choice
        run = update.run
        update.run = lambda chunk, *args: used.append(chunk) or run(chunk, *args)
        work = population.copy_tree(states)
        for call in range(calls):
            if update.measures_again(hparams):
                measured.append(call)
            work, _ = update(work, buffers, hparams, jax.random.key(5))
        return measured, used

    runs = [one_run() for _ in range(chunking.NOISY_MEASUREMENTS + 2)]
    if in_a_benchmark:
        first, second = ([-1], [1] * calls), ([-1], [2] * calls)
    else:
        measuring = list(range(2, 2 + measuring_calls))
        rotating = [1, 2, 4, 2, 4, 1]
        first = (measuring, [4, 4, *rotating, 1, 1])
        second = (measuring, [1, 1, *rotating, 2, 2])
    assert runs == [first, second, ([], [2] * calls), ([], [2] * calls)]
    [entry] = json.loads((tmp_path / "tuning.json").read_text()).values()
    assert entry["noisy_measurements"] == chunking.NOISY_MEASUREMENTS


def test_an_update_traced_inside_a_program_is_neither_counted_nor_timed(monkeypatch, tmp_path):
    """Device mode calls the update inside its chunk's update program
    (collect/chunk_programs.py): a trace is not an update call, and timing one would store
    nonsense as this CPU's measurement."""
    monkeypatch.setattr(chunking, "SMALL_POPULATION_BYTES", 0)
    monkeypatch.setattr(chunking, "REMEASURE_AFTER_CALLS", 1)
    monkeypatch.setattr(tuning_cache, "_memory", {})
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 4)
    hparams = stacked_hparams(agent, 4)
    states = population.init_population(agent, jax.random.key(0), hparams)
    update = population.make_executor("vectorized", UpdatePlan(agent, sampler(spec, 8), 1)).update
    for _ in range(3):
        jax.eval_shape(update, states, buffers, hparams, jax.random.key(5))
    assert update.calls == {} and update.live == {} and not (tmp_path / "tuning.json").exists()


def test_tuning_cache_keeps_steady_measurements_on_disk(monkeypatch, tmp_path):
    monkeypatch.setattr(tuning_cache, "_memory", {})
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    steady, noisy = tuning_cache.key("a", "P=4"), tuning_cache.key("b", "P=4")
    assert steady != noisy and tuning_cache.key("a", "P=4") == steady
    tuning_cache.store(steady, {"members_per_chunk": 2})
    tuning_cache.store(noisy, {"members_per_chunk": 4}, persist=False)
    assert tuning_cache.load(noisy) == {"members_per_chunk": 4}  # this process only
    monkeypatch.setattr(tuning_cache, "_memory", {})
    assert tuning_cache.load(steady)["members_per_chunk"] == 2
    assert tuning_cache.load(noisy) is None
    monkeypatch.setenv("FASTPOP_CACHE_DIR", "")  # memory only
    tuning_cache.store(noisy, {"members_per_chunk": 4})
    assert not (tmp_path / "tuning.json").read_text().count(noisy)


def test_members_per_chunk_can_be_set(monkeypatch):
    monkeypatch.setenv(chunking.CHUNK_ENV, "2")
    update = tuned_vs_sequential()
    assert update.chosen == {4: 2}


def test_small_populations_are_not_measured(monkeypatch):
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    update = tuned_vs_sequential()
    assert update.chosen == {4: 4} and "one vmap" in update.how[4]


def test_pick_chunk_takes_a_larger_chunk_only_if_it_wins_every_round():
    """Seconds per member in three rounds; chunks of 1 are the safe default."""
    lucky = {1: [1.0, 2.0, 1.0], 2: [0.97, 1.9, 0.98], 16: [1.3, 0.9, 1.2]}
    chunk, ratios, steady = chunking.pick_chunk(lucky)
    assert chunk == 2 and ratios[16] == pytest.approx(1.2) and not steady
    assert chunking.pick_chunk({1: [1.0, 1.0], 4: [1.01, 0.9]})[0] == 1
    chunk, _, steady = chunking.pick_chunk({1: [1.0, 2.0], 4: [0.9, 1.85], 8: [0.95, 1.9]})
    assert chunk == 4 and steady  # the machine slowed down between rounds: ratios agree


def test_chunk_candidates():
    assert chunking.candidates(1) == [1]
    assert chunking.candidates(6) == [1, 2, 6]
    assert chunking.candidates(16) == [1, 2, 4, 8, 16]
    assert chunking.candidates(64) == [1, 2, 4, 8, 16]
    assert chunking.candidates(12) == [1, 2, 4, 12]


def test_chunk_size_divides_the_population():
    assert chunked.chunk_size(64, 8) == 8
    assert chunked.chunk_size(12, 8) == 6
    assert chunked.chunk_size(7, 4) == 1
    assert chunked.chunk_size(4, None) == 4
    assert chunked.chunk_size(3, 8) == 3


def test_population_of_one_vectorized_equals_sequential():
    agent = tiny_agent("sac")
    spec, buffers = random_buffers("sac", 1)
    hparams = stacked_hparams(agent, 1)
    states = population.init_population(agent, jax.random.key(0), hparams)
    vec_states, _ = run_executor("vectorized", agent, spec, buffers, hparams, states)
    seq_states, _ = run_executor("sequential", agent, spec, buffers, hparams, states)
    assert leaves_allclose(vec_states, seq_states)
    assert population.population_size(vec_states) == 1


@pytest.mark.parametrize("chunks", ["measured", "set", "whole population"])
def test_the_programs_compiled_ahead_from_shapes_are_those_the_first_call_runs(
    monkeypatch, tmp_path, chunks
):
    """`compile_ahead` (the learner's `compile_update_ahead`, during process mode's warm-up)
    compiles from shapes alone every program the first update runs: the rule of thumb's where
    the chunk size is still to be measured (and, in a thread of their own, every other
    candidate's, which the calls after the first ones time), a chosen size, or the whole
    population. The first call (and the calls that measure) then compile no update program (they
    may compile small helpers: key splits, copies)."""
    monkeypatch.setattr(tuning_cache, "_memory", {})
    monkeypatch.setenv("FASTPOP_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(chunking.CHUNK_ENV, raising=False)
    if chunks == "measured":
        monkeypatch.setattr(chunking, "SMALL_POPULATION_BYTES", 0)
        monkeypatch.setattr(chunking, "CALIBRATION_ROUNDS", 1)
        monkeypatch.setattr(chunking, "REMEASURE_AFTER_CALLS", 1)
    elif chunks == "set":
        monkeypatch.setenv(chunking.CHUNK_ENV, "2")
    agent = tiny_agent("td3")
    spec, buffers = random_buffers("td3", 4)
    hparams = stacked_hparams(agent, 4)
    states = population.init_population(agent, jax.random.key(0), hparams)
    plan = UpdatePlan(agent, sampler(spec, agent.batch_size), 3)
    update = population.make_executor("vectorized", plan).update
    arrays = (states, buffers, hparams, jax.random.key(5))
    update.compile_ahead(*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), arrays))
    if chunks == "measured":
        update.candidates_ahead.result()
    compiled = program_names(compile_stats.BACKEND)
    new_states, _ = update(*arrays)
    if chunks == "measured":  # the calls after the first one, timed with each candidate
        assert update.chosen[4] == 4 and update.known[4].measure_again  # the rule of thumb's
        while update.measures_again(hparams) or update.known[4].measure_again:
            new_states, _ = update(new_states, *arrays[1:])
        assert not update.live  # measured
    assert not {"jit(update)", "jit(update_chunk)"} & set(compiled), compiled
    chosen = {"measured": chunking.candidates(4), "set": [2], "whole population": [4]}[chunks]
    assert update.chosen[4] in chosen
