"""The population's TD3, SAC and DQN updates vectorized with `torch.func`: the "func" variant of
torch_baseline.py, the way a PyTorch user would batch a population without leaving PyTorch.

Every member's parameters are stacked on a leading population axis
(`torch.func.stack_module_state`); the losses are written for one member with
`torch.func.functional_call` and `torch.vmap`-ped over the population, so one call computes every
member's gradients. Adam is elementwise, so one `torch.optim.Adam` over the stacked tensors
(fused on CUDA, foreach on the CPU) updates each member exactly as the member's own optimizer
would, and one `torch._foreach_lerp_` does every member's Polyak averaging. The updates are the
eager agents' line for line, from the same initial parameters and hyperparameters; random noise
is drawn for the whole population at once and can be passed in (tests compare with eager).
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value

from fastpop.agents import dqn, sac, td3
from fastpop.bench.torch_baseline import GAMMA, TAU, Batch

Params = dict[str, Tensor]


def stack_modules(modules: list[nn.Module]) -> tuple[nn.Module, Params]:
    """(a stateless copy of the module, on the meta device, to call with `functional_call`;
    every member's parameters stacked on a leading axis, plain tensors for the optimizer)."""
    params, _ = torch.func.stack_module_state(modules)
    base = copy.deepcopy(modules[0]).to("meta")
    return base, {name: p.detach() for name, p in params.items()}


def stacked_adam(params: Params | list[Tensor], like: torch.optim.Optimizer) -> torch.optim.Adam:
    """Adam over the stacked tensors with the hyperparameters of a member's own optimizer."""
    tensors = list(params.values()) if isinstance(params, dict) else params
    group = like.param_groups[0]
    fast = {"fused": True} if tensors[0].is_cuda else {"foreach": True}
    return torch.optim.Adam(tensors, lr=group["lr"], betas=group["betas"], eps=group["eps"], **fast)


def adam_step(optimizer: torch.optim.Adam, grads: Params | list[Tensor]) -> None:
    """One step of `optimizer` with `grads` (in its parameters' order)."""
    grads = list(grads.values()) if isinstance(grads, dict) else grads
    params = optimizer.param_groups[0]["params"]
    for param, grad in zip(params, grads, strict=True):
        param.grad = grad
    optimizer.step()
    for param in params:
        param.grad = None


def polyak(target: Params, online: Params) -> None:
    """target <- (1 - tau) * target + tau * online, every member at once."""
    torch._foreach_lerp_(list(target.values()), list(online.values()), TAU)


def sub_params(params: Params, prefix: str) -> Params:
    """The parameters of submodule `prefix` (e.g. the twin critic's "q1")."""
    return {k[len(prefix) + 1 :]: v for k, v in params.items() if k.startswith(prefix + ".")}


class FuncTD3:
    """TD3Agent.update for the whole population: one vmapped critic call per step, plus one
    vmapped actor call (and the Polyak averaging) every `policy_delay` steps."""

    def __init__(self, agents: list):
        first = agents[0]
        self.actor, self.actor_params = stack_modules([a.actor for a in agents])
        self.critic, self.critic_params = stack_modules([a.critic for a in agents])
        _, self.target_actor_params = stack_modules([a.target_actor for a in agents])
        _, self.target_critic_params = stack_modules([a.target_critic for a in agents])
        self.actor_opt = stacked_adam(self.actor_params, first.actor_opt)
        self.critic_opt = stacked_adam(self.critic_params, first.critic_opt)
        self.policy_noise, self.noise_clip = first.policy_noise, first.noise_clip
        self.policy_delay, self.num_updates = first.policy_delay, 0
        self.critic_grads = torch.vmap(grad_and_value(self.critic_loss))
        self.actor_grads = torch.vmap(grad_and_value(self.actor_loss))

    def critic_loss(
        self, critic: Params, target_actor: Params, target_critic: Params, batch, noise
    ):
        obs, action, reward, next_obs, terminated = batch
        with torch.no_grad():
            next_action = (functional_call(self.actor, target_actor, next_obs) + noise).clamp(-1, 1)
            target_q = torch.min(
                *functional_call(self.critic, target_critic, (next_obs, next_action))
            )
            target = reward + GAMMA * (~terminated) * target_q
        q1, q2 = functional_call(self.critic, critic, (obs, action))
        return F.mse_loss(q1, target) + F.mse_loss(q2, target)

    def actor_loss(self, actor: Params, critic: Params, obs: Tensor) -> Tensor:
        x = torch.cat([obs, functional_call(self.actor, actor, obs)], -1)
        return -functional_call(self.critic.q1, sub_params(critic, "q1"), x).mean()

    def update(self, batch: Batch, noise: Tensor | None = None) -> dict[str, Tensor]:
        """`noise`: the standard normal draw of TD3's target smoothing, (P, B, action_dim)."""
        if noise is None:
            noise = torch.randn_like(batch.action)
        noise = (noise * self.policy_noise).clamp(-self.noise_clip, self.noise_clip)
        grads, critic_loss = self.critic_grads(
            self.critic_params, self.target_actor_params, self.target_critic_params, batch, noise
        )
        adam_step(self.critic_opt, grads)
        self.num_updates += 1
        losses = {"critic_loss": critic_loss}
        if self.num_updates % self.policy_delay == 0:
            grads, losses["actor_loss"] = self.actor_grads(
                self.actor_params, self.critic_params, batch.obs
            )
            adam_step(self.actor_opt, grads)
            polyak(self.target_actor_params, self.actor_params)
            polyak(self.target_critic_params, self.critic_params)
        return losses


class FuncSAC:
    """SACAgent.update for the whole population: one vmapped critic call and one vmapped actor
    call per step (the actor's loss uses the critic just updated, as the eager agent's does)."""

    def __init__(self, agents: list):
        first = agents[0]
        self.actor, self.actor_params = stack_modules([a.actor for a in agents])
        self.critic, self.critic_params = stack_modules([a.critic for a in agents])
        _, self.target_critic_params = stack_modules([a.target_critic for a in agents])
        self.log_alpha = torch.stack([a.log_alpha.detach() for a in agents])
        self.actor_opt = stacked_adam(self.actor_params, first.actor_opt)
        self.critic_opt = stacked_adam(self.critic_params, first.critic_opt)
        self.alpha_opt = stacked_adam([self.log_alpha], first.alpha_opt)
        self.target_entropy, self.reward_scale = first.target_entropy, first.reward_scale
        self.critic_grads = torch.vmap(grad_and_value(self.critic_loss))
        self.actor_grads = torch.vmap(grad_and_value(self.actor_loss, has_aux=True))

    def sample_action(self, actor: Params, obs: Tensor, eps: Tensor) -> tuple[Tensor, Tensor]:
        """SACAgent.sample_action with its standard normal draw `eps` given."""
        mean, log_std = functional_call(self.actor, actor, obs).chunk(2, dim=-1)
        log_std = log_std.clamp(-20.0, 2.0)
        u = mean + log_std.exp() * eps
        gaussian_logp = -0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)
        log_det = 2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))
        return torch.tanh(u), (gaussian_logp - log_det).sum(-1)

    def critic_loss(self, critic, actor, target_critic, alpha, batch, eps) -> Tensor:
        obs, action, reward, next_obs, terminated = batch
        with torch.no_grad():
            next_action, next_logp = self.sample_action(actor, next_obs, eps)
            next_q = functional_call(self.critic, target_critic, (next_obs, next_action))
            next_q = torch.min(*next_q) - alpha * next_logp
            target = reward * self.reward_scale + GAMMA * (~terminated) * next_q
        q1, q2 = functional_call(self.critic, critic, (obs, action))
        return F.mse_loss(q1, target) + F.mse_loss(q2, target)

    def actor_loss(self, actor, critic, alpha, obs, eps) -> tuple[Tensor, Tensor]:
        """(the actor's loss, the mean log-probability the temperature's loss needs)."""
        new_action, logp = self.sample_action(actor, obs, eps)
        q_new = torch.min(*functional_call(self.critic, critic, (obs, new_action)))
        return (alpha * logp - q_new).mean(), logp.detach().mean()

    def update(
        self, batch: Batch, eps_next: Tensor | None = None, eps_new: Tensor | None = None
    ) -> dict[str, Tensor]:
        """`eps_next`, `eps_new`: the standard normal draws of the next and the new actions, in
        the eager agent's order, each (P, B, action_dim)."""
        eps_next = torch.randn_like(batch.action) if eps_next is None else eps_next
        eps_new = torch.randn_like(batch.action) if eps_new is None else eps_new
        alpha = self.log_alpha.exp()
        grads, critic_loss = self.critic_grads(
            self.critic_params, self.actor_params, self.target_critic_params, alpha, batch, eps_next
        )
        adam_step(self.critic_opt, grads)
        grads, (actor_loss, mean_logp) = self.actor_grads(
            self.actor_params, self.critic_params, alpha, batch.obs, eps_new
        )
        adam_step(self.actor_opt, grads)
        # d/d log_alpha of the eager -(log_alpha * (logp + target_entropy)).mean()
        alpha_grad = -(mean_logp + self.target_entropy)
        alpha_loss = self.log_alpha * alpha_grad
        adam_step(self.alpha_opt, [alpha_grad])
        polyak(self.target_critic_params, self.critic_params)
        return {"critic_loss": critic_loss, "actor_loss": actor_loss, "alpha_loss": alpha_loss}


class FuncDQN:
    """DQNAgent.update (double DQN, Huber loss, a hard target copy every
    `target_update_period` steps) for the whole population: one vmapped call per step."""

    def __init__(self, agents: list):
        first = agents[0]
        self.q_net, self.params = stack_modules([a.q_net for a in agents])
        _, self.target_params = stack_modules([a.target_net for a in agents])
        self.opt = stacked_adam(self.params, first.opt)
        self.target_update_period, self.num_updates = first.target_update_period, 0
        self.grads = torch.vmap(grad_and_value(self.loss))

    def loss(self, params: Params, target_params: Params, batch) -> Tensor:
        obs, action, reward, next_obs, terminated = batch
        with torch.no_grad():  # double DQN: online argmax, target evaluation
            next_action = functional_call(self.q_net, params, next_obs).argmax(-1, keepdim=True)
            next_q = functional_call(self.q_net, target_params, next_obs)
            next_q = next_q.gather(-1, next_action).squeeze(-1)
            target = reward + GAMMA * (~terminated) * next_q
        q = functional_call(self.q_net, params, obs).gather(-1, action.unsqueeze(-1)).squeeze(-1)
        return F.smooth_l1_loss(q, target)

    def update(self, batch: Batch) -> dict[str, Tensor]:
        grads, loss = self.grads(self.params, self.target_params, batch)
        adam_step(self.opt, grads)
        self.num_updates += 1
        if self.num_updates % self.target_update_period == 0:
            torch._foreach_copy_(list(self.target_params.values()), list(self.params.values()))
        return {"loss": loss}


FUNC_AGENTS = {td3.NAME: FuncTD3, sac.NAME: FuncSAC, dqn.NAME: FuncDQN}
