"""MF-PBT (`fastpop/strategies/mfpbt.py`): which sub-population evolves at which round, exploit
and explore inside one, the asymmetric migration between them (hand-checked), its config errors,
a run in each collection mode with its lineage, and a resumed learner equal to an uninterrupted
one."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from fastpop.run import checkpoint
from fastpop.strategies import mfpbt
from fastpop.strategies.base import Evaluation, stream_rng
from fastpop.strategies.priors import Prior
from tests.helpers import refused_train, train_here
from tests.runs import FAST, TD3_PENDULUM, read_jsonl
from tests.test_resume import CHUNKS, assert_same_strategy_state, drive, host, learner_for

PRIORS = {"actor_lr": Prior("log_uniform", 1e-5, 1e-1)}
# Two sub-populations of 4 (members 0-3, 4-7): fitness ranks the population 4 > 6 > 7 > 5 > 1 > 3
# > 2 > 0, so sub-population 0 ranks 1, 3, 2, 0 and sub-population 1 ranks 4, 6, 7, 5.
SCORES = np.array([1.0, 4, 2, 3, 8, 5, 7, 6])
# The same, but member 1 is the best of all (9): each sub-population's third quarter (member 2,
# member 7) has an outsider above it.
CROSSED = np.array([1.0, 9, 2, 3, 8, 5, 7, 6])


def hparams_of(size: int) -> list[dict]:
    return [{"actor_lr": 1e-3 * (m + 1), "tau": 0.005} for m in range(size)]


def moves(parents: mfpbt.Parents) -> dict[int, tuple]:
    """target -> (state's source, hparams' source, explored, kind) of every member moved."""
    return {
        int(t): (int(parents.network[t]), int(parents.hparams[t]), bool(parents.explored[t]),
                 parents.kinds[t])
        for t in np.flatnonzero(parents.network != np.arange(len(parents.network)))
    }  # fmt: skip


def test_a_subpopulation_evolves_at_every_frequency_th_round():
    due = [mfpbt.evolving(r, (1, 10, 25, 50)) for r in range(100)]
    for index, frequency in enumerate((1, 10, 25, 50)):
        rounds = [r for r in range(100) if due[r][index]]
        assert rounds == list(range(frequency - 1, 100, frequency))
    assert mfpbt.MFPBTConfig().frequencies == (1, 10, 25, 50)  # the paper's


def test_only_the_fast_subpopulation_exploits_and_migrates_at_its_own_rounds():
    parents = mfpbt.genetics(SCORES, (1, 2), round_index=0)  # sub-population 1 waits
    # The worst (0) copies the best (1) and explores; the third quarter (2) takes the best
    # outsider (4, better than it), and its hparams, which come from the slower sub-population.
    assert moves(parents) == {0: (1, 1, True, "exploit"), 2: (4, 4, False, "migrate")}
    parents = mfpbt.genetics(SCORES, (1, 2), round_index=1)  # both: 5 copies 4
    # Sub-population 1's third quarter (7) ranks above every outsider: no migration into it.
    assert moves(parents) == {
        0: (1, 1, True, "exploit"),
        2: (4, 4, False, "migrate"),
        5: (4, 4, True, "exploit"),
    }


def test_migration_is_asymmetric_in_hparams():
    # Both evolve (round 1): 2 takes 4's state, 7 takes 1's. Into the fast sub-population (0)
    # from the slow one: the migrant's hparams; into the slow one from the fast one: the
    # hparams of its own best (4); with equal frequencies each keeps its own.
    parents = mfpbt.genetics(CROSSED, (1, 2), round_index=1)
    assert moves(parents)[2] == (4, 4, False, "migrate")
    assert moves(parents)[7] == (1, 4, False, "migrate")
    equal = mfpbt.genetics(CROSSED, (1, 1), round_index=0)
    assert moves(equal)[2] == (4, 2, False, "migrate")
    assert moves(equal)[7] == (1, 7, False, "migrate")


def test_each_migrant_is_taken_once_best_first_while_it_ranks_above():
    # Sub-populations of 8 (quarters of 2): 0's third quarter is members 4 and 5 (ranks 4-5 of
    # 0-7); the outsiders' best two are 8 (100) and 9 (3.5): 4 (4.0) takes 8, and 9 ranks below 5
    # (3.8), so 5 stays.
    scores = np.array([10.0, 9, 8, 7, 4.0, 3.8, 1, 0, 100, 3.5, 3, 2, 1.5, 1, 0.5, 0.2])
    parents = mfpbt.genetics(scores, (1, 4), round_index=0)
    assert moves(parents) == {
        6: (0, 0, True, "exploit"),  # ranks 6, 7 copy ranks 0, 1, rank for rank
        7: (1, 1, True, "exploit"),
        4: (8, 8, False, "migrate"),
    }
    scores[9] = 3.9  # now 9 ranks above 5: it migrates too, the next outsider after 8
    assert moves(mfpbt.genetics(scores, (1, 4), 0))[5] == (9, 9, False, "migrate")
    scores[8], scores[9] = 3.9, 3.5  # the best outsider ranks between 4 and 5: 5 takes it
    assert moves(mfpbt.genetics(scores, (1, 4), 0)) == {
        6: (0, 0, True, "exploit"),
        7: (1, 1, True, "exploit"),
        5: (8, 8, False, "migrate"),
    }


def test_a_non_finite_member_ranks_last_and_is_never_a_migrant():
    scores = SCORES.copy()
    scores[4] = np.nan
    parents = mfpbt.genetics(scores, (1, 1), round_index=0)
    assert moves(parents)[4] == (6, 6, True, "exploit")  # its sub-population's worst now
    assert 4 not in parents.network[np.arange(8) != 4]


def strategy(size=8, frequencies=(1, 3), interval=100, seed=0, **options):
    settings = mfpbt.MFPBTSettings(frequencies, interval, 50, **options)
    return mfpbt.make_mfpbt(size, PRIORS, seed, settings)


def test_rounds_come_every_interval_and_each_subpopulation_at_its_frequency():
    run, hparams = strategy(), hparams_of(8)
    state, evolved = run.init(), {}
    for index in range(12):  # evaluations at 50, 100, ..., 600 env steps per member
        steps = 50 * (index + 1)
        state, selection = run.step(state, Evaluation(index, steps, SCORES), hparams)
        if selection is not None:
            evolved[steps] = sorted({e["subpopulation"] for e in selection.events})
            assert {e["round"] for e in selection.events} == {state.rounds - 1}
    # Rounds at 100, 200, ..., 600 (rounds 0-5): sub-population 1 at rounds 2 and 5.
    assert evolved == {100: [0], 200: [0], 300: [0, 1], 400: [0], 500: [0], 600: [0, 1]}
    assert state.rounds == 6 and state.next_round == 700


def test_exploit_explores_the_sources_hparams_and_lineage_names_both_sources():
    run, hparams = strategy(frequencies=(1, 1), seed=3), hparams_of(8)
    _, selection = run.step(run.init(), Evaluation(0, 100, CROSSED), hparams)
    np.testing.assert_array_equal(selection.sources, [1, 1, 4, 3, 4, 4, 6, 1])
    rng = stream_rng(3, mfpbt.MFPBT_STREAM, 0)  # the round's draws: member 0's explore
    assert rng.uniform() >= 0.0  # resample_probability 0: never resampled
    factor = (0.8, 1.25)[int(rng.integers(2))]
    assert selection.hparams[0] == {"actor_lr": pytest.approx(2e-3 * factor), "tau": 0.005}
    # Equal frequencies: the migrants' members keep their own hparams.
    assert selection.hparams[2] == hparams[2] and selection.hparams[7] == hparams[7]
    events = {e["target"]: e for e in selection.events}
    assert sorted(events) == [0, 2, 5, 7]
    assert (events[0]["kind"], events[0]["source"], events[0]["hparams_source"]) == (
        "exploit",
        1,
        1,
    )
    assert (events[7]["kind"], events[7]["source"], events[7]["hparams_source"]) == (
        "migrate",
        1,
        7,
    )
    assert events[7]["subpopulation"] == 1 and events[7]["source_subpopulation"] == 0
    assert (
        events[0]["old_hparams"] == hparams[0] and events[0]["new_hparams"] == selection.hparams[0]
    )
    assert run.member_labels(None) == [{"subpopulation": m // 4} for m in range(8)]


def test_a_round_where_nothing_moves_is_counted_and_changes_nothing():
    run = strategy(frequencies=(2, 2))
    state, selection = run.step(run.init(), Evaluation(0, 100, SCORES), hparams_of(8))
    assert selection is None and state.rounds == 1 and state.next_round == 200


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["mfpbt.frequencies=[1,2]"], "population.size (4) must split evenly into the 2 "),
        (["population.size=6", "mfpbt.frequencies=[1,2]"], "each of at least 4 members"),
        (["mfpbt.frequencies=[1,0]"], "mfpbt.frequencies: must be >= 1"),
        (["mfpbt.replay=share"], "mfpbt.replay"),
    ],
)
def test_bad_mfpbt_configs_exit_2_naming_the_field(overrides, message, tmp_path, capsys):
    priors = "population.priors={actor_lr: {log_uniform: [1.0e-4, 1.0e-3]}}"
    err = refused_train(tmp_path, capsys, TD3_PENDULUM, "strategy=mfpbt", priors, *overrides)
    assert message in err, err


RUN_PRIORS = "population.priors={actor_lr: {log_uniform: [1.0e-4, 3.0e-3]}}"
TWO_SUBPOPULATIONS = ["strategy=mfpbt", RUN_PRIORS, "population.size=8", "mfpbt.frequencies=[1,2]"]


def assert_lineage_of_rounds(events: list[dict], rounds: list[int]) -> None:
    """Each round's events: sub-population 0 (every round) exploits its worst member and
    sub-population 1 (odd rounds) its own; every copy's hparams are its hparams source's."""
    assert sorted({e["round"] for e in events}) == rounds, events
    for number in rounds:
        exploits = [e for e in events if e["round"] == number and e["kind"] == "exploit"]
        evolved = [0, 1] if number % 2 else [0]
        assert sorted(e["subpopulation"] for e in exploits) == evolved, exploits
    for event in events:
        assert event["strategy"] == "mfpbt" and event["kind"] in ("exploit", "migrate")
        assert event["target"] != event["source"]
        assert event["target_fitness"] <= event["source_fitness"]
        if event["kind"] == "exploit":
            assert event["subpopulation"] == event["source_subpopulation"]
        else:
            assert event["subpopulation"] != event["source_subpopulation"]


def test_a_process_mode_run_evolves_its_subpopulations_and_writes_lineage(tmp_path):
    overrides = [
        *FAST,
        *TWO_SUBPOPULATIONS,
        "mfpbt.interval=400",
        "mfpbt.wait=true",
        "eval.interval=400",
        "train.total_env_steps=900",  # rounds at 400 and 800 steps per member
    ]
    run = train_here(tmp_path, TD3_PENDULUM, *overrides).run_dir  # its files are what is checked
    assert_lineage_of_rounds(read_jsonl(run / "lineage.jsonl"), [0, 1])
    rows = read_jsonl(run / "metrics.jsonl")
    assert {r["member"]: r["subpopulation"] for r in rows} == {m: m // 4 for m in range(8)}


def test_a_device_mode_run_evolves_its_subpopulations_and_writes_lineage(tmp_path):
    from tests.test_device_mode import run

    overrides = [*TWO_SUBPOPULATIONS, "mfpbt.interval=256", "eval.interval=256"]
    run_dir = run(tmp_path, "mfpbt", "train.total_env_steps=768", *overrides)
    events = read_jsonl(run_dir / "lineage.jsonl")
    assert_lineage_of_rounds(events, sorted({e["round"] for e in events}))
    assert {e["round"] for e in events} >= {0, 1}


def test_a_resumed_learner_continues_exactly_as_an_uninterrupted_one(tmp_path):
    overrides = [*TWO_SUBPOPULATIONS, "mfpbt.interval=1"]  # a round at every evaluation
    uninterrupted = learner_for(*overrides)
    drive(uninterrupted, range(CHUNKS // 2))
    saved = uninterrupted.saved_tree(True), uninterrupted.saved_counters()
    path = checkpoint.save(tmp_path, uninterrupted.limiter.inserted, *saved)
    drive(uninterrupted, range(CHUNKS // 2, CHUNKS))

    resumed = learner_for(*overrides)  # a fresh learner, as in a new process
    resumed.restore(*checkpoint.restore(path, resumed.saved_tree(True)))
    drive(resumed, range(CHUNKS // 2, CHUNKS))

    assert resumed.updates == uninterrupted.updates > 0
    assert resumed.saved_counters() == uninterrupted.saved_counters()
    expected, actual = host(uninterrupted.saved_tree(True)), host(resumed.saved_tree(True))
    for want, got in zip(jax.tree.leaves(expected), jax.tree.leaves(actual), strict=True):
        np.testing.assert_array_equal(got, want)
    assert_same_strategy_state(resumed.strategy_state, uninterrupted.strategy_state)
    assert resumed.strategy_state.rounds == uninterrupted.strategy_state.rounds == 4
    assert resumed.all_member_hparams() == uninterrupted.all_member_hparams()
