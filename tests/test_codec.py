"""Strategy states as checkpoint data (fastpop.strategies.codec): arrays out for the npz, the
rest plain JSON data, and back against a fresh state."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from fastpop.strategies import cem
from fastpop.strategies.cemrl import CEMRLState
from fastpop.strategies.codec import join_strategy_state, split_strategy_state
from fastpop.strategies.dvd import bandit_init, bandit_step
from fastpop.strategies.pbt import PBTState


@pytest.mark.parametrize(
    "state",
    [
        PBTState(3, 2, ((1.0, float("nan")), (), (2.5,))),
        bandit_step(bandit_init(), 4.0, 3, seed=0, adapt=True),
        bandit_init(),
    ],
    ids=["pbt", "dvd-bandit", "dvd-bandit-initial"],
)
def test_host_side_strategy_states_survive_json(state):
    arrays, plain = split_strategy_state(state)
    assert arrays == []
    back = join_strategy_state(state, [], json.loads(json.dumps(plain)))
    assert type(back) is type(state)
    assert repr(back) == repr(state)  # NaN == NaN here, and tuples stay tuples


def test_arrays_go_out_in_field_order_and_come_back_in_place():
    state = CEMRLState(cem.init(jnp.arange(3.0), 0.5, 0.25), generation=7)
    arrays, plain = split_strategy_state(state)
    assert [a.shape for a in arrays] == [(3,), (3,), ()]  # mean, variance, noise
    empty = {"mean": None, "variance": None, "noise": None}
    assert plain == {"distribution": empty, "generation": 7}
    template = CEMRLState(cem.init(jnp.zeros(3), 1.0, 1.0), generation=0)
    saved = [np.asarray(a) for a in arrays]  # as the npz gives them back
    back = join_strategy_state(template, saved, json.loads(json.dumps(plain)))
    assert type(back) is CEMRLState and type(back.distribution) is cem.CEMState
    assert back.generation == 7
    np.testing.assert_array_equal(back.distribution.mean, [0.0, 1.0, 2.0])
    np.testing.assert_array_equal(back.distribution.variance, [0.5, 0.5, 0.5])
    assert float(back.distribution.noise) == 0.25
