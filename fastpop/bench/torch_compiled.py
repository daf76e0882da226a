"""The population's TD3 and SAC updates as LeanRL (pytorch-labs/LeanRL) writes PyTorch at its
strongest: everything of an update step in one `torch.compile`d function (the batch sampled on
the device with `torch.randint`, the noise drawn, the vmapped gradients, a fused Adam, the
Polyak averaging), and on a GPU the K steps of a call captured in one CUDA graph, replayed once
per call.

The losses, the stacking and the hyperparameters are torch_func.py's (`FuncTD3`, `FuncSAC`):
from the same initial parameters and the same draws a step computes what their `update` does.
`single=True` is one LeanRL-style agent: the same code for one member, not vmapped.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.func import grad_and_value

from fastpop.agents import sac, td3
from fastpop.bench.torch_baseline import Batch
from fastpop.bench.torch_func import FuncSAC, FuncTD3, polyak
from fastpop.bench.torch_variants import own_code


class AdamHyper(NamedTuple):
    lr: float
    beta1: float
    beta2: float
    eps: float


class AdamState(NamedTuple):
    """Adam's moments and its step count, a device tensor (what Adam's `capturable=True`
    keeps): a CUDA graph's replay counts its steps."""

    step: Tensor
    exp_avg: list[Tensor]
    exp_avg_sq: list[Tensor]


def adam_hyper(optimizer: torch.optim.Optimizer) -> AdamHyper:
    group = optimizer.param_groups[0]
    return AdamHyper(group["lr"], *group["betas"], group["eps"])


def adam_state(params: list[Tensor]) -> AdamState:
    zeros = lambda: [torch.zeros_like(p) for p in params]
    return AdamState(torch.zeros((), device=params[0].device), zeros(), zeros())


def adam_update(params: list[Tensor], grads: list[Tensor], state: AdamState, hp: AdamHyper):
    """torch.optim.Adam's step (no weight decay, no amsgrad) in place, elementwise: Inductor
    fuses each tensor's moments and parameter update into one kernel."""
    state.step.add_(1)
    step_size = hp.lr / (1 - hp.beta1**state.step)
    bias2_sqrt = (1 - hp.beta2**state.step).sqrt()
    for param, grad, exp_avg, exp_avg_sq in zip(
        params, grads, state.exp_avg, state.exp_avg_sq, strict=True
    ):
        exp_avg.lerp_(grad, 1 - hp.beta1)
        exp_avg_sq.mul_(hp.beta2).addcmul_(grad, grad, value=1 - hp.beta2)
        param.sub_(step_size * exp_avg / (exp_avg_sq.sqrt() / bias2_sqrt + hp.eps))


class LeanUpdate:
    """What TD3's and SAC's steps share: the state (parameters, Adam's, every member's buffer:
    plain tensors, updated in place, so a CUDA graph's replay finds them where it captured
    them), the draws and the sampling."""

    def __init__(self, func, agents: list, fields: list[Tensor], single: bool):
        self.func, self.single = func, single
        self.population = len(agents)
        if single and self.population != 1:
            raise ValueError(f"a single agent is one member, not {self.population}")
        self.take = (lambda t: t[0].clone()) if single else (lambda t: t.clone())
        self.transform = (lambda f: f) if single else torch.vmap
        self.buffer = [field[0].clone() if single else field for field in fields]
        self.batch_size, self.buffer_rows = agents[0].batch_size, fields[0].shape[1]
        self.device = fields[0].device
        self.lead = () if single else (self.population,)
        self.action_dim = fields[Batch._fields.index("action")].shape[-1]
        self.state: dict = {}
        self.compiled = False

    def params(self, stacked: dict) -> dict:
        return {name: self.take(tensor) for name, tensor in stacked.items()}

    def actor_critic_state(self, func) -> dict:
        """The state TD3 and SAC share: the actor, the critic and its target, both Adams (their
        hyperparameters as `critic_hp`, `actor_hp`) and the buffers."""
        critic, actor = self.params(func.critic_params), self.params(func.actor_params)
        self.critic_hp, self.actor_hp = adam_hyper(func.critic_opt), adam_hyper(func.actor_opt)
        return {
            "critic": critic,
            "actor": actor,
            "target_critic": self.params(func.target_critic_params),
            "critic_adam": adam_state(list(critic.values())),
            "actor_adam": adam_state(list(actor.values())),
            "buffer": self.buffer,
        }

    def indices(self) -> Tensor:
        shape = (*self.lead, self.batch_size)
        return torch.randint(0, self.buffer_rows, shape, device=self.device)

    def normal(self) -> Tensor:
        return torch.randn((*self.lead, self.batch_size, self.action_dim), device=self.device)

    def sample(self, buffer: list[Tensor], idx: Tensor) -> Batch:
        """Member i's rows `idx[i]` of member i's buffer (one agent: `idx` of its own)."""
        if self.single:
            return Batch(*(field[idx] for field in buffer))
        members = torch.arange(self.population, device=idx.device)[:, None]
        return Batch(*(field[members, idx] for field in buffer))

    def compile(self, compile_fn) -> None:
        """Each step function through `compile_fn` (e.g. `torch.compile`), on its own copy of
        the code: Dynamo's cache is per code object, and each row's stays its own."""
        for name in self.step_functions:
            setattr(self, name + "_fn", compile_fn(own_code(getattr(self, name))))
        self.compiled = True

    def fingerprint(self) -> Tensor:
        """A copy of one parameter tensor the next update changes."""
        return next(iter(self.state["critic"].values())).clone()

    def finite(self) -> bool:
        """Whether every parameter (online, target, temperature) is finite."""
        tensors = []
        for value in self.state.values():
            if isinstance(value, dict):
                tensors += list(value.values())
            elif isinstance(value, Tensor):
                tensors.append(value)
        return all(bool(torch.isfinite(tensor).all()) for tensor in tensors)


class LeanTD3(LeanUpdate):
    """FuncTD3.update as two compiled functions: the critic's step (sampling and noise
    included) every update, the actor's (and the Polyak averaging) every `policy_delay`-th."""

    step_functions = ("critic_step", "actor_step")

    def __init__(self, agents: list, fields: list[Tensor], single: bool = False):
        func = FuncTD3(agents)
        super().__init__(func, agents, fields, single)
        self.state = self.actor_critic_state(func)
        self.state["target_actor"] = self.params(func.target_actor_params)
        self.critic_grads = self.transform(grad_and_value(func.critic_loss))
        self.actor_grads = self.transform(grad_and_value(func.actor_loss))
        self.policy_delay = func.policy_delay
        self.critic_step_fn, self.actor_step_fn = self.critic_step, self.actor_step

    def critic_update(self, state: dict, batch: Batch, noise: Tensor) -> Tensor:
        """FuncTD3.update's critic half with its standard normal draw `noise`."""
        func = self.func
        noise = (noise * func.policy_noise).clamp(-func.noise_clip, func.noise_clip)
        critic = state["critic"]
        grads, loss = self.critic_grads(
            critic, state["target_actor"], state["target_critic"], batch, noise
        )
        adam_update(
            list(critic.values()), list(grads.values()), state["critic_adam"], self.critic_hp
        )
        return loss

    def actor_update(self, state: dict, obs: Tensor) -> Tensor:
        """FuncTD3.update's delayed half: the actor's step, then both targets' averaging."""
        actor = state["actor"]
        grads, loss = self.actor_grads(actor, state["critic"], obs)
        adam_update(list(actor.values()), list(grads.values()), state["actor_adam"], self.actor_hp)
        polyak(state["target_actor"], actor)
        polyak(state["target_critic"], state["critic"])
        return loss

    def critic_step(self, state: dict) -> Tensor:
        """One update's draws (indices, then noise) and critic step; the batch's obs for the
        actor step."""
        idx = self.indices()
        noise = self.normal()
        batch = self.sample(state["buffer"], idx)
        self.critic_update(state, batch, noise)
        return batch.obs

    def actor_step(self, state: dict, obs: Tensor) -> None:
        self.actor_update(state, obs)

    def run(self, done: int, count: int) -> None:
        """Updates `done + 1` ... `done + count`: the actor's at multiples of `policy_delay`."""
        for number in range(done + 1, done + count + 1):
            obs = self.critic_step_fn(self.state)
            if number % self.policy_delay == 0:
                self.actor_step_fn(self.state, obs)

    def phase(self, done: int) -> int:
        """What a call's schedule of actor steps depends on."""
        return done % self.policy_delay


class LeanSAC(LeanUpdate):
    """FuncSAC.update as one compiled function (sampling and both draws included)."""

    step_functions = ("step",)

    def __init__(self, agents: list, fields: list[Tensor], single: bool = False):
        func = FuncSAC(agents)
        super().__init__(func, agents, fields, single)
        self.state = self.actor_critic_state(func)
        log_alpha = self.state["log_alpha"] = self.take(func.log_alpha)
        self.state["alpha_adam"] = adam_state([log_alpha])
        self.alpha_hp = adam_hyper(func.alpha_opt)
        self.critic_grads = self.transform(grad_and_value(func.critic_loss))
        self.actor_grads = self.transform(grad_and_value(func.actor_loss, has_aux=True))
        self.step_fn = self.step

    def update(self, state: dict, batch: Batch, eps_next: Tensor, eps_new: Tensor) -> Tensor:
        """FuncSAC.update with its draws given; the critic's loss."""
        critic, actor, log_alpha = state["critic"], state["actor"], state["log_alpha"]
        alpha = log_alpha.exp()
        grads, loss = self.critic_grads(
            critic, actor, state["target_critic"], alpha, batch, eps_next
        )
        adam_update(
            list(critic.values()), list(grads.values()), state["critic_adam"], self.critic_hp
        )
        grads, (_, mean_logp) = self.actor_grads(actor, critic, alpha, batch.obs, eps_new)
        adam_update(list(actor.values()), list(grads.values()), state["actor_adam"], self.actor_hp)
        alpha_grad = -(mean_logp + self.func.target_entropy)
        adam_update([log_alpha], [alpha_grad], state["alpha_adam"], self.alpha_hp)
        polyak(state["target_critic"], critic)
        return loss

    def step(self, state: dict) -> None:
        """One update's draws (indices, the next actions' noise, the new actions') and update."""
        idx = self.indices()
        eps_next, eps_new = self.normal(), self.normal()
        self.update(state, self.sample(state["buffer"], idx), eps_next, eps_new)

    def run(self, done: int, count: int) -> None:
        for _ in range(count):
            self.step_fn(self.state)

    def phase(self, done: int) -> int:
        return 0


LEAN_AGENTS = {td3.NAME: LeanTD3, sac.NAME: LeanSAC}


def phases_in_order(lean: LeanUpdate, done: int, updates_per_call: int) -> list[tuple[int, int]]:
    """(phase, first update done) of the calls from `done` on, until a phase repeats: the
    graphs a call of `updates_per_call` updates needs (TD3 with K a multiple of the delay: 1)."""
    seen: list[tuple[int, int]] = []
    while lean.phase(done) not in [phase for phase, _ in seen]:
        seen.append((lean.phase(done), done))
        done += updates_per_call
    return seen


class KStepCall:
    """One timed call of `lean`: `updates_per_call` updates; on CUDA, once `capture` has
    succeeded, the replay of the graph captured for the call's phase instead."""

    def __init__(self, lean: LeanUpdate, updates_per_call: int):
        self.lean, self.updates_per_call, self.done = lean, updates_per_call, 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.cuda = lean.device.type == "cuda"

    def __call__(self) -> None:
        if self.graphs:
            self.graphs[self.lean.phase(self.done)].replay()
        else:
            self.lean.run(self.done, self.updates_per_call)
        self.done += self.updates_per_call

    def sync(self) -> None:
        """Waits for the call's kernels (they run asynchronously on a GPU)."""
        if self.cuda:
            torch.cuda.synchronize(self.lean.device)

    def warm_up(self, calls: int) -> None:
        """`calls` calls (compiling on the first ones); on CUDA on a side stream, as
        tensordict's CudaGraphModule warms up, so what is made lazily on a first call (cuBLAS
        handles and workspaces, Triton's loaded kernels) is made before, not in, a capture."""
        if not self.cuda:
            for _ in range(calls):
                self()
            return
        device = self.lean.device
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(calls):
                self()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.sync()

    def capture(self) -> None:
        """Captures one CUDA graph of K updates per phase of the calls to come (one, unless
        K is not a multiple of TD3's policy delay), then replays each once and checks that the
        parameters moved. Raises what went wrong, the call left replaying nothing."""
        graphs = {}
        for phase, done in phases_in_order(self.lean, self.done, self.updates_per_call):
            graph = torch.cuda.CUDAGraph()
            # thread_local: the capture's own thread may not make unsafe calls; JAX's threads
            # in this process are left alone
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.lean.run(done, self.updates_per_call)
            graphs[phase] = graph
        before = self.lean.fingerprint()
        self.graphs = graphs
        try:
            for _ in graphs:
                self()
            self.sync()
            if torch.equal(before, self.lean.fingerprint()):
                raise RuntimeError("replaying the captured graphs left the parameters unchanged")
        except BaseException:
            self.graphs = {}
            raise
