"""`fastpop bench gpu`: the GPU programme's phases at smoke sizes on the CPU (so the command
cannot rot before a GPU runs it), its time caps, its output directory, and the targets its
README judges."""

from __future__ import annotations

import json

import pytest

from fastpop.bench import gpu_phases, gpu_plans, gpu_runner
from fastpop.bench.gpu_report import judge_targets
from fastpop.commands import bench_gpu
from tests.dependencies import require
from tests.helpers import run_bench

require("gymnax")
# Its smoke run (a module fixture, ~1 minute) serves three tests: one worker runs them all, so
# that pytest-xdist does not repeat the run on another.
pytestmark = pytest.mark.xdist_group("bench_gpu")

PHASE_FILES = {
    "update": {"update_td3_cpu.json", "update_td3_cpu.png"},
    "device": {"device_gymnax_Pendulum-v1_cpu.json", "device_gymnax_Pendulum-v1_cpu.png"},
    "pipeline": {"pipeline_Pendulum-v1_cpu.json"},
    "pbt": {
        "runs/td3_pbt_halfcheetah/walltime_vs_return.png",
        "runs/sac_pbt_brax_ant/walltime_vs_return.png",
    },
}


def run(argv: list[str]) -> int:
    return run_bench(["gpu", *argv])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_gpu") / "cpu"
    return out, run(["--out", str(out), "--smoke", "--pack", str(out.parent / "gpu.tgz")])


def test_smoke_runs_every_phase_and_writes_its_files(smoke):
    out, code = smoke
    assert code == 0
    manifest = json.loads((out / "bench_gpu.json").read_text())
    assert manifest["smoke"] is True
    assert list(manifest["phases"]) == list(gpu_plans.BENCHMARK_PHASES)
    for phase, files in PHASE_FILES.items():
        entry = manifest["phases"][phase]
        assert entry["status"] == "done", entry
        assert files <= set(entry["files"]), (phase, entry["files"])
        assert all((out / name).stat().st_size > 0 for name in entry["files"])
        record = json.loads((out / f"phase_{phase}.json").read_text())
        assert record["complete"] and record["environment"]["platform"] == "cpu"
    update = json.loads((out / "phase_update.json").read_text())
    assert set(update["matmul_gflops_per_s"]) == {"float32", "default"}
    td3 = json.loads((out / "update_td3_cpu.json").read_text())
    assert [(r["impl"], r["population"]) for r in td3["rows"]] == [
        (impl, 1) for impl in ("vectorized", "sequential")
    ]
    vectorized = td3["rows"][0]
    assert vectorized["kernels_per_update_step"] >= 1 and td3["memory_gbps"] > 0  # what bounds it
    # (a smoke-sized matmul is slow: the floors are only checked to be there)
    assert vectorized["compute_floor_seconds"] > 0 and vectorized["state_floor_seconds"] > 0
    assert vectorized["times_floor"] == pytest.approx(
        vectorized["seconds_per_update_step"] / vectorized["floor_seconds"]
    )
    device = json.loads((out / "device_gymnax_Pendulum-v1_cpu.json").read_text())
    assert [(r["population"], r["envs_per_member"]) for r in device["rows"]] == [(2, 2)]
    pipeline = json.loads((out / "pipeline_Pendulum-v1_cpu.json").read_text())
    assert [row["collectors"] for row in pipeline["collection"]] == [1]
    learner = pipeline["learner"]
    assert learner["collectors"] == 1 and learner["rate_vs_benchmark"] > 0
    assert 0 < learner["busy_fraction_of_window"] <= 1 and learner["bound_by"] in {"rows", "update"}
    # the benchmark row like the run (the plan's batch, the config's K and replay.capacity)
    assert learner["benchmark"] == {
        "updates_per_call": 50,
        "batch_size": 32,
        "replay_rows": 100_000,
        "population": 2,
    }
    # the final evaluation, the stop's checkpoint, the workers' stop: after the window
    assert learner["after_window_seconds"] > 0 and learner["checkpoint_seconds"] == 0
    assert learner["window_seconds"] <= learner["train_seconds"] - learner["after_window_seconds"]
    runs = json.loads((out / "phase_pbt.json").read_text())["runs"]
    assert runs["td3_pbt_halfcheetah"]["collect_mode"] == "processes"
    assert runs["sac_pbt_brax_ant"]["collect_mode"] == "device"
    for preset in runs:
        summary = json.loads((out / "runs" / preset / "summary.json").read_text())
        assert summary["stopped_by"] == "completed" and summary["wall_time"] > 0


def test_sweeps_of_one_env_share_its_file_and_a_failed_sweep_is_recorded(
    smoke, tmp_path, monkeypatch
):
    """The device phase's sweeps of one env (the full programme has brax/halfcheetah's and
    brax/ant's twice) append their rows to its one JSON; a sweep that fails is recorded and the
    next one still runs. Each sweep's measurements here are the smoke's real row, relabelled."""
    from fastpop.bench import device as device_bench

    out, _ = smoke
    measured = json.loads((out / "device_gymnax_Pendulum-v1_cpu.json").read_text())

    def bench_device(settings, populations, per_member, command, on_row=None):
        if settings.env_id == "brax/ant":
            raise ModuleNotFoundError("brax is not installed")
        rows = [
            {**measured["rows"][0], "population": size, "envs_per_member": envs}
            for envs in per_member
            for size in populations
        ]
        on_row(rows)
        return {**measured, "rows": rows}

    monkeypatch.setattr(device_bench, "bench_device", bench_device)
    sweeps = [("gymnax/Pendulum-v1", [2, 4], [1]), ("brax/ant", [2], [1])]
    sweeps += [("gymnax/Pendulum-v1", [2], [2])]
    plan = {**gpu_plans.SMOKE_PLANS["device"], "sweeps": sweeps}
    record = gpu_phases.PhaseRecord(tmp_path, "device", plan, cap=60.0)
    record["command"] = "fastpop bench gpu --smoke"
    gpu_phases.device_phase(tmp_path, plan, record)
    merged = json.loads((tmp_path / "device_gymnax_Pendulum-v1_cpu.json").read_text())
    assert [(r["population"], r["envs_per_member"]) for r in merged["rows"]] == [
        (2, 1),
        (4, 1),
        (2, 2),
    ]
    assert record["sweeps"][1]["error"] == "ModuleNotFoundError: brax is not installed"
    assert record["files"] == [
        "device_gymnax_Pendulum-v1_cpu.json",
        "device_gymnax_Pendulum-v1_cpu.png",
    ]


def test_sweeps_of_one_algorithm_share_its_file_and_those_past_the_cap_are_recorded(
    smoke, tmp_path, monkeypatch
):
    """The update phase's sweeps, most wanted first: one algorithm's rows merge into its file,
    their ratios worked out over all of them; a sweep that would start after the phase's cap
    is recorded as skipped. (`bench_update` returns the smoke's rows, renamed.)"""
    from fastpop.bench import update as update_bench

    out, _ = smoke
    measured = json.loads((out / "update_td3_cpu.json").read_text())
    row = next(r for r in measured["rows"] if r["impl"] == "vectorized")
    rates = {"vectorized": 400.0, "sequential": 100.0, "torch-func": 200.0}
    sweeps = [("td3", [1], ["vectorized"]), ("sac", [1], ["vectorized"])]
    sweeps += [("td3", [1], ["sequential", "torch-func"]), ("sac", [1], ["sequential"])]
    record = None

    def bench_update(settings, populations, impls, log, on_row):
        rows = [{**row, "impl": i, "agent_updates_per_s": rates[i]} for i in impls]
        on_row(rows)
        if impls[0] == "sequential":  # the cap passes during the third sweep
            record.deadline = 0.0
        return {**measured, "algo": settings.algo, "rows": rows}

    monkeypatch.setattr(update_bench, "bench_update", bench_update)
    plan = {**gpu_plans.SMOKE_PLANS["update"], "sweeps": sweeps}
    record = gpu_phases.PhaseRecord(tmp_path, "update", plan, cap=60.0)
    gpu_phases.update_phase(tmp_path, plan, record)
    td3 = json.loads((tmp_path / "update_td3_cpu.json").read_text())
    assert [r["impl"] for r in td3["rows"]] == ["vectorized", "sequential", "torch-func"]
    assert td3["rows"][0]["speedup_over_sequential"] == 4.0
    assert td3["rows"][0]["speedup_over_best_torch"] == 2.0
    sac = json.loads((tmp_path / "update_sac_cpu.json").read_text())
    assert [r["impl"] for r in sac["rows"]] == ["vectorized"]
    assert record["algos"]["sac"]["json"] == "update_sac_cpu.json"  # its first sweep's file
    assert record["cut_short"] and "skipped" not in record["sweeps"][2]
    assert record["sweeps"][3]["skipped"] == "the phase's time cap had passed"


def test_the_summary_names_the_machine_phases_and_targets(smoke):
    out, _ = smoke
    readme = (out / "README.md").read_text()
    assert "**Smoke sizes**" in readme and "jax 0.10" in readme and "nvidia-smi" in readme
    for phase in gpu_plans.BENCHMARK_PHASES:
        assert f"| {phase} | done |" in readme
    assert readme.count("| not measured") == 10  # smoke sizes judge none of the 10 targets
    assert "\n## Targets\n" in readme and "issue" not in readme.lower()  # no tracker numbers
    assert "| 2 | 2 |" in readme  # the device table
    assert "What bounds a vectorized population step" in readme


def test_a_capped_phase_keeps_the_finished_ones(smoke):
    """A phase killed at its cap is recorded as capped; the phases before it keep their files
    and their entries (the run can be split into one command per phase group)."""
    out, _ = smoke
    assert run(["--out", str(out), "--smoke", "--phases", "pbt", "--budget-seconds", "0.5"]) == 1
    manifest = json.loads((out / "bench_gpu.json").read_text())
    assert manifest["phases"]["pbt"]["status"] == "capped"
    for phase in ("update", "device", "pipeline"):
        assert manifest["phases"][phase]["status"] == "done"
        assert all((out / name).is_file() for name in manifest["phases"][phase]["files"])
    assert "| pbt | capped |" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("complete", "capped", "exit_code", "status"),
    [
        (True, False, 0, "done"),
        (True, True, -15, "done"),  # all its files written, its collectors still stopping
        (False, True, -15, "capped"),
        (True, False, 1, "failed"),
        (False, False, 0, "failed"),
    ],
)
def test_phase_status(complete, capped, exit_code, status):
    assert gpu_runner.phase_status(complete, capped, exit_code) == status


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--phases", "update,gpu"], "unknown phase 'gpu'; choose from update, device, pipeline"),
        (["--budget-seconds", "-3"], "budget '-3': must be a finite number > 0"),
        (["--budget-seconds", "ten"], "budget 'ten': not a number of seconds"),
    ],
)
def test_bad_arguments_exit_2_and_write_nothing(tmp_path, capsys, argv, expected):
    out = tmp_path / "gpu"
    with pytest.raises(SystemExit) as exit_:
        run(["--out", str(out), "--smoke", *argv])
    assert exit_.value.code == 2
    assert expected in capsys.readouterr().err
    assert not out.exists()


def test_a_directory_fastpop_did_not_write_is_refused_untouched(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert run(["--out", str(tmp_path), "--smoke"]) == 2
    error = capsys.readouterr().err
    assert "was not written by `fastpop bench gpu`" in error and "notes.txt" in error
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert run(["--out", str(tmp_path / "notes.txt"), "--smoke"]) == 2
    assert "is a file" in capsys.readouterr().err


def test_set_reaches_every_pbt_run_and_a_bad_value_exits_2_leaving_nothing(
    tmp_path, monkeypatch, capsys
):
    out = tmp_path / "gpu"
    assert run(["--out", str(out), "--smoke", "--set", "agent.widths=[8]"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("fastpop: error: --set: ") and "widths" in error
    assert not out.exists()
    seen = {}

    def run_phases(out_dir, phases, plans, caps, command, programme, pack=None):
        seen.update(plans=plans, command=command)
        return {"phases": {phase: {"status": "done"} for phase in phases}}

    monkeypatch.setattr(gpu_runner, "run_phases", run_phases)
    bf16 = "agent.compute_dtype=bfloat16"
    assert run(["--out", str(out), "--short", "--phases", "pbt", "--set", bf16]) == 0
    runs = dict(seen["plans"]["pbt"]["runs"])
    assert runs == {
        preset: [*overrides, bf16] for preset, overrides in gpu_plans.SHORT_PLANS["pbt"]["runs"]
    }
    assert seen["command"].endswith(f"--phases pbt --set {bf16} --short")


def test_the_directory_is_packed_after_every_phase_without_checkpoints(smoke, tmp_path):
    import tarfile

    out, _ = smoke
    with tarfile.open(out.parent / "gpu.tgz") as archive:
        names = set(archive.getnames())
    packed = {name.split(out.as_posix().lstrip("/") + "/", 1)[-1] for name in names}
    assert set().union(*PHASE_FILES.values()) <= packed
    assert (out / "runs" / "td3_pbt_halfcheetah" / "checkpoints").is_dir()
    assert not any("checkpoints" in name.split("/") for name in names)
    # one phase: packed as soon as it ends, over an older tarball, never half-written
    record_dir = tmp_path / "gpu"
    record_dir.mkdir()
    (record_dir / "phase_update.json").write_text("{}")
    gpu_runner.pack_directory(record_dir, out.parent / "gpu.tgz")
    with tarfile.open(out.parent / "gpu.tgz") as archive:
        assert [n.rsplit("/", 1)[-1] for n in archive.getnames()] == ["gpu", "phase_update.json"]
    assert not (out.parent / "gpu.tgz.partial").exists()


def test_the_command_line_knows_every_phase():
    assert bench_gpu.PHASES == gpu_plans.PHASES
    for name, (plans, caps) in gpu_plans.PROGRAMMES.items():
        learning = name.startswith("learning")  # the learning phase alone
        assert (
            set(plans)
            == set(caps)
            == ({"learning"} if learning else set(gpu_plans.BENCHMARK_PHASES))
        )
    assert sum(gpu_plans.FULL_CAPS.values()) <= 26 * 60  # the whole in about 25 minutes
    assert gpu_plans.FULL_CAPS["update"] <= 570 and gpu_plans.FULL_CAPS["device"] <= 570
    assert gpu_plans.FULL_CAPS["pipeline"] + gpu_plans.FULL_CAPS["pbt"] <= 570


def test_each_remote_call_of_the_short_programme_ends_30_s_inside_the_remote_limit():
    """Caps, grace, the SIGKILL waits, install, packing after each phase and the
    outer timeout's kill margin, at least 30 s inside the device tool's 600 s."""
    called = [phase for call in gpu_plans.SHORT_CALLS for phase in call]
    assert sorted(called) == sorted(set(called)) and set(called) <= set(gpu_plans.PHASES)
    limit = gpu_plans.REMOTE_LIMIT_SECONDS - gpu_plans.SAFETY_SECONDS
    for call in gpu_plans.SHORT_CALLS:
        seconds = gpu_plans.call_seconds(call, gpu_plans.SHORT_CAPS)
        assert seconds <= limit, (call, seconds)
    # each term counts: a cap 1 s longer makes the call 1.1 s longer (its grace grows too)
    longer = gpu_plans.SHORT_CAPS | {"pipeline": gpu_plans.SHORT_CAPS["pipeline"] + 1}
    grown = gpu_plans.call_seconds(("pipeline",), longer)
    assert grown - gpu_plans.call_seconds(("pipeline",), gpu_plans.SHORT_CAPS) == pytest.approx(1.1)
    # the runner kills a capped phase after the same grace
    assert gpu_plans.grace_seconds(330.0) == 30.0 and gpu_plans.grace_seconds(95.0) == 11.5


def test_the_remote_script_runs_each_call_under_the_planned_limit():
    """results/gpu/speed_programme.sh: `timeout -k` (a kill margin), each part's phases as
    planned."""
    from pathlib import Path

    script = (Path(gpu_plans.CONFIGS_DIR).parent / "results/gpu/speed_programme.sh").read_text()
    assert 'timeout -k "$margin" "$seconds"' in script and '--pack "${OUT:-/tmp}/gpu.tgz"' in script
    parts = dict(
        line.strip().rstrip(" ;").split(") phases=")
        for line in script.splitlines()
        if ") phases=" in line
    )
    assert [tuple(p.split(",")) for p in parts.values()] == list(gpu_plans.SHORT_CALLS)


@pytest.mark.parametrize("programme", sorted(gpu_plans.PROGRAMMES))
def test_every_programme_names_configs_envs_and_rows_that_exist(programme, menagerie_models):
    from fastpop import config as config_lib
    from fastpop.bench import levers
    from fastpop.bench.random_replay import BENCH_SPECS
    from fastpop.envs import device_envs

    plans, _ = gpu_plans.PROGRAMMES[programme]
    for algo, populations, impls in plans.get("update", {}).get("sweeps", []):
        assert algo in BENCH_SPECS and min(populations) >= 1
        for impl in impls:
            levers.parse(impl)  # a ValueError names a row no benchmark has
    for preset, overrides in gpu_plans.training_runs(plans):  # the pbt and learning phases'
        config_path = gpu_plans.CONFIGS_DIR / f"{preset}.yaml"
        config_lib.load_config(config_path, [*gpu_plans.RUN_OVERRIDES, *overrides])
    for env_id, populations, per_member in plans.get("device", {}).get("sweeps", []):
        assert device_envs.check_device_id(env_id) == env_id
        assert min(populations + per_member) >= 1


def test_short_and_smoke_exclude_each_other(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["--out", str(tmp_path / "gpu"), "--smoke", "--short"])
    assert exit_.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "gpu").exists()


def update_files(tmp_path, floors: dict[int, float]):
    """TD3's update rows at P = 80 and 256 (vectorized `times_floor` from `floors`) and its
    baselines at P = 80, as `fastpop bench update` writes them; no SAC rows."""
    from fastpop.bench import levers

    rates = {"sequential": 100, "sequential-in-one-program": 500, "torch": 50, "torch-func": 300}
    rows = [
        {"impl": "vectorized", "population": p, "agent_updates_per_s": 6000, "times_floor": f}
        | {"floor_bound": "state traffic"}
        for p, f in floors.items()
    ]
    rows += [
        {"impl": impl, "population": 80, "agent_updates_per_s": rate}
        for impl, rate in rates.items()
    ]
    for row in rows:
        row |= {"gflops_per_s": 60.0, "compile_seconds": 0.0}
    levers.add_speedups(rows)
    (tmp_path / "update_td3_x.json").write_text(json.dumps({"rows": rows}))
    record = {
        "phase": "update",
        "matmul_gflops_per_s": {"float32": 50.0, "default": 100.0},
        "algos": {"td3": {"json": "update_td3_x.json", "png": "update_td3_x.png"}},
    }
    (tmp_path / "phase_update.json").write_text(json.dumps(record))


def test_the_targets_are_judged_from_the_recorded_numbers(tmp_path):
    update_files(tmp_path, floors={80: 2.9, 256: 3.1})
    records = {"update": json.loads((tmp_path / "phase_update.json").read_text())}
    run = {"population": 256, "env": "brax/ant", "updates_per_member_per_s": 1024 / 4.0}
    records["pbt"] = {"runs": {"sac_pbt_brax_ant": run}}
    pipeline = {"population": 80, "learner": learner_result(busy=0.93, ratio=0.8, bound="update")}
    (tmp_path / "pipeline_x.json").write_text(json.dumps(pipeline))
    records["pipeline"] = {"json": "pipeline_x.json"}
    judged = judge_targets(tmp_path, records)
    td3, sac, pbt, learner = judged[:4], judged[4:8], judged[8], judged[9]
    assert [(measured, verdict) for _, measured, verdict in td3] == [
        ("2.90x (state traffic)", "**met**"),  # P=80 step / its floor <= 3
        ("3.10x (state traffic)", "**missed**"),  # P=256
        ("12.0x", "**met**"),  # against the best sequential row: in one program, 500
        ("20.0x", "**met**"),  # >= 2x the fastest PyTorch row: torch-func, 300
    ]
    assert all(verdict.startswith("not measured") for _, _, verdict in sac)
    assert pbt[1:] == ("4.00 s (256 updates/member/s)", "**met**")
    assert learner[1:] == (
        "busy 93%; rate 0.80x the row at K=50, batch 256, 100,000 rows; waiting for rows 4%: "
        "bound by its update",
        "**missed**",  # the rate below 85% of the benchmark's
    )
    # A capped update phase: the rows it had, with no JSON written yet, are judged alike
    rows = json.loads((tmp_path / "update_td3_x.json").read_text())["rows"]
    records["update"]["algos"]["td3"] = {"rows_so_far": rows}
    assert judge_targets(tmp_path, records) == judged
    records["pbt"]["runs"]["sac_pbt_brax_ant"]["population"] = 8  # not the target's size
    judged = judge_targets(tmp_path, records)
    assert judged[8][2] == "not measured (no run at 256 members on brax/ant)"
    assert all(verdict.startswith("not measured") for _, _, verdict in judge_targets(tmp_path, {}))


def learner_result(busy: float, ratio: float, bound: str) -> dict:
    """The learner part of a pipeline result at the target's sizes (bench/pipeline.py's)."""
    return {
        "collectors": 14,
        "busy_fraction_of_window": busy,
        "rate_vs_benchmark": ratio,
        "waiting_for_rows_fraction": 0.04 if bound == "update" else 0.3,
        "bound_by": bound,
        "benchmark": {"updates_per_call": 50, "batch_size": 256, "replay_rows": 100_000},
    }


@pytest.mark.parametrize(
    ("busy", "ratio", "bound", "verdict"),
    [
        (0.93, 0.90, "update", "**met**"),
        (0.89, 0.90, "update", "**missed**"),  # busy below 90% of its window
        (0.93, 0.84, "update", "**missed**"),  # its rate below 85% of the benchmark's
        (0.60, 0.50, "rows", "**met**"),  # shown bound by its rows
        # waiting for rows 30% of its window at 0.9x the benchmark's rate: not bound by them
        (0.40, 0.90, "rows", "**missed**"),
    ],
)
def test_the_learner_target_is_busy_and_rate_or_bound_by_rows(
    tmp_path, busy, ratio, bound, verdict
):
    from fastpop.bench.gpu_report import pipeline_target

    pipeline = {"population": 80, "learner": learner_result(busy, ratio, bound)}
    (tmp_path / "pipeline_x.json").write_text(json.dumps(pipeline))
    name, _, judged = pipeline_target(tmp_path, {"json": "pipeline_x.json"})
    assert judged == verdict and "or bound by its rows" in name
    old = {"population": 80, "learner": {"collectors": 14, "utilisation": 0.8}}  # an old result
    (tmp_path / "pipeline_x.json").write_text(json.dumps(old))
    assert pipeline_target(tmp_path, {"json": "pipeline_x.json"})[2].startswith("not measured")


def test_a_pbt_run_directory_fastpop_did_not_write_is_kept(tmp_path):
    from fastpop.bench.gpu_training import train_preset

    run_dir = tmp_path / "runs" / "td3_pbt_halfcheetah"
    run_dir.mkdir(parents=True)
    (run_dir / "notes.txt").write_text("mine")
    config = gpu_plans.CONFIGS_DIR / "td3_pbt_halfcheetah.yaml"
    with pytest.raises(ValueError, match="is not a fastpop run; nothing was deleted"):
        train_preset(config, [], 1.0, run_dir)
    assert (run_dir / "notes.txt").read_text() == "mine"
