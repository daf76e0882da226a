"""DvD's lambda bandit against the authors' (jparkerholder/DvD_ES, bandits.py, BayesianBandits).

`Transcribed` is bandits.py's `update_dists` with its pandas arithmetic written out (checked
against the original with pandas once): for every past round i whose arm c_i was followed by a
value r_{i+1}, feedback = sign(r_{i+1} - max(r_{i-5}, ..., r_{i-1})) mapped to 0, 0.5, 1
(line 53: rolling(5).max().shift(1); line 57); rows from i = 6 on (the first non-empty row,
i = 5, is dropped at line 58); the latest 50 rows (line 59) make Beta(1 + sum, 1 + count - sum)
per arm (lines 61-62). Round 0 is its placeholder -99999 (line 24) and arm 0 (line 19).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fastpop.strategies import dvd
from fastpop.strategies.codec import join_strategy_state, split_strategy_state


class Transcribed:
    def __init__(self, arms: int, window: int = 50):
        self.arms, self.window = arms, window
        self.choices, self.data = [0], [-99999.0]

    def update(self, value: float) -> None:
        self.data.append(value)

    def choose(self, arm: int) -> None:
        self.choices.append(arm)

    def posterior(self) -> tuple[list[float], list[float]]:
        rows = []
        for i in range(5, len(self.data) - 1):
            feedback = self.data[i + 1] - max(self.data[i - 5 : i])
            rows.append((self.choices[i], (np.sign(feedback) + 1) / 2))
        rows = rows[1:][-self.window :]
        alpha = [1 + sum(r for c, r in rows if c == arm) for arm in range(self.arms)]
        count = [sum(1 for c, _ in rows if c == arm) for arm in range(self.arms)]
        return alpha, [1 + n - (a - 1) for n, a in zip(count, alpha, strict=True)]


@pytest.mark.parametrize("integers", [False, True], ids=["real", "with-ties"])
def test_bandit_posterior_matches_the_reference_round_by_round(integers):
    rng = np.random.default_rng(int(integers))
    state, reference = dvd.bandit_init(), Transcribed(3)
    for _ in range(130):  # past the window of 50 judged rounds
        value = float(rng.integers(0, 5)) if integers else float(rng.normal())
        state = dvd.bandit_step(state, value, 3, seed=0, adapt=True)
        reference.update(value)
        reference.choose(state.arm)
        alpha, beta = dvd.bandit_posterior(state, 3)
        want_alpha, want_beta = reference.posterior()
        np.testing.assert_array_equal(alpha, want_alpha)
        np.testing.assert_array_equal(beta, want_beta)
    assert len(state.feedback) == 50 and len(state.values) == 6


def test_first_feedback_comes_at_round_7_against_the_best_of_rounds_1_to_5():
    state = dvd.bandit_init()
    for value in (1.0, 2.0, 3.0, 4.0, 5.0, 10.0):
        state = dvd.bandit_step(state, value, 2, seed=0, adapt=True)
        assert dvd.bandit_posterior(state, 2) == ((1.0, 1.0), (1.0, 1.0))
    arm = state.arm  # chosen at round 6, in force until round 7
    state = dvd.bandit_step(state, 6.0, 2, seed=0, adapt=True)  # beats 5, not round 6's 10
    assert state.feedback == ((arm, 1.0),)
    arm = state.arm
    state = dvd.bandit_step(state, 10.0, 2, seed=0, adapt=True)  # ties rounds 2-6's best: 0.5
    assert state.feedback[-1] == (arm, 0.5)


def test_the_first_5_picks_are_uniform_then_thompson_sampling():
    # Feedback that favours arm 1 makes Thompson sampling pick it almost always (Beta(51, 1)
    # against Beta(1, 1)); the picks of rounds 1-5 ignore it.
    favoured = dvd.bandit_init()._replace(feedback=((1, 1.0),) * 50)
    picks = np.array(
        [
            [dvd.bandit_step(favoured._replace(rounds=r), 0.0, 2, seed, True).arm for r in range(8)]
            for seed in range(200)
        ]
    )
    assert 0.35 < picks[:, :5].mean() < 0.65  # rounds 1-5: uniform
    assert picks[:, 5:].mean() > 0.95  # rounds 6-8: Thompson sampling, arm 1


def test_fixed_mode_keeps_the_first_coefficient():
    state = dvd.bandit_init()
    for value in np.linspace(0.0, 20.0, 12):
        state = dvd.bandit_step(state, float(value), 3, seed=0, adapt=False)
    assert state.arm == 0 and state.rounds == 12


def test_the_bandit_is_fed_the_populations_mean_finite_return():
    # bandits.py's caller, train.py line 137: reward = np.mean(rwds), fed at line 157.
    assert dvd.bandit_value(np.array([1.0, np.nan, 5.0, 3.0])) == 3.0
    assert math.isnan(dvd.bandit_value(np.array([np.nan, np.nan])))


def test_non_finite_values_give_no_feedback():
    state = dvd.bandit_init()
    for value in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, math.nan, 7.0, 8.0):
        state = dvd.bandit_step(state, value, 2, seed=0, adapt=True)
    # Round 7 (NaN) and round 9 (its baseline, rounds 3-7, holds the NaN) give none; round 8
    # (7 against rounds 2-6) does, as pandas' rolling max in bandits.py skips NaN windows.
    assert [reward for _, reward in state.feedback] == [1.0]


def test_bandit_state_survives_json():
    state = dvd.bandit_init()
    for value in (1.0, math.nan, 3.0, 2.0, 5.0, 6.0, 7.0, 8.0, 9.0):
        state = dvd.bandit_step(state, value, 2, seed=1, adapt=True)
    assert state.feedback  # something to carry
    arrays, plain = split_strategy_state(state)
    assert arrays == []
    back = join_strategy_state(dvd.bandit_init(), [], json.loads(json.dumps(plain)))
    assert type(back) is type(state) and repr(back) == repr(state)
