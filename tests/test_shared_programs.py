"""Learners of equal configuration in one process share their programs
(`fastpop/compilation/shared_programs.py`): equal arguments build the very same agent and jitted
update, so the second is neither traced nor compiled again; unequal or unhashable ones are
built afresh."""

from __future__ import annotations

import jax

from fastpop import population
from fastpop.compilation import compile_stats
from fastpop.compilation.shared_programs import shared
from fastpop.population import UpdatePlan
from tests.helpers import program_names, random_buffers, sampler, stacked_hparams, tiny_agent


def test_equal_arguments_build_once_and_unhashable_ones_every_time():
    calls = []
    build = shared(lambda *args: calls.append(args) or object())
    assert build(1, (2, 3)) is build(1, (2, 3)) and len(calls) == 1
    assert build(1, (2, 4)) is not build(1, (2, 3)) and len(calls) == 2
    assert build([1]) is not build([1]) and len(calls) == 4  # a list: nothing to share it by


def test_agents_of_equal_configuration_are_one_agent():
    assert tiny_agent("td3", n_step=2) is tiny_agent("td3", n_step=2)
    assert tiny_agent("td3", n_step=2) is not tiny_agent("td3", n_step=3)
    listed = lambda: tiny_agent("td3", hidden_sizes=[16, 16])  # a list: built afresh each time
    assert listed() is not listed() and listed().name == "td3"


def test_a_second_learner_of_equal_configuration_traces_no_update():
    traced = program_names(compile_stats.TRACE)

    def update_once(seed):
        agent = tiny_agent("sac", n_step=2)
        spec, buffers = random_buffers("sac", 2, seed=seed)
        hparams = stacked_hparams(agent, 2)
        states = population.init_population(agent, jax.random.key(seed), hparams)
        plan = UpdatePlan(agent, sampler(spec, agent.batch_size, agent.n_step), 3)
        update = population.make_executor("vectorized", plan).update
        return update(states, buffers, hparams, jax.random.key(seed))

    first = update_once(0)
    traced.clear()
    second = update_once(1)
    assert not {"update", "init_members"} & set(traced), traced
    assert not jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), first, second))
