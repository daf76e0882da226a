"""PB2: PBT's rounds with a GP-bandit explore, as pure functions over plain data (the GP, the
unit box of the priors, the choices a round makes), and its config errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastpop.strategies import gp
from fastpop.strategies.base import Evaluation
from fastpop.strategies.pb2 import (
    choose_configurations,
    from_unit,
    make_pb2,
    newest_within,
    to_unit,
)
from fastpop.strategies.pbt import PBTSettings, make_pbt
from fastpop.strategies.priors import Prior
from tests.helpers import refused_train
from tests.runs import TD3_PENDULUM

BOWL = {"a": Prior("uniform", 0.0, 1.0), "b": Prior("log_uniform", 1e-4, 1e-2)}
OPTIMUM = {"a": 0.7, "b": 3e-3}  # b at 0.76 of its log-scale box


def bowl_distance(hparams: dict) -> float:
    """Distance from the optimum in the priors' unit box."""
    return math.hypot(*(to_unit(BOWL[n], hparams[n]) - to_unit(BOWL[n], OPTIMUM[n])
                        for n in BOWL))  # fmt: skip


def play(strategy, hparams: list[dict], change, rounds: int, seed: int = 0, nan_at=None):
    """Every round each member's return grows by `change(its hparams)` plus noise; returns the
    lineage events in order. `nan_at`: (round, member) whose return is NaN then."""
    state, rng = strategy.init(), np.random.default_rng(seed)
    returns, events = np.zeros(len(hparams)), []
    for round_index in range(rounds):
        returns = returns + [change(h) for h in hparams] + rng.normal(0, 0.05, len(hparams))
        seen = returns.copy()
        if nan_at and nan_at[0] == round_index:
            seen[nan_at[1]] = np.nan
        state, selection = strategy.step(
            state, Evaluation(round_index, round_index + 1, seen), hparams
        )
        if selection is not None:
            returns, hparams = returns[selection.sources], selection.hparams
            events += selection.events
    return events


def initial(size: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"a": BOWL["a"].sample(rng), "b": BOWL["b"].sample(rng), "discount": 0.9 + m / 100}
            for m in range(size)]  # fmt: skip


def pb2(size=8, seed=0, priors=BOWL, window=10):
    settings = PBTSettings(interval=1, evaluation_interval=1)
    return make_pb2(size, priors, seed, settings, window)


def bowl(hparams: dict) -> float:
    return 1.0 - 10.0 * bowl_distance(hparams) ** 2


def test_explore_moves_toward_the_better_region_of_a_quadratic_bowl():
    events = play(pb2(), initial(8), bowl, rounds=20)
    late = [bowl_distance(e["new_hparams"]) for e in events if e["round"] >= 15]
    # Uniform draws in the unit square sit 0.4 from (0.7, 0.76) on average; UCB still sends
    # the odd choice far out to explore, hence the median.
    assert np.median(late) < 0.1, late
    perturbed = play(make_pbt(8, BOWL, 0, PBTSettings(1, 1)), initial(8), bowl, rounds=20)
    assert np.median(late) < np.median([bowl_distance(e["new_hparams"]) for e in perturbed
                                        if e["round"] >= 15])  # fmt: skip


def test_choices_stay_inside_the_priors_and_hparams_without_a_prior_are_the_sources():
    priors = {
        "lr": Prior("log_uniform", 1e-4, 1e-2),
        "delay": Prior("int_uniform", 1, 5),
        "batch": Prior("choice", values=(32, 256, 64)),
        "noise": Prior("uniform", 0.0, 1.0),
    }
    rng = np.random.default_rng(3)
    hparams = [{**{n: p.sample(rng) for n, p in priors.items()}, "discount": 0.9 + m / 100}
               for m in range(8)]  # fmt: skip
    events = play(pb2(priors=priors), hparams, lambda h: rng.normal(), rounds=12)
    assert len(events) == 2 * 12
    for event in events:
        new = event["new_hparams"]
        assert 1e-4 <= new["lr"] <= 1e-2 and 0.0 <= new["noise"] <= 1.0
        assert isinstance(new["delay"], int) and 1 <= new["delay"] <= 5
        assert new["batch"] in (32, 64, 256)
    # discount has no prior: each target takes its source's (sources never change theirs).
    first = [e for e in events if e["round"] == 0]
    assert all(e["new_hparams"]["discount"] == hparams[e["source"]]["discount"] for e in first)


def test_lineage_carries_the_acquisition_and_a_seed_decides_the_same_way():
    events = play(pb2(seed=5), initial(8), bowl, rounds=6)
    again = play(pb2(seed=5), initial(8), bowl, rounds=6)
    other = play(pb2(seed=6), initial(8), bowl, rounds=6)
    assert events == again
    assert [e["new_hparams"] for e in events] != [e["new_hparams"] for e in other]
    assert all(e["strategy"] == "pb2" and e["kind"] == "exploit" for e in events)
    # Round 0 has no observed change yet (one return per member): its choices are prior draws.
    assert {e["acquisition"] for e in events if e["round"] == 0} == {None}
    later = [e for e in events if e["round"] > 0]
    assert later and all(math.isfinite(e["acquisition"]) for e in later)
    assert all(e["acquisition"] >= e["predicted_change"] for e in later)


def lagged(index: int, returns, hparams, versions, versions_now) -> Evaluation:
    """A round whose result came back after the members trained on (no member is still
    exactly its evaluated policy): `hparams` and `versions` are the snapshot's."""
    size = len(returns)
    return Evaluation(
        index, 100 + index, np.array(returns, float), np.ones(size, bool), hparams,
        np.array(versions), np.full(size, 100 + index), None, np.array(versions_now),
        np.zeros(size, bool),
    )  # fmt: skip


def test_each_change_is_credited_to_the_evaluated_policys_hparams_under_a_lagging_evaluator():
    """The round of result 0 replaces member 0 (with member 3's state, new hparams) after
    snapshot 1 was taken: snapshot 1 is still member 0's old line, whose change since snapshot
    0 is observed with the old hparams; snapshot 2 is the new line, which has no earlier
    evaluation (the copy was not of an evaluated state), so its first change is observed at
    result 3, with the new hparams. Every change lies between two returns of one line."""
    strategy = make_pb2(4, BOWL, 0, PBTSettings(interval=100, evaluation_interval=1), 10)
    old = initial(4)
    state, selection = strategy.step(
        strategy.init(), lagged(0, [0, 1, 2, 3], old, [0] * 4, [0] * 4), old
    )
    (event,) = selection.events
    assert (event["target"], event["source"]) == (0, 3)
    new, now = selection.hparams, [1, 0, 0, 0]  # the learner counts member 0's change
    rounds = [([10, 2, 3, 4], old, [0] * 4), ([11, 4, 5, 6], new, now), ([13, 7, 8, 9], new, now)]
    for index, (returns, evaluated, versions) in enumerate(rounds, start=1):
        state, _ = strategy.step(state, lagged(index, returns, evaluated, versions, now), new)
    observed = {(int(o[0]), o[1], tuple(o[2:])) for o in state.explorer.observations}
    unit = lambda h: tuple(to_unit(BOWL[n], h[n]) for n in sorted(BOWL))
    expected = {(1, 1.0, unit(old[m])) for m in (1, 2, 3)} | {(1, 10.0, unit(old[0]))}
    expected |= {(2, 2.0, unit(old[m])) for m in (1, 2, 3)}
    expected |= {(3, 3.0, unit(old[m])) for m in (1, 2, 3)} | {(3, 2.0, unit(new[0]))}
    assert observed == expected


def test_a_copy_of_the_evaluated_state_is_measured_from_its_sources_return():
    """The learner waited (`pbt.wait`, device mode): the copied state is the evaluated one, so
    the target's next change counts from its source's return, as PB2 does."""
    strategy = make_pb2(4, BOWL, 0, PBTSettings(interval=100, evaluation_interval=1), 10)
    hparams = initial(4)
    exact = lagged(0, [0, 1, 2, 3], hparams, [0] * 4, [0] * 4)._replace(
        as_evaluated=np.ones(4, bool)
    )
    state, selection = strategy.step(strategy.init(), exact, hparams)
    now = [1, 0, 0, 0]
    after = lagged(1, [5, 2, 3, 4], selection.hparams, now, now)
    state, _ = strategy.step(state, after, selection.hparams)
    assert sorted(o[1] for o in state.explorer.observations) == [1.0, 1.0, 1.0, 2.0]  # 5 - 3


def test_a_nan_member_ranks_last_and_is_never_copied():
    events = play(pb2(), initial(8), bowl, rounds=4, nan_at=(2, 3))
    round_2 = [e for e in events if e["round"] == 2]
    assert 3 in {e["target"] for e in round_2}
    assert 3 not in {e["source"] for e in round_2}


def test_the_unit_box_is_log_scale_for_log_uniform_priors_and_rounds_where_the_prior_does():
    log = Prior("log_uniform", 1e-4, 1e-2)
    assert to_unit(log, 1e-3) == pytest.approx(0.5)
    assert from_unit(log, 0.5) == pytest.approx(1e-3)
    assert to_unit(log, 1.0) == 1.0  # outside the box: its edge
    assert from_unit(Prior("int_uniform", 1, 5), 0.6) == 3
    choice = Prior("choice", values=(256, 32, 64))
    assert [to_unit(choice, v) for v in (32, 64, 256)] == [0.0, 0.5, 1.0]
    assert from_unit(choice, 0.8) == 256


def test_the_gp_fits_a_smooth_function_and_pending_points_shrink_only_the_variance():
    rng = np.random.default_rng(0)
    x = rng.uniform(0.0, 0.5, size=(40, 2))
    y = np.sin(3 * x[:, 0]) + x[:, 1] ** 2
    model = gp.fit(x, np.zeros(40), y)
    probe = rng.uniform(0.1, 0.4, size=(10, 2))
    mean, _ = gp.predict(model, probe, np.zeros(10))
    assert np.abs(mean - (np.sin(3 * probe[:, 0]) + probe[:, 1] ** 2)).max() < 0.1
    far = np.array([[0.95, 0.95]])  # away from every observation
    before = gp.predict(model, far, np.zeros(1))
    after = gp.predict(gp.with_pending(model, far, np.zeros(1)), far, np.zeros(1))
    assert after[0] == pytest.approx(before[0], abs=1e-6)
    assert after[1][0] < 0.5 * before[1][0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_heavy_tailed_change_does_not_pull_the_choices_to_itself(seed):
    """Changes best near 0.8 of the box and one change of +20 (about 4.5 standard deviations of
    all of them) at 0.15: the standardized targets are clipped to [-2, 2] as Ray Tune's are, so
    the choice follows the rest of the changes; unclipped, it went to 0.15."""
    rng = np.random.default_rng(seed)
    x = np.vstack([rng.uniform(size=(40, 1)), [[0.15]]])
    y = np.append(-10 * (x[:40, 0] - 0.8) ** 2 + rng.normal(0, 0.3, 40), 20.0)
    assert gp.standardized(y)[2].max() == 2.0
    model = gp.fit(x, np.zeros(41), y)
    (point, *_), *_ = choose_configurations(model, 0, np.zeros((0, 1)), 1, rng)
    assert point[0] > 0.6


def test_a_choice_is_embedded_by_the_order_of_its_options_which_are_numbers():
    """Decided, not changed: every hparam a population varies is a number with an order
    (rates, discounts, noises, delays, periods), so a choice's options are ordered values, and
    a user lists them on the scale that matters (0.9, 0.99, 0.999: evenly in 1 - discount's
    log). Their order, evenly spaced, is that scale; their values would put 0.99 ten times
    nearer 0.999 than 0.9. Options that are not numbers are refused by the config."""
    discount = Prior("choice", values=(0.999, 0.9, 0.99))
    assert [to_unit(discount, v) for v in (0.9, 0.99, 0.999)] == [0.0, 0.5, 1.0]
    assert [from_unit(discount, u) for u in (0.1, 0.4, 0.9)] == [0.9, 0.99, 0.999]


def test_the_gp_takes_the_newest_whole_evaluations_within_its_limit():
    observations = np.array([[t, 0.1 * m, 0.5] for t in (3.0, 4.0, 5.0) for m in range(4)])
    assert newest_within(observations, 100).tolist() == observations.tolist()
    assert newest_within(observations, 11).tolist() == observations[4:].tolist()
    assert newest_within(observations, 8).tolist() == observations[4:].tolist()
    assert newest_within(observations, 3).tolist() == observations[8:].tolist()  # one at least


def test_the_fit_and_its_extension_by_pending_points_equal_a_direct_factorization():
    rng = np.random.default_rng(1)
    x, t, y = rng.uniform(size=(30, 3)), np.repeat(np.arange(3.0), 10), rng.normal(size=30)
    model = gp.fit(x, t, y)
    settings = (model.length_scale, model.epsilon)
    covariance = gp.kernel(x, t, x, t, *settings) + model.noise * np.eye(30)
    np.testing.assert_allclose(model.cholesky @ model.cholesky.T, covariance, atol=1e-12)
    np.testing.assert_allclose(covariance @ model.alpha, gp.standardized(y)[2], atol=1e-9)
    pending, now = rng.uniform(size=(5, 3)), np.full(5, 3.0)
    extended = gp.with_pending(model, pending, now)
    all_x, all_t = np.concatenate([x, pending]), np.concatenate([t, now])
    covariance = gp.kernel(all_x, all_t, all_x, all_t, *settings) + model.noise * np.eye(35)
    np.testing.assert_allclose(extended.cholesky, np.linalg.cholesky(covariance), atol=1e-10)
    np.testing.assert_allclose(extended.cholesky @ extended.cholesky.T, covariance, atol=1e-12)


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["strategy=pb2"], "population.priors: strategy pb2 draws the hparams that have"),
        (["strategy=pb2", "pb2.window=0", "population.priors={actor_lr: {uniform: [0, 1]}}"],
         "pb2.window: must be >= 1, got 0"),
        (["strategy=pb2", "population.priors={actor_lr: {choice: [fast, slow]}}"],
         "population.priors.actor_lr (a bound)"),
    ],
)  # fmt: skip
def test_bad_pb2_configs_exit_2_naming_the_field(overrides, message, tmp_path, capsys):
    assert message in refused_train(tmp_path, capsys, TD3_PENDULUM, *overrides)
