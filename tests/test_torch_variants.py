"""Tests for the compile and func PyTorch baselines (fastpop/bench/torch_variants.py and
torch_func.py): each member's update is the eager agent's, from the same parameters and batch."""

import math

import pytest

torch = pytest.importorskip("torch")

from fastpop.bench import torch_baseline as bench_torch  # noqa: E402
from fastpop.bench import torch_func, torch_variants  # noqa: E402
from tests.helpers import tiny_update_bench  # noqa: E402

P, HIDDEN, BATCH, BUFFER = 2, 16, 8, 64

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def eager_agents(algo: str) -> list:
    if algo == "dqn":  # a hard target copy within the test's two steps
        agents = [bench_torch.DQNAgent(seed, target_update_period=2) for seed in range(P)]
        for agent in agents:
            agent.batch_size = BATCH
        return agents
    return bench_torch.make_agents(algo, range(P), bench_torch.CPU, HIDDEN, BATCH)


def member_batches(algo: str, step: int) -> tuple[list, bench_torch.Batch]:
    """Each member's batch, and all of them stacked on a leading population axis."""
    buffers = [bench_torch.ReplayBuffer(algo, BUFFER, seed=10 * step + i) for i in range(P)]
    batches = [buffer.sample(BATCH) for buffer in buffers]
    return batches, bench_torch.Batch(*(torch.stack(field) for field in zip(*batches, strict=True)))


def assert_members_equal(stacked: dict, modules: list) -> None:
    for i, module in enumerate(modules):
        for name, param in module.named_parameters():
            torch.testing.assert_close(stacked[name][i], param.detach(), msg=name)


def eager_step(agents, batches, step: int, draws: int = 2) -> tuple[list[dict], list[list]]:
    """Each agent's eager update, seeded; (its losses, the `draws` standard normal draws of the
    action's shape it made: TD3 one, SAC two)."""
    losses, made = [], []
    for i, (agent, batch) in enumerate(zip(agents, batches, strict=True)):
        torch.manual_seed(100 * step + i)
        made.append([torch.randn(batch.action.shape) for _ in range(draws)])
        torch.manual_seed(100 * step + i)
        losses.append(agent.update(batch))
    return losses, made


def assert_losses_equal(func_losses: dict, eager_losses: list[dict]) -> None:
    for i, losses in enumerate(eager_losses):
        assert set(losses) == set(func_losses)
        for name, value in losses.items():
            torch.testing.assert_close(func_losses[name][i], value, msg=name)


def test_func_td3_matches_eager_members_through_actor_and_polyak_steps():
    agents = eager_agents("td3")
    func = torch_func.FuncTD3(agents)
    actor0 = {name: p.clone() for name, p in func.actor_params.items()}
    for step in range(2):  # the second has the delayed actor update and Polyak averaging
        batches, stacked = member_batches("td3", step)
        eager_losses, draws = eager_step(agents, batches, step)
        noise = torch.stack([member_draws[0] for member_draws in draws])
        assert_losses_equal(func.update(stacked, noise), eager_losses)
    assert not all(torch.equal(actor0[k], v) for k, v in func.actor_params.items())
    assert_members_equal(func.actor_params, [a.actor for a in agents])
    assert_members_equal(func.critic_params, [a.critic for a in agents])
    assert_members_equal(func.target_actor_params, [a.target_actor for a in agents])
    assert_members_equal(func.target_critic_params, [a.target_critic for a in agents])


def test_func_sac_matches_eager_members():
    agents = eager_agents("sac")
    func = torch_func.FuncSAC(agents)
    for step in range(2):
        batches, stacked = member_batches("sac", step)
        eager_losses, draws = eager_step(agents, batches, step)
        eps_next, eps_new = (torch.stack(d) for d in zip(*draws, strict=True))
        assert_losses_equal(func.update(stacked, eps_next, eps_new), eager_losses)
    assert_members_equal(func.actor_params, [a.actor for a in agents])
    assert_members_equal(func.critic_params, [a.critic for a in agents])
    assert_members_equal(func.target_critic_params, [a.target_critic for a in agents])
    torch.testing.assert_close(func.log_alpha, torch.stack([a.log_alpha for a in agents]))


def test_func_dqn_matches_eager_members_and_copies_targets():
    agents = eager_agents("dqn")
    func = torch_func.FuncDQN(agents)
    for step in range(2):
        batches, stacked = member_batches("dqn", step)
        eager_losses, _ = eager_step(agents, batches, step, draws=0)
        assert_losses_equal(func.update(stacked), eager_losses)
    assert_members_equal(func.params, [a.q_net for a in agents])
    assert_members_equal(func.target_params, [a.target_net for a in agents])
    assert all(torch.equal(func.params[k], v) for k, v in func.target_params.items())


def test_stacked_replay_samples_each_member_from_its_own_buffer():
    replay = torch_variants.StackedReplay("td3", BUFFER, range(3, 3 + P), bench_torch.CPU)
    batch = replay.sample(BATCH)
    assert batch.obs.shape == (P, BATCH, bench_torch.OBS_DIM)
    for i in range(P):
        own = bench_torch.ReplayBuffer("td3", BUFFER, seed=3 + i).obs
        assert (batch.obs[i][:, None] == own[None]).all(-1).any(-1).all()


def test_compiled_members_match_eager_members():
    """Inductor drawing its random numbers as eager does (`fallback_random`), the compiled
    members' parameters after two steps (one with the delayed actor update) are eager's."""
    eager, compiled = eager_agents("td3"), eager_agents("td3")
    with torch._inductor.config.patch(fallback_random=True):
        for agents, make_step in (
            (eager, bench_torch.eager_population_step),
            (compiled, lambda a, b: torch_variants.compiled_population_step(a, b, bench_torch.CPU)),
        ):
            step = make_step(agents, [bench_torch.ReplayBuffer("td3", BUFFER, s) for s in range(P)])
            torch.manual_seed(0)
            step()
            step()
        result = torch_variants.torch_update_benchmark(
            "td3",
            P,
            num_steps=2,
            warmup_steps=1,
            buffer_size=BUFFER,
            variant="compile",
            hidden=HIDDEN,
            batch_size=BATCH,
        )
    for a, b in zip(eager, compiled, strict=True):
        for module in ("actor", "critic", "target_actor", "target_critic"):
            for p, q in zip(
                getattr(a, module).parameters(), getattr(b, module).parameters(), strict=True
            ):
                torch.testing.assert_close(q, p)
    assert result["variant"] == "compile"
    assert result["warmup_steps"] == torch_variants.COMPILE_WARMUP_STEPS
    assert math.isfinite(result["agent_updates_per_s"]) and result["agent_updates_per_s"] > 0


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_func_benchmark_reports_positive_rates(algo):
    hidden = None if algo == "dqn" else HIDDEN
    result = torch_variants.torch_update_benchmark(
        algo,
        P,
        num_steps=2,
        warmup_steps=1,
        buffer_size=BUFFER,
        variant="func",
        hidden=hidden,
        batch_size=BATCH,
    )
    assert result["variant"] == "func"
    assert math.isfinite(result["agent_updates_per_s"]) and result["agent_updates_per_s"] > 0
    assert result["torch_version"] == torch.__version__


def test_unknown_variant_and_dqn_hidden_are_refused():
    with pytest.raises(ValueError, match=r"eager.*compile.*func"):
        torch_variants.torch_update_benchmark("td3", 1, 1, variant="jit")
    with pytest.raises(ValueError, match="Nature CNN"):
        torch_variants.torch_update_benchmark("dqn", 1, 1, variant="func", hidden=16)


def test_compile_without_a_cpp_compiler_says_so(monkeypatch):
    from torch._inductor import cpp_builder, exc

    def no_compiler():
        raise exc.InvalidCxxCompiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler"):
        torch_variants.compiled_population_step(eager_agents("td3"), [], bench_torch.CPU)


def test_the_update_benchmark_has_a_row_per_pytorch_implementation():
    from fastpop.bench.update import bench_update

    settings = tiny_update_bench()
    result = bench_update(settings, [2], ["vectorized", "torch", "torch-func"], log=print)
    rows = {row["impl"]: row for row in result["rows"]}
    torch_rates = [rows[name]["agent_updates_per_s"] for name in ("torch", "torch-func")]
    assert all(rate > 0 for rate in torch_rates)
    assert rows["torch-func"]["torch_version"] == torch.__version__
    vectorized = rows["vectorized"]
    assert vectorized["speedup_over_best_torch"] == pytest.approx(
        vectorized["agent_updates_per_s"] / max(torch_rates)
    )
