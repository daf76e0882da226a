"""Tests for the sequential PyTorch update baseline (fastpop/bench/torch_baseline.py)."""

import math

import pytest

torch = pytest.importorskip("torch")

from fastpop.bench import torch_baseline as bench_torch  # noqa: E402
from fastpop.bench import torch_variants  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def snapshot(module):
    return [p.detach().clone() for p in module.parameters()]


def same(params, module):
    return all(torch.equal(a, b) for a, b in zip(params, module.parameters(), strict=True))


@pytest.mark.parametrize("algo", ["td3", "sac", "dqn"])
def test_benchmark_runs_and_reports_positive_rates(algo):
    result = torch_variants.torch_update_benchmark(
        algo, population_size=2, num_steps=2, warmup_steps=1, buffer_size=64
    )
    for key in ("seconds_per_step", "agent_updates_per_s"):
        assert math.isfinite(result[key]) and result[key] > 0
    assert result["threads"] >= 1
    assert result["torch_version"] == torch.__version__


def test_unknown_algo_names_the_allowed_ones():
    with pytest.raises(ValueError, match=r"td3.*sac.*dqn"):
        torch_variants.torch_update_benchmark("ppo", population_size=1, num_steps=1)


def test_td3_policy_delay():
    agent = bench_torch.make_td3_agent(seed=0)
    buffer = bench_torch.ReplayBuffer("td3", 512, seed=0)
    actor0, critic0 = snapshot(agent.actor), snapshot(agent.critic)
    target_actor0 = snapshot(agent.target_actor)
    target_critic0 = snapshot(agent.target_critic)

    losses = agent.update(buffer.sample(agent.batch_size))
    assert "actor_loss" not in losses
    assert same(actor0, agent.actor)
    assert not same(critic0, agent.critic)
    assert same(target_actor0, agent.target_actor)
    assert same(target_critic0, agent.target_critic)

    losses = agent.update(buffer.sample(agent.batch_size))
    assert torch.isfinite(losses["actor_loss"])
    assert not same(actor0, agent.actor)
    assert not same(target_actor0, agent.target_actor)
    assert not same(target_critic0, agent.target_critic)


def test_sac_update_changes_log_alpha_and_losses_are_finite():
    agent = bench_torch.make_sac_agent(seed=0)
    buffer = bench_torch.ReplayBuffer("sac", 512, seed=0)
    target_critic0 = snapshot(agent.target_critic)
    log_alpha0 = agent.log_alpha.item()
    losses = agent.update(buffer.sample(agent.batch_size))
    assert agent.log_alpha.item() != log_alpha0
    assert set(losses) == {"critic_loss", "actor_loss", "alpha_loss"}
    assert all(torch.isfinite(v) for v in losses.values())
    assert not same(target_critic0, agent.target_critic)  # Polyak every update


def test_sac_log_prob_matches_naive_correction():
    agent = bench_torch.make_sac_agent(seed=0)
    obs = torch.randn(64, bench_torch.OBS_DIM)
    torch.manual_seed(1)
    action, logp = agent.sample_action(obs)
    torch.manual_seed(1)
    mean, log_std = agent.actor(obs).chunk(2, dim=-1)
    std = log_std.clamp(-20.0, 2.0).exp()
    u = mean + std * torch.randn_like(mean)
    naive = torch.distributions.Normal(mean, std).log_prob(u) - torch.log(1 - action**2 + 1e-6)
    assert action.abs().max() <= 1.0
    torch.testing.assert_close(logp, naive.sum(-1), atol=1e-3, rtol=1e-4)


def test_dqn_hard_target_copy():
    agent = bench_torch.DQNAgent(seed=0, target_update_period=2)
    buffer = bench_torch.ReplayBuffer("dqn", 64, seed=0)
    target0 = snapshot(agent.target_net)
    agent.update(buffer.sample(agent.batch_size))
    assert same(target0, agent.target_net)
    agent.update(buffer.sample(agent.batch_size))
    assert same(snapshot(agent.q_net), agent.target_net)
