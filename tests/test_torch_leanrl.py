"""Tests for the LeanRL-class PyTorch rows (fastpop/bench/torch_compiled.py, torch_leanrl.py):
their step computes FuncTD3's / FuncSAC's update from the same parameters and draws, compiled
or not, for a population or one agent; the rows come out of `bench_update` with their fields,
and a failed compile or capture is a row's field, not the sweep's end."""

import pytest

torch = pytest.importorskip("torch")

from fastpop.bench import common, levers, torch_compiled, torch_func, torch_leanrl  # noqa: E402
from fastpop.bench import torch_baseline as bench_torch  # noqa: E402
from fastpop.bench.torch_variants import StackedReplay  # noqa: E402
from tests.helpers import tiny_update_bench  # noqa: E402

P, HIDDEN, BATCH, BUFFER, K = 3, 16, 8, 64, 3  # K = 3: TD3's delayed actor step at update 2

pytestmark = pytest.mark.usefixtures("one_torch_thread")
FUNC = {"td3": torch_func.FuncTD3, "sac": torch_func.FuncSAC}
DRAWS = {"td3": 1, "sac": 2}  # standard normal draws of the action's shape per update


def agents_and_buffers(algo: str, size: int) -> tuple[list, list]:
    agents = bench_torch.make_agents(algo, range(size), bench_torch.CPU, HIDDEN, BATCH)
    return agents, StackedReplay(algo, BUFFER, range(size), bench_torch.CPU).fields


def lean_update(algo: str, size: int = P, single: bool = False):
    return torch_compiled.LEAN_AGENTS[algo](*agents_and_buffers(algo, size), single=single)


def func_updates(algo: str, size: int, seed: int, single: bool) -> dict:
    """The Func agent's K updates, drawing as the LeanRL step draws (the indices, then the
    normal draws), each member's batch taken from its own buffer row by row."""
    agents, fields = agents_and_buffers(algo, size)
    func = FUNC[algo](agents)
    torch.manual_seed(seed)
    lead = () if single else (size,)
    for _ in range(K):
        idx = torch.randint(0, BUFFER, (*lead, BATCH))
        draws = [torch.randn((*lead, BATCH, bench_torch.ACTION_DIM)) for _ in range(DRAWS[algo])]
        if single:  # one agent's draws are member 0's
            idx, draws = idx[None], [draw[None] for draw in draws]
        members = range(size)
        batch = bench_torch.Batch(*(torch.stack([f[i][idx[i]] for i in members]) for f in fields))
        func.update(batch, *draws)
    return func


def assert_state_equal(lean, expected: dict, member0: bool = False) -> None:
    """`expected`: {state group: stacked tensors}; `member0`: lean's are member 0's alone."""
    for group, tensors in expected.items():
        mine = lean.state[group]
        if isinstance(tensors, dict):
            assert set(mine) == set(tensors)
            for name, tensor in tensors.items():
                want = tensor[0] if member0 else tensor
                torch.testing.assert_close(mine[name], want, atol=1e-5, rtol=1e-5, msg=name)
        else:
            torch.testing.assert_close(mine, tensors[0] if member0 else tensors, atol=1e-5, rtol=0)


def func_state(algo: str, func) -> dict:
    groups = {
        "critic": func.critic_params,
        "actor": func.actor_params,
        "target_critic": func.target_critic_params,
    }
    if algo == "td3":
        return groups | {"target_actor": func.target_actor_params}
    return groups | {"log_alpha": func.log_alpha}


@pytest.mark.parametrize("single", [False, True], ids=["population", "one-agent"])
@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_lean_steps_compute_the_func_update(algo, single):
    """K uncompiled LeanRL steps (sampling and noise drawn inside) == K FuncTD3/FuncSAC
    updates given the same draws; one agent (not vmapped) == the Func update at P = 1."""
    size = 1 if single else P
    lean = lean_update(algo, size, single)
    before = {name: t.clone() for name, t in lean.state["actor"].items()}
    torch.manual_seed(7)
    lean.run(0, K)
    func = func_updates(algo, size, seed=7, single=single)
    assert_state_equal(lean, func_state(algo, func), member0=single)
    assert not all(torch.equal(before[k], v) for k, v in lean.state["actor"].items())
    assert float(lean.state["critic_adam"].step) == K
    if algo == "td3":  # the delayed actor step ran once in K = 3 updates
        assert float(lean.state["actor_adam"].step) == K // lean.policy_delay
    assert lean.finite()


@pytest.mark.parametrize("algo", ["td3", "sac"])
def test_compiled_steps_match_uncompiled(algo):
    """Inductor drawing as eager does (`fallback_random`), the compiled steps (TD3: its critic
    and its actor step, both run) leave the uncompiled steps' state."""
    eager, compiled = lean_update(algo), lean_update(algo)
    breaks = torch_leanrl.graph_breaks()
    with torch._inductor.config.patch(fallback_random=True):
        compiled.compile(torch_leanrl.compile_step)
        for lean in (eager, compiled):
            torch.manual_seed(3)
            lean.run(0, K)
    assert compiled.compiled and torch_leanrl.graph_breaks() == breaks  # one graph per step
    expected = {g: eager.state[g] for g in eager.state if g not in ("buffer",) and "adam" not in g}
    assert_state_equal(compiled, expected)
    torch.testing.assert_close(
        compiled.state["critic_adam"].exp_avg_sq[0], eager.state["critic_adam"].exp_avg_sq[0]
    )


def test_a_call_runs_its_k_updates_on_the_schedule_of_the_whole_run():
    lean = lean_update("td3")
    call = torch_compiled.KStepCall(lean, K)
    call()
    call()
    assert call.done == 2 * K and not call.graphs
    assert float(lean.state["critic_adam"].step) == 2 * K
    assert float(lean.state["actor_adam"].step) == 2 * K // lean.policy_delay
    # K = 3 with a delay of 2: a call's actor steps depend on where it starts, two graphs
    assert torch_compiled.phases_in_order(lean, 0, 3) == [(0, 0), (1, 3)]
    assert torch_compiled.phases_in_order(lean, 4, 2) == [(0, 4)]
    assert torch_compiled.phases_in_order(lean_update("sac"), 5, 3) == [(0, 5)]


def tiny_settings(algo: str = "td3"):
    return tiny_update_bench()._replace(algo=algo, min_seconds=0.03)


def test_bench_update_times_the_leanrl_rows_with_their_fields(monkeypatch):
    from fastpop.bench.update import ROUNDS, bench_update

    # Uncompiled: the rows' path, not the compiler's (test_compiled_steps_match_uncompiled),
    # in seconds rather than Inductor's tens of them on a CPU.
    monkeypatch.setattr(torch_leanrl, "compile_step", lambda fn: fn)
    precision = torch.get_float32_matmul_precision()
    names = ["vectorized", "torch-leanrl", "torch-leanrl-fp32"]
    settings = tiny_settings()._replace(anatomy_from=1000)  # (no anatomy: not these rows')
    result = bench_update(settings, [1, 2], names, log=print)
    assert torch.get_float32_matmul_precision() == precision  # restored
    rows = {(row["impl"], row["population"]): row for row in result["rows"]}
    for size in (1, 2):
        for name in ("torch-leanrl", "torch-leanrl-fp32"):
            row = rows[name, size]
            assert "error" not in row, row.get("error")
            assert row["tf32"] is False and row["single_agent"] is (size == 1)  # (a CPU's)
            assert row["cuda_graph"] is False and row["torch_device"] == "cpu"
            assert row["updates_per_call"] == 2 and row["batch_size"] == 8 and row["hidden"] == 16
            assert len(row["seconds_per_call_rounds"]) == ROUNDS
            assert row["rounds_ratio"] >= 1.0
            assert row["rounds_flat"] == (row["rounds_ratio"] <= common.FLAT_RATIO)
            assert row["agent_updates_per_s"] == pytest.approx(size * 2 / row["seconds_per_call"])
            assert row["compile_seconds"] >= 0 and row["gflops_per_s"] > 0
            assert row["torch_version"] == torch.__version__ and row["finite"]
        vectorized = rows["vectorized", size]
        best_torch = max(rows[n, size]["agent_updates_per_s"] for n in names[1:])
        assert vectorized["speedup_over_best_torch"] == pytest.approx(
            vectorized["agent_updates_per_s"] / best_torch
        )


def test_a_failed_compile_is_the_rows_error_and_the_sweep_goes_on():
    def broken(fn):
        raise RuntimeError("no compiler today")

    rows = torch_leanrl.leanrl_rows(
        tiny_settings("sac"), ["torch-leanrl-fp32"], 2, 1e6, rounds=2, compile_fn=broken
    )
    assert rows[0]["error"] == "RuntimeError: no compiler today"
    assert rows[0]["agent_updates_per_s"] == 0.0 and rows[0]["cuda_graph"] is False
    levers.add_speedups(rows)  # no ratio against a row that has no rate
    assert rows[0]["speedup_over_best_torch"] is None


def test_a_failed_capture_is_recorded_and_the_compiled_steps_run_without_it(monkeypatch):
    lean = lean_update("sac", 2)
    call = torch_compiled.KStepCall(lean, 2)

    def capture_fails():
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(call, "capture", capture_fails)
    fields = torch_leanrl.capture(call)
    assert fields == {
        "cuda_graph": False,
        "cuda_graph_error": "RuntimeError: operation not permitted when stream is capturing",
    }
    assert call.done == 2 and float(lean.state["critic_adam"].step) == 2  # it ran without


def test_dqn_is_refused_naming_what_is_allowed(capsys, tmp_path):
    from fastpop.bench.update import bench_update
    from fastpop.commands.cli import main

    with pytest.raises(ValueError, match=r"torch-leanrl: TD3 and SAC only \(td3, sac\)"):
        bench_update(tiny_settings("dqn"), [1], ["torch-leanrl"])
    with pytest.raises(ValueError, match="td3, sac"):
        torch_leanrl.row_options(tiny_settings("dqn"))
    argv = ["bench", "update", "--algo", "dqn", "--impl", "torch-leanrl", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "TD3 and SAC only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_matmul_precision_is_set_for_a_gpu_row_and_restored():
    gpu = torch.device("cuda")  # (the flags are set on a CPU-only PyTorch too)
    torch.set_float32_matmul_precision("highest")
    with torch_leanrl.matmul_precision(True, gpu):
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest"
    with torch_leanrl.matmul_precision(False, gpu):
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert not torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    with torch_leanrl.matmul_precision(True, bench_torch.CPU):  # not on a CPU: float32 there
        assert torch.get_float32_matmul_precision() == "highest"


def test_unequal_hidden_sizes_are_refused():
    settings = tiny_settings()._replace(agent={"hidden_sizes": (16, 32)})
    with pytest.raises(ValueError, match="two equal hidden layers"):
        torch_leanrl.row_options(settings)
    assert torch_leanrl.row_options(tiny_settings()).hidden == 16
