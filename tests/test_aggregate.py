"""Aggregate statistics (fastpop.analysis.aggregate) against float64 numpy computed directly: IQM,
optimality gap, performance profiles, and the stratified bootstrap's intervals; and `fastpop
plot --aggregate` on sweep runs (grouping, the table, the plots, bad arguments)."""

import json
import re

import numpy as np
import pytest

from fastpop.analysis import aggregate
from fastpop.analysis.plot_aggregate import (
    AGGREGATE_STEPS_PLOT,
    AGGREGATE_WALLTIME_PLOT,
    PROFILE_PLOT,
    aggregate_table,
)
from fastpop.analysis.sweep import load_groups
from fastpop.commands.cli import main
from tests.dependencies import require


def direct_iqm(values) -> float:
    """The middle half of the sorted values, averaged, written out by hand."""
    ordered = sorted(float(v) for v in values)
    cut = len(ordered) // 4
    middle = ordered[cut : len(ordered) - cut]
    return sum(middle) / len(middle)


@pytest.mark.parametrize(
    "values,expected",
    [
        ([1, 2, 3, 4, 5, 6, 7, 8], 4.5),  # 1, 2 and 7, 8 cut
        ([-1000, 1, 2, 3, 4, 5, 6, 1000], 3.5),  # outliers do not move it
        ([5, 1, 3], 3.0),  # fewer than 4 runs: nothing cut, the mean
        ([9, 0, 4, 1, 7, 3, 8, 2, 6, 5], 4.5),  # 10 runs: 2 cut at each end
    ],
)
def test_iqm_of_known_arrays(values, expected):
    assert aggregate.iqm(np.array(values)) == pytest.approx(expected, abs=1e-12)
    assert aggregate.iqm(np.array(values)) == pytest.approx(direct_iqm(values), abs=1e-12)


def test_iqm_matches_scipys_trimmed_mean_along_the_last_axis():
    stats = require("scipy.stats")
    scores = np.random.default_rng(3).normal(size=(5, 13))
    expected = stats.trim_mean(scores, 0.25, axis=-1)
    np.testing.assert_allclose(aggregate.iqm(scores), expected, rtol=0, atol=1e-12)
    assert aggregate.iqm(scores.astype(np.float32)).dtype == np.float64


def test_optimality_gap_mean_median_and_profile_of_known_arrays():
    scores = np.array([0.5, 1.2, 0.8, 1.0])
    assert aggregate.optimality_gap(scores, 1.0) == pytest.approx((0.5 + 0 + 0.2 + 0) / 4)
    assert aggregate.optimality_gap(scores, 0.0) == 0.0  # everything above gamma: no gap
    assert aggregate.mean(scores) == pytest.approx(0.875)
    assert aggregate.median(scores) == pytest.approx(0.9)
    profile = aggregate.performance_profile(scores, np.array([0.0, 0.8, 1.0, 2.0]))
    np.testing.assert_array_equal(profile, [1.0, 0.5, 0.25, 0.0])  # strictly above
    curves = aggregate.performance_profile(np.stack([scores, scores + 1]), np.array([1.0]))
    np.testing.assert_array_equal(curves, [[0.25], [1.0]])


def test_stratified_indices_resample_within_each_stratum_only():
    strata = np.array([2, 0, 2, 1, 0, 2])
    indices = aggregate.stratified_indices(strata, 500, np.random.default_rng(0))
    assert indices.shape == (500, 6)
    for row in indices:  # every resample keeps each stratum's size
        np.testing.assert_array_equal(np.bincount(strata[row], minlength=3), [2, 1, 3])
    assert set(indices[:, strata[indices[0]] == 0].ravel()) == {1, 4}  # both runs get drawn


def test_a_stratified_bootstrap_never_mixes_strata():
    """Two strata whose runs all score the same: every resample has the same mean, so the
    interval collapses; resampled as one stratum the mean varies."""
    scores = np.array([0.0, 0.0, 0.0, 100.0, 100.0, 100.0])
    stratified = aggregate.interval_estimates(scores, np.array([0, 0, 0, 1, 1, 1]), aggregate.mean)
    assert stratified.point == stratified.low == stratified.high == 50.0
    pooled = aggregate.interval_estimates(scores, np.zeros(6, int), aggregate.mean)
    assert pooled.low < 40 and pooled.high > 60


def test_bootstrap_interval_contains_the_true_value_about_95_percent_of_the_time():
    """Coverage on synthetic data with a known mean: near the nominal 95% when resampled within
    strata; resampled as one stratum, the strata's offsets widen every interval (covers all)."""
    rng = np.random.default_rng(7)
    strata = np.repeat(np.arange(3), 20)  # 3 strata x 20 runs
    offsets = np.array([0.0, 5.0, -5.0])[strata]  # strata differ; the true mean is 0
    covered, covered_unstratified = 0, 0
    for trial in range(200):
        scores = offsets + rng.normal(0.0, 1.0, strata.size)
        estimate = aggregate.interval_estimates(scores, strata, aggregate.mean, 1000, seed=trial)
        assert estimate.low <= estimate.point <= estimate.high
        covered += estimate.low <= 0.0 <= estimate.high
        pooled = aggregate.interval_estimates(scores, 0 * strata, aggregate.mean, 1000, seed=trial)
        covered_unstratified += pooled.low <= 0.0 <= pooled.high
    # The percentile bootstrap undercovers a little with 20 runs per stratum (its spread is the
    # plug-in one): 178 of 200 with these seeds, 183 to 188 expected over many.
    assert 170 <= covered <= 196, covered
    assert covered_unstratified == 200


def test_bootstrap_iqm_interval_on_synthetic_data_with_a_fixed_seed():
    scores = np.random.default_rng(11).normal(100.0, 10.0, 400)  # true IQM 100 (symmetric)
    estimate = aggregate.interval_estimates(scores, np.zeros(400, int), aggregate.iqm, seed=0)
    assert estimate.point == pytest.approx(direct_iqm(scores), abs=1e-9)
    assert estimate.low < 100.0 < estimate.high
    assert estimate.high - estimate.low < 4.0  # about 4 standard errors of 0.55


def test_the_same_seed_gives_the_same_interval_and_another_seed_another():
    scores = np.random.default_rng(1).normal(size=(4, 12))
    strata = np.repeat([0, 1], 6)
    first = aggregate.interval_estimates(scores, strata, aggregate.iqm, 500, seed=5)
    again = aggregate.interval_estimates(scores, strata, aggregate.iqm, 500, seed=5)
    other = aggregate.interval_estimates(scores, strata, aggregate.iqm, 500, seed=6)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first.low, other.low)


def test_every_point_of_a_curve_sees_the_same_resampled_runs(monkeypatch):
    """A curve's interval at point t equals the interval of point t alone (same seed, same
    draws), whatever the chunking of the resamples."""
    scores = np.random.default_rng(2).normal(size=(6, 9)).cumsum(axis=0)
    strata = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    curve = aggregate.interval_estimates(scores, strata, aggregate.iqm, 300, seed=4)
    monkeypatch.setattr(aggregate, "CHUNK_ELEMENTS", 7)  # a handful of resamples per chunk
    chunked = aggregate.interval_estimates(scores, strata, aggregate.iqm, 300, seed=4)
    for t in range(scores.shape[0]):
        alone = aggregate.interval_estimates(scores[t], strata, aggregate.iqm, 300, seed=4)
        assert (curve.low[t], curve.high[t]) == (alone.low, alone.high)
    np.testing.assert_array_equal(curve.low, chunked.low)


def test_profile_interval_has_one_band_per_threshold():
    scores = np.arange(10.0)
    thresholds = np.array([-1.0, 4.5, 20.0])
    profile = lambda s: aggregate.performance_profile(s, thresholds)
    estimate = aggregate.interval_estimates(scores, np.zeros(10, int), profile, 500)
    np.testing.assert_array_equal(estimate.point, [1.0, 0.5, 0.0])
    assert estimate.low.shape == (3,)
    assert estimate.low[0] == estimate.high[0] == 1.0 and estimate.high[2] == 0.0
    assert estimate.low[1] < 0.5 < estimate.high[1]


def test_bad_strata_are_refused():
    with pytest.raises(ValueError, match="one stratum label per run"):
        aggregate.interval_estimates(np.zeros(4), np.zeros(3, int), aggregate.mean)
    with pytest.raises(ValueError, match="confidence"):
        aggregate.interval_estimates(np.zeros(4), np.zeros(4, int), aggregate.mean, confidence=1)


# --- fastpop plot --aggregate: members grouped by configuration or run ---

SEEDS = 3
LEARNING_RATES = (1e-4, 1e-3)


def sweep_return(run: int, member: int, evaluation: int) -> float:
    """Configuration 1 learns twice as fast; seeds and runs spread around it."""
    config, seed = divmod(member, SEEDS)
    return -1500.0 + 100.0 * evaluation * (1 + config) + 10.0 * seed + 3.0 * run


def write_sweep(run_dir, run=0, evaluations=10, rates=LEARNING_RATES, indices=True, length=None):
    """A run as `fastpop train` leaves it: a grid over actor_lr x SEEDS seeds, one evaluation
    round a minute; `length` (seconds): summary.json's wall time."""
    run_dir.mkdir(parents=True)
    size = len(rates) * SEEDS
    (run_dir / "config.yaml").write_text(f"algo: td3\nenv: {{id: Pendulum-v1}}\nname: r{run}\n")
    hparams = [{"actor_lr": rates[m // SEEDS], "tau": 0.005} for m in range(size)]
    members = [
        {"member": m, **({"config_index": m // SEEDS, "seed_index": m % SEEDS} if indices else {}),
         "hparams": hparams[m]}
        for m in range(size)
    ]  # fmt: skip
    (run_dir / "members.json").write_text(json.dumps({"members": members}))
    rows = [
        {"eval_index": e, "wall_time": 60.0 * (e + 1), "env_steps": 1000 * size * (e + 1),
         "member_env_steps": 1000 * (e + 1), "updates": 10 * e, "member": m,
         "return_mean": sweep_return(run, m, e), "return_std": 1.0, "episodes": 2,
         "hparams": hparams[m]}
        for e in range(evaluations)
        for m in range(size)
    ]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if length is not None:
        (run_dir / "summary.json").write_text(json.dumps({"wall_time": length}))
    return run_dir


def table_row(table: str, group: str, minute: str) -> list[str]:
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[:2] == [group, minute]:
            return cells[2:]
    raise AssertionError(f"no row {group} / {minute} in\n{table}")


def interval(cell: str) -> tuple[float, float, float]:
    point, low, high = re.fullmatch(r"(\S+) \[(\S+), (\S+)\]", cell).groups()
    return float(point), float(low), float(high)


def test_groups_by_configuration_pool_every_run_one_stratum_each(tmp_path):
    runs = [write_sweep(tmp_path / f"r{run}", run) for run in range(2)]
    groups = load_groups(runs)
    assert [g.label for g in groups] == ["config 0: actor_lr=0.0001", "config 1: actor_lr=0.001"]
    for index, group in enumerate(groups):
        assert [(m.run.split()[0], m.member) for m in group.members] == [
            (run, index * SEEDS + seed) for run in ("r0", "r1") for seed in range(SEEDS)
        ]
        np.testing.assert_array_equal(group.strata, [0, 0, 0, 1, 1, 1])
    by_run = load_groups(runs, by="run")
    assert [g.label.split()[0] for g in by_run] == ["r0", "r1"]
    np.testing.assert_array_equal(by_run[0].strata, [0, 0, 0, 1, 1, 1])  # configurations


def test_aggregate_table_matches_numpy_on_the_latest_evaluations(tmp_path):
    runs = [write_sweep(tmp_path / f"r{run}", run, length=600.0 + 4) for run in range(2)]
    table = aggregate_table(runs, minutes=(0.5, 5.5, 20), gamma=-600.0)
    assert "optimality gap below gamma = -600 (--gamma)" in table
    # At 5.5 minutes every member's latest evaluation is its fifth (index 4).
    latest = np.array([sweep_return(r, 3 + s, 4) for r in range(2) for s in range(SEEDS)])
    cells = table_row(table, "config 1: actor_lr=0.001", "5.5")
    assert cells[0] == "6"  # members
    expected = [direct_iqm(latest), latest.mean(), np.median(latest)]
    expected.append(float(np.mean(np.maximum(-600.0 - latest, 0.0))))
    for cell, value in zip(cells[1:], expected, strict=True):
        point, low, high = interval(cell)
        assert point == round(value) and low <= point <= high
    assert table_row(table, "config 1: actor_lr=0.001", "0.5")[1] == "no evaluation yet"
    assert table_row(table, "config 0: actor_lr=0.0001", "20")[1] == "ran 10.1 min"


def test_mixed_sweeps_are_refused_and_runs_without_indices_group_equal_hparams(tmp_path):
    first = write_sweep(tmp_path / "a", 0)
    other = write_sweep(tmp_path / "b", 1, rates=(1e-4, 3e-3))
    with pytest.raises(ValueError, match=r"configuration 1 is actor_lr=0.001 in a .*--by run"):
        load_groups([first, other])
    assert len(load_groups([first, other], by="run")) == 2
    old = write_sweep(tmp_path / "old", 0, indices=False)  # members.json before config_index
    groups = load_groups([old])
    assert [[m.member for m in g.members] for g in groups] == [[0, 1, 2], [3, 4, 5]]
    (old / "members.json").unlink()  # no members.json: the hparams of the metrics rows
    assert [[m.member for m in g.members] for g in load_groups([old])] == [[0, 1, 2], [3, 4, 5]]


def test_a_nan_evaluation_keeps_the_members_previous_return(tmp_path):
    run = write_sweep(tmp_path / "r", 0, evaluations=3)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows[SEEDS * 2]["return_mean"] = None  # member 0 (configuration 0, seed 0) in round 1
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    group = load_groups([run])[0]
    scores = group.scores("wall_minutes", np.array([0.5, 1.0, 2.0, 3.0]))
    assert np.isnan(scores[0]).all()  # before any evaluation
    assert scores[2, 0] == scores[1, 0] == sweep_return(0, 0, 0)  # round 1 was NaN
    assert scores[3, 0] == sweep_return(0, 0, 2)
    np.testing.assert_array_equal(group.grid("member_env_steps"), [1000, 2000, 3000])


def test_fastpop_plot_aggregate_writes_curves_profiles_and_a_table(tmp_path, capsys):
    runs = [str(write_sweep(tmp_path / f"r{run}", run)) for run in range(2)]
    out = tmp_path / "plots"
    assert main(["plot", "--aggregate", *runs, "--out", str(out), "--table", "--minutes", "3"]) == 0
    names = [AGGREGATE_WALLTIME_PLOT, AGGREGATE_STEPS_PLOT, PROFILE_PLOT]
    assert all((out / name).stat().st_size > 0 for name in names)
    printed = capsys.readouterr().out
    assert "| config 0: actor_lr=0.0001 | 3 | 6 |" in printed
    assert "the best return reached; set --gamma" in printed
    assert main(["plot", "--aggregate", "--by", "run", *runs, "--out", str(out)]) == 0
    # Without --minutes: quarters of the 10-minute runs, every cell a value
    assert main(["plot", "--aggregate", *runs, "--out", str(out), "--table"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| config")]
    assert [row.split(" | ")[1] for row in rows] == ["2", "5", "7", "10"] * 2
    assert not any("ran " in row or "no evaluation" in row for row in rows)


@pytest.mark.parametrize(
    "extra,message",
    [
        (
            ["--by", "seed", "--aggregate"],
            "unknown grouping 'seed'; choose from configuration, run",
        ),
        (["--by", "run"], "--by and --gamma choose how --aggregate groups"),
        (["--aggregate", "--hparams"], "--aggregate and --hparams draw different plots"),
        (["--aggregate", "--gamma", "nan"], "--gamma must be a finite return, got nan"),
    ],
)
def test_bad_aggregate_arguments_exit_2(tmp_path, capsys, extra, message):
    run = str(write_sweep(tmp_path / "r", 0))
    try:
        code = main(["plot", run, "--out", str(tmp_path / "plots"), *extra])
    except SystemExit as exit_info:  # argparse's own refusals
        code = exit_info.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()


def test_by_run_strata_fall_back_to_one_when_configurations_have_single_members():
    """A run of single-seed configurations (random search, PBT) is one sample of members;
    resampling each configuration within itself would give zero-width intervals."""
    from types import SimpleNamespace

    from fastpop.analysis.sweep import run_strata

    single = [SimpleNamespace(config_index=i) for i in range(4)]
    seeded = [SimpleNamespace(config_index=i // 2) for i in range(4)]
    assert run_strata(single).tolist() == [0, 0, 0, 0]
    assert run_strata(seeded).tolist() == [0, 0, 1, 1]
