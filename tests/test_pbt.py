"""PBT selection, exploit and explore as pure functions."""

import jax
import numpy as np
import pytest

from fastpop import population
from fastpop.strategies import pbt
from fastpop.strategies.priors import Prior, parse_prior
from tests.helpers import stacked_hparams, tiny_agent


def test_rank_puts_nan_last_and_keeps_member_order_on_ties():
    fitness = np.array([1.0, np.nan, 3.0, 1.0, -np.inf, 3.0])
    np.testing.assert_array_equal(pbt.rank(fitness), [2, 5, 0, 3, 1, 4])


def test_truncation_replaces_the_bottom_with_top_members():
    rng = np.random.default_rng(0)
    fitness = np.array([5.0, 1.0, 4.0, 0.0, 3.0, 2.0, 6.0, 7.0])
    exploits = pbt.truncation_selection(fitness, 0.25, 0.25, rng)
    assert sorted(e.target for e in exploits) == [1, 3]
    assert all(e.source in (6, 7) for e in exploits)


def test_non_finite_members_are_always_replaced():
    rng = np.random.default_rng(0)
    fitness = np.array([1.0, np.nan, 2.0, np.inf * 0, 3.0, 4.0, 5.0, 6.0])
    exploits = pbt.truncation_selection(fitness, 0.125, 0.25, rng)
    assert {e.target for e in exploits} == {1, 3}
    assert all(np.isfinite(fitness[e.source]) for e in exploits)


@pytest.mark.parametrize(
    "size,bottom,top,message",
    [
        (1, 0.5, 0.5, "at least 2 members, got 1"),
        (4, 0.2, 0.25, "select 0 to replace and 1 to copy from"),
        (4, 0.25, 0.1, "select 1 to replace and 0 to copy from"),
        (4, 0.75, 0.5, "must be <= 1"),
    ],
)
def test_selection_sizes_refuse_degenerate_fractions(size, bottom, top, message):
    with pytest.raises(ValueError, match=message):
        pbt.selection_sizes(size, bottom, top)


def exploit_indices(size: int, exploits: list[pbt.Exploit]) -> np.ndarray:
    """indices[i] = the member whose state member i takes (itself unless it is a target)."""
    indices = np.arange(size)
    for exploit in exploits:
        indices[exploit.target] = exploit.source
    return indices


def apply_exploits(stacked_tree, exploits: list[pbt.Exploit]):
    """Every leaf of each target member replaced by its source's; others untouched."""
    if not exploits:
        return stacked_tree
    size = population.population_size(stacked_tree)
    return population.gather(stacked_tree, jax.numpy.asarray(exploit_indices(size, exploits)))


def test_exploit_copies_every_leaf_of_the_source_and_leaves_others_bit_identical():
    agent = tiny_agent("td3")
    hparams = stacked_hparams(agent, 4, actor_lr=[1e-4, 2e-4, 3e-4, 4e-4])
    states = population.init_population(agent, jax.random.key(0), hparams)
    states = states._replace(step=states.step + np.arange(4, dtype=np.int32))
    exploits = [pbt.Exploit(target=1, source=3)]
    new = apply_exploits((states, hparams), exploits)
    new_states, new_hparams = new
    picks = {
        "actor": lambda s: s.actor,
        "critic": lambda s: s.critic,
        "target_critic": lambda s: s.target_critic,
        "actor_opt": lambda s: s.actor_opt,
        "step": lambda s: s.step,
    }
    for name, pick in picks.items():
        for got, want in zip(
            jax.tree.leaves(pick(new_states)), jax.tree.leaves(pick(states)), strict=True
        ):
            np.testing.assert_array_equal(got[1], want[3], err_msg=name)
            for member in (0, 2, 3):
                np.testing.assert_array_equal(got[member], want[member], err_msg=name)
    assert float(new_hparams.actor_lr[1]) == pytest.approx(4e-4)


def test_explore_stays_in_bounds_and_integers_stay_integers():
    priors = {
        "actor_lr": parse_prior("actor_lr", {"log_uniform": [3e-5, 3e-3]}),
        "discount": parse_prior("discount", {"uniform": [0.9, 1.0]}),
        "policy_delay": parse_prior("policy_delay", {"int_uniform": [1, 5]}),
    }
    rng = np.random.default_rng(1)
    values = {"actor_lr": 3e-3, "discount": 0.999, "policy_delay": 1, "tau": 0.005}
    seen_delays = set()
    for _ in range(2000):
        values = pbt.explore(values, priors, rng, resample_probability=0.1)
        assert 3e-5 <= values["actor_lr"] <= 3e-3
        assert 0.9 <= values["discount"] <= 1.0
        assert isinstance(values["policy_delay"], int) and 1 <= values["policy_delay"] <= 5
        assert values["tau"] == 0.005  # no prior: never explored
        seen_delays.add(values["policy_delay"])
    assert seen_delays == {1, 2, 3, 4, 5}


def test_small_integers_move_under_perturbation():
    prior = Prior("int_uniform", 1, 5)
    rng = np.random.default_rng(0)
    moved = {
        pbt.explore({"d": 2}, {"d": prior}, rng, resample_probability=0.0)["d"] for _ in range(50)
    }
    assert moved == {1, 3}


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"gaussian": [0, 1]}, "unknown kind 'gaussian'"),
        ({"log_uniform": [0, 1]}, "need 0 < low < high"),
        ({"uniform": [2, 1]}, "need low < high"),
        ({"choice": []}, "non-empty list"),
        ([1, 2], "expected one of"),
    ],
)
def test_bad_priors_name_the_hparam(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_prior("actor_lr", spec)


def test_a_member_reset_after_a_nan_is_ranked_on_its_returns_since():
    # fitness_window 2, as configs/dqn_pbt_pong.yaml: member 0's params went non-finite (NaN
    # return) between rounds and the learner reset it; its next return is the best.
    priors = {"actor_lr": parse_prior("actor_lr", {"log_uniform": [3e-5, 3e-3]})}
    settings = pbt.PBTSettings(interval=100, evaluation_interval=50, fitness_window=2)
    strategy = pbt.make_pbt(4, priors, seed=0, settings=settings)
    state = strategy.init()
    state, _ = strategy.step(state, pbt.Evaluation(0, 50, np.array([np.nan, 1.0, 2, 3])), [])
    hparams = [{"actor_lr": 1e-3}] * 4
    state, selection = strategy.step(
        state, pbt.Evaluation(1, 100, np.array([9.0, 1.0, 2, 3])), hparams
    )
    (event,) = selection.events
    assert (event["target"], event["source"]) == (1, 0)  # the worst copies the best
    assert (event["target_fitness"], event["source_fitness"]) == (1.0, 9.0)
    np.testing.assert_array_equal(selection.sources, [0, 0, 2, 3])


def test_fitness_is_nan_only_when_the_latest_return_is():
    history = ((1.0, 3.0), (np.nan, 4.0), (2.0, np.nan), (5.0, np.inf, 6.0, 8.0), ())
    scores = pbt.fitness(history)
    np.testing.assert_array_equal(scores[:2], [2.0, 4.0])
    assert np.isnan(scores[2]) and scores[3] == 7.0 and np.isnan(scores[4])


def test_a_members_fitness_leaves_out_results_of_a_line_it_no_longer_holds():
    """Member 0 copies member 3 at the round of result 0, which came back after snapshot 1 was
    taken: snapshot 1's return is member 0's old line's, so its history stays its source's."""
    from fastpop.strategies.base import Evaluation

    priors = {"a": Prior("uniform", 0.0, 1.0)}
    settings = pbt.PBTSettings(interval=100, evaluation_interval=1, fitness_window=2)
    strategy = pbt.make_pbt(4, priors, 0, settings)
    hparams = [{"a": 0.1 * m} for m in range(4)]
    state, selection = strategy.step(
        strategy.init(), Evaluation(0, 100, np.array([0.0, 1, 2, 3])), hparams
    )
    assert [(e["target"], e["source"]) for e in selection.events] == [(0, 3)]
    stale = Evaluation(1, 101, np.array([-50.0, 1, 2, 3]), versions=np.zeros(4, int),
                       versions_now=np.array([1, 0, 0, 0]))  # fmt: skip
    state, _ = strategy.step(state, stale, selection.hparams)
    assert state.history == ((3.0,), (1.0, 1.0), (2.0, 2.0), (3.0, 3.0))
