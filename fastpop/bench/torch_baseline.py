"""Sequential PyTorch baseline for `fastpop bench update --impl torch`.

The paper's point of comparison: a Python loop over agents, each an ordinary PyTorch agent
doing one update step on a batch sampled from its own replay buffer. Nothing is vectorized
across agents. The updates mirror fastpop's JAX TD3, SAC and (double) DQN agents. They run on
the GPU where PyTorch sees one (the paper's baseline), else on the CPU. `variant` picks how
PyTorch runs them: "eager" (this loop as written), or the two ways a PyTorch user would make it
fast, "compile" and "func"; `torch_variants.torch_update_benchmark` times any of them.
"""

from __future__ import annotations

import copy
import itertools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fastpop.agents import dqn, sac, td3

ALGOS = (td3.NAME, sac.NAME, dqn.NAME)  # the JAX agents these mirror
VARIANTS = ("eager", "compile", "func")

# HalfCheetah shapes for TD3/SAC, Atari shapes for DQN.
OBS_DIM, ACTION_DIM = 17, 6
ATARI_OBS_SHAPE, NUM_ATARI_ACTIONS = (84, 84, 4), 6
MLP_BUFFER_SIZE = 10_000
DQN_BUFFER_SIZE, DQN_MIN_BUFFER_SIZE = 10_000, 1_000
DQN_BUFFER_BYTES_BUDGET = 4 * 2**30  # all agents' obs + next_obs together

GAMMA, TAU = 0.99, 0.005
CPU = torch.device("cpu")


class Batch(NamedTuple):
    obs: torch.Tensor
    action: torch.Tensor  # float (B, 6) for TD3/SAC, int64 (B,) for DQN
    reward: torch.Tensor
    next_obs: torch.Tensor
    terminated: torch.Tensor  # bool


class ReplayBuffer:
    """A buffer already full of random transitions; `sample` draws a uniform batch."""

    def __init__(self, algo: str, size: int, seed: int, device: torch.device = CPU):
        self.generator = torch.Generator(device).manual_seed(seed)
        make = {"generator": self.generator, "device": device}
        if algo == dqn.NAME:
            obs_shape = (size, *ATARI_OBS_SHAPE)
            self.obs = torch.randint(0, 256, obs_shape, dtype=torch.uint8, **make)
            self.next_obs = torch.randint(0, 256, obs_shape, dtype=torch.uint8, **make)
            self.action = torch.randint(0, NUM_ATARI_ACTIONS, (size,), **make)
        else:
            self.obs = torch.randn(size, OBS_DIM, **make)
            self.next_obs = torch.randn(size, OBS_DIM, **make)
            self.action = torch.rand(size, ACTION_DIM, **make) * 2 - 1
        self.reward = torch.randn(size, **make)
        self.terminated = torch.rand(size, **make) < 0.01
        self.size, self.device = size, device

    def sample(self, batch_size: int) -> Batch:
        idx = torch.randint(
            0, self.size, (batch_size,), generator=self.generator, device=self.device
        )
        return Batch(
            self.obs[idx],
            self.action[idx],
            self.reward[idx],
            self.next_obs[idx],
            self.terminated[idx],
        )


def mlp(*sizes: int) -> nn.Sequential:
    """Linear layers with ReLU between them (none after the last)."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class TwinCritic(nn.Module):
    """Two independent Q(s, a) MLPs on concat(obs, action)."""

    def __init__(self, hidden: int = 256):
        super().__init__()
        self.q1 = mlp(OBS_DIM + ACTION_DIM, hidden, hidden, 1)
        self.q2 = mlp(OBS_DIM + ACTION_DIM, hidden, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor):
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def frozen_copy(module: nn.Module) -> nn.Module:
    target = copy.deepcopy(module)
    target.requires_grad_(False)
    return target


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) * target + tau * online, in place."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


class TD3Agent:
    batch_size = 256

    def __init__(
        self,
        seed: int = 0,
        lr: float = 3e-4,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        policy_delay: int = 2,
        device: torch.device = CPU,
        hidden: int = 256,
    ):
        torch.manual_seed(seed)
        self.actor = nn.Sequential(mlp(OBS_DIM, hidden, hidden, ACTION_DIM), nn.Tanh()).to(device)
        self.critic = TwinCritic(hidden).to(device)
        self.target_actor, self.target_critic = frozen_copy(self.actor), frozen_copy(self.critic)
        self.actor_params = list(self.actor.parameters())
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
        self.policy_noise = policy_noise
        self.noise_clip = noise_clip
        self.policy_delay = policy_delay
        self.num_updates = 0

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        obs, action, reward, next_obs, terminated = batch
        with torch.no_grad():
            noise = (torch.randn_like(action) * self.policy_noise).clamp(
                -self.noise_clip, self.noise_clip
            )
            next_action = (self.target_actor(next_obs) + noise).clamp(-1.0, 1.0)
            target_q = torch.min(*self.target_critic(next_obs, next_action))
            target = reward + GAMMA * (~terminated) * target_q
        q1, q2 = self.critic(obs, action)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()
        self.num_updates += 1
        losses = {"critic_loss": critic_loss.detach()}

        if self.num_updates % self.policy_delay == 0:
            actor_loss = -self.critic.q1(torch.cat([obs, self.actor(obs)], -1)).mean()
            self.actor_opt.zero_grad(set_to_none=True)
            actor_loss.backward(inputs=self.actor_params)  # no grads for the critic
            self.actor_opt.step()
            polyak_update(self.target_actor, self.actor, TAU)
            polyak_update(self.target_critic, self.critic, TAU)
            losses["actor_loss"] = actor_loss.detach()
        return losses


class SACAgent:
    batch_size = 256

    def __init__(
        self,
        seed: int = 0,
        lr: float = 3e-4,
        reward_scale: float = 1.0,
        device: torch.device = CPU,
        hidden: int = 256,
    ):
        torch.manual_seed(seed)
        self.actor = mlp(OBS_DIM, hidden, hidden, 2 * ACTION_DIM).to(device)
        self.critic = TwinCritic(hidden).to(device)
        self.target_critic = frozen_copy(self.critic)
        self.log_alpha = torch.zeros((), device=device, requires_grad=True)
        self.actor_params = list(self.actor.parameters())
        self.actor_opt = torch.optim.Adam(self.actor_params, lr=lr)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=lr)
        self.target_entropy = -float(ACTION_DIM)
        self.reward_scale = reward_scale

    def sample_action(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised tanh-Gaussian sample and its log-probability."""
        mean, log_std = self.actor(obs).chunk(2, dim=-1)
        log_std = log_std.clamp(-20.0, 2.0)
        eps = torch.randn_like(mean)
        u = mean + log_std.exp() * eps
        gaussian_logp = -0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)
        # log(1 - tanh(u)^2) in the numerically stable softplus form.
        log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return torch.tanh(u), (gaussian_logp - log_det).sum(-1)

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        obs, action, reward, next_obs, terminated = batch
        alpha = self.log_alpha.detach().exp()
        with torch.no_grad():
            next_action, next_logp = self.sample_action(next_obs)
            next_q = torch.min(*self.target_critic(next_obs, next_action)) - alpha * next_logp
            target = reward * self.reward_scale + GAMMA * (~terminated) * next_q
        q1, q2 = self.critic(obs, action)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        self.critic_opt.step()

        new_action, logp = self.sample_action(obs)
        q_new = torch.min(*self.critic(obs, new_action))
        actor_loss = (alpha * logp - q_new).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward(inputs=self.actor_params)  # no grads for the critic
        self.actor_opt.step()

        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()

        polyak_update(self.target_critic, self.critic, TAU)
        return {
            "critic_loss": critic_loss.detach(),
            "actor_loss": actor_loss.detach(),
            "alpha_loss": alpha_loss.detach(),
        }


class NatureCNN(nn.Module):
    """Mnih et al. 2015 Q-network on uint8 (B, 84, 84, 4) observations."""

    def __init__(self, num_actions: int = NUM_ATARI_ACTIONS):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, num_actions),
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.permute(0, 3, 1, 2).float() / 255.0)


class DQNAgent:
    batch_size = 32

    def __init__(
        self,
        seed: int = 0,
        lr: float = 1e-4,
        target_update_period: int = 1000,
        device: torch.device = CPU,
    ):
        torch.manual_seed(seed)
        self.q_net = NatureCNN().to(device)
        self.target_net = frozen_copy(self.q_net)
        self.opt = torch.optim.Adam(self.q_net.parameters(), lr=lr, eps=1.5e-4)
        self.target_update_period = target_update_period
        self.num_updates = 0

    def update(self, batch: Batch) -> dict[str, torch.Tensor]:
        obs, action, reward, next_obs, terminated = batch
        with torch.no_grad():  # double DQN: online argmax, target evaluation
            next_action = self.q_net(next_obs).argmax(-1, keepdim=True)
            next_q = self.target_net(next_obs).gather(-1, next_action).squeeze(-1)
            target = reward + GAMMA * (~terminated) * next_q
        q = self.q_net(obs).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        loss = F.smooth_l1_loss(q, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.num_updates += 1
        if self.num_updates % self.target_update_period == 0:
            self.target_net.load_state_dict(self.q_net.state_dict())
        return {"loss": loss.detach()}


def make_td3_agent(seed: int = 0, device: torch.device = CPU, hidden: int = 256) -> TD3Agent:
    return TD3Agent(seed, device=device, hidden=hidden)


def make_sac_agent(seed: int = 0, device: torch.device = CPU, hidden: int = 256) -> SACAgent:
    return SACAgent(seed, device=device, hidden=hidden)


def make_dqn_agent(seed: int = 0, device: torch.device = CPU) -> DQNAgent:
    return DQNAgent(seed, device=device)


AGENT_FACTORIES = {td3.NAME: make_td3_agent, sac.NAME: make_sac_agent, dqn.NAME: make_dqn_agent}


def default_buffer_size(algo: str, population_size: int) -> int:
    """10k transitions; DQN shrinks (to at least 1k) to keep all image buffers within budget."""
    if algo != dqn.NAME:
        return MLP_BUFFER_SIZE
    bytes_per_transition = 2 * math.prod(ATARI_OBS_SHAPE)  # obs + next_obs
    fits = DQN_BUFFER_BYTES_BUDGET // (bytes_per_transition * population_size)
    return max(DQN_MIN_BUFFER_SIZE, min(DQN_BUFFER_SIZE, fits))


def make_agents(
    algo: str, seeds: range, device: torch.device, hidden: int | None, batch_size: int | None
) -> list:
    """One agent per seed; `hidden` (TD3's and SAC's MLP width) and `batch_size` shrink them."""
    if hidden is not None and algo == dqn.NAME:
        raise ValueError("hidden sets TD3's and SAC's MLP width; DQN's Nature CNN is fixed")
    options = {} if hidden is None else {"hidden": hidden}
    agents = [AGENT_FACTORIES[algo](seed, device, **options) for seed in seeds]
    for agent in agents if batch_size is not None else ():
        agent.batch_size = batch_size
    return agents


def eager_population_step(agents: list, buffers: list[ReplayBuffer]):
    """The baseline: each agent samples its own buffer and updates, one after another."""

    def step() -> None:
        for agent, buffer in zip(agents, buffers, strict=True):
            agent.update(buffer.sample(agent.batch_size))

    return step
