"""The Agent interface: pure functions for ONE population member.

An agent factory (`make_td3`, `make_sac`, `make_dqn`) closes over static shapes only
(network sizes, batch size, action bounds). Everything a population may vary per member
lives in the algorithm's `HParams` NamedTuple of scalar arrays, passed as an argument so that
one compiled program serves members with different values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fastpop.agents import hyperspherical
from fastpop.agents.mlp_kernels import MLPKernel
from fastpop.types import EnvSpec, PRNGKey, PyTree, Transition

State = Any
HParams = Any


class Agent(NamedTuple):
    """Pure functions of one member.

    init(key, hparams) -> state
    act(policy_params, obs, key, hparams, explore, env_steps, episode_draws=None) -> actions
    for a batch of obs; `episode_draws` (batch,): each obs's env lane's uniform draw in [0, 1),
    made anew at the start of each of its episodes, where `episode_draws` (the field) is set
    update(state, batch, hparams, key) -> (state, metrics dict of scalars)
    policy_params(state) -> what collectors need to act (published to them)
    default_hparams() -> HParams of scalar arrays with the paper's defaults
    draw(key) -> the random numbers one update uses (a pytree; None for none)
    update_drawn(state, batch, hparams, drawn) -> `update` given draw(key): the same numbers.
    A loop of K updates draws all K at once outside its body (`population.member_update_loop`):
    one random-number program instead of K, identical values.
    """

    name: str
    init: Callable[[PRNGKey, HParams], State]
    act: Callable[..., jax.Array]
    update: Callable[[State, Transition, HParams, PRNGKey], tuple[State, dict]]
    draw: Callable[[PRNGKey], PyTree]
    update_drawn: Callable[[State, Transition, HParams, PyTree], tuple[State, dict]]
    policy_params: Callable[[State], PyTree]
    default_hparams: Callable[[], HParams]
    batch_size: int
    # Algorithm-specific functions inside `update` (e.g. TD3's critic and actor steps), for code
    # that recombines or costs them: shared-critic strategies, per-step FLOP counts in the
    # benchmark (`TD3Internals`, `SACInternals`).
    internals: Any = None
    n_step: int = 1  # env steps a sampled transition spans (the replay's `Sampler` reads it)
    # Its exploring `act` reads each env lane's episode draw (TD3's per-episode noise std): the
    # acting code (device lanes, collectors) keeps one per lane, drawn at each episode start.
    episode_draws: bool = False


def no_draws(key: PRNGKey) -> None:
    """`Agent.draw` of an update that draws no random numbers."""
    del key


def keyed_update(draw: Callable, update_drawn: Callable) -> Callable:
    """update(state, batch, hparams, key) from an agent's `draw` and `update_drawn`."""
    return lambda state, batch, hparams, key: update_drawn(state, batch, hparams, draw(key))


def hparams_from_values(hparams_type: type, integer_fields: frozenset[str], **values) -> Any:
    """Build an HParams NamedTuple of scalar arrays (int32 for counts, float32 otherwise), made
    on the host and put on the device at once (converted there, each dtype compiled a program)."""
    return jax.device_put(
        hparams_type(
            **{
                name: np.asarray(value, np.int32 if name in integer_fields else np.float32)
                for name, value in values.items()
                if value is not None  # an optional field left to its default, None
            }
        )
    )


def hparam_fields(hparams) -> dict:
    """name -> value of the fields an HParams holds: an optional field left to its default
    (None, e.g. a support's ends when the agent's config gives them) is not among them."""
    return {name: value for name, value in hparams._asdict().items() if value is not None}


def hparam_dtype(value):
    """The dtype of an hparam field's values: its default's, float32 for an optional field left
    None."""
    return np.float32 if value is None else value.dtype


def adam_step(
    params: PyTree,
    grads: PyTree,
    opt_state: optax.OptState,
    optimizer: optax.GradientTransformation,
    learning_rate: jax.Array,
) -> tuple[PyTree, optax.OptState]:
    """One optimizer step with the learning rate as a traced per-member value.

    The optimizer state holds only moments; the rate comes from HParams, so PBT can change it
    without touching (or recompiling) the optimizer.
    """
    direction, opt_state = optimizer.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, d: p - learning_rate * d, params, direction)
    return hyperspherical.project(params), opt_state  # (a SimbaV2 network's kernels)


def network_optimizer(weight_decay: float) -> optax.GradientTransformation:
    """The moment-only optimizer of `adam_step` for a member's networks: Adam's direction, and
    with a weight decay AdamW's (Loshchilov & Hutter, 2019): direction + weight_decay * params,
    which `adam_step` scales by the learning rate, as `optax.adamw` does (and PyTorch's AdamW,
    FastTD3's: params * (1 - lr * weight_decay) - lr * Adam's direction). Plain Adam's state
    without one, as before the option."""
    adam = optax.scale_by_adam()
    if weight_decay == 0.0:
        return adam
    return optax.chain(adam, optax.add_decayed_weights(weight_decay))


def polyak(target: PyTree, online: PyTree, tau: jax.Array) -> PyTree:
    """target <- tau * online + (1 - tau) * target, leafwise (optax's Polyak average)."""
    return optax.incremental_update(online, target, tau)


def select_tree(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    """Leafwise `where` with a scalar predicate (a branch-free choice between two states)."""
    return optax.tree.where(pred, on_true, on_false)


@dataclasses.dataclass(frozen=True)
class ActorCriticConfig:
    """Static shape of a TD3 or SAC member; equal across a population."""

    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of actor and critics (the paper: 256-256)."""
    actor_hidden_sizes: tuple[int, ...] | None = None
    """The actor's own hidden layer widths (FastTD3: 512-256-128 under 1024-512-256 critics);
    null: `hidden_sizes`."""
    batch_size: int = 256
    """Transitions per gradient step."""
    compute_dtype: str = "float32"
    """What the networks' matmuls compute in (float32 or bfloat16); parameters and optimizer
    state stay float32."""
    n_step: int = 1
    """Env steps a transition's return spans before it bootstraps (n-step returns): never
    across a termination, through a truncation (population/n_step.py); 1: one-step TD."""
    observation_norm: bool = False
    """Normalize observations by the member's running mean and variance, clip((obs - mean) /
    sqrt(var + 1e-8), -10, 10), wherever its networks see one: in its update and in every policy
    made from its published params (collectors, evaluation, fastpop eval and export). The
    statistics are updated from the batches it learns from and kept in its state (checkpoints,
    PBT's copies). Vector observations only; not with strategies that share one critic."""
    critic: str = "scalar"
    """scalar: each twin critic outputs Q(s, a); distributional: each outputs logits over
    num_atoms returns evenly spaced from v_min to v_max (C51, Bellemare et al. 2017, as FastTD3
    uses it), trained by cross-entropy to the projected target distribution, its Q the mean."""
    num_atoms: int = 101
    """Returns (atoms) of a distributional critic's support (FastTD3: 101)."""
    v_min: float = -250.0
    """Lowest return of a distributional critic's support: lower targets are clipped to it.
    Set it (and v_max) to the range of the env's discounted returns."""
    v_max: float = 250.0
    """Highest return of a distributional critic's support: higher targets are clipped to it."""
    layer_norm: bool = False
    """LayerNorm after each hidden layer of the critics; the actor has none. fastpop's own
    option, which its recipe configs add to FastTD3's: FastTD3's critic has no LayerNorm."""
    network: str = "mlp"
    """The actor's and critics' hidden layers: mlp, Dense + ReLU layers of `hidden_sizes`;
    residual, SimBa's (Lee et al., 2024, as v1: no SimbaV2 hyperspherical normalization): a
    linear layer, one pre-LayerNorm residual block per hidden size (x + Dense(h)(relu(Dense(4h)(
    LayerNorm(x))))), a final LayerNorm, then the output layer; simbav2, SimbaV2's
    hyperspherical one (Lee et al., 2025; FastTD3's recommended network: agents/hyperspherical.py):
    features kept on the unit sphere, one block per hidden size interpolating between its input
    and a normalized MLP's output by a learned rate, learned per-unit scalers, kernels whose
    columns every optimizer step puts back on the sphere. Residual and simbav2 `hidden_sizes`
    must be equal (the blocks' width); `layer_norm` adds nothing to them. Their policies act
    through JAX, not the collectors' numpy MLP."""
    mlp_kernel: str = "xla"
    """What computes the actor's and critics' MLPs: xla, flax's Dense layers as XLA compiles
    them; pallas, one fused Pallas kernel for a whole MLP's forward pass and one for its backward
    (agents/pallas_mlp.py: Triton on a GPU, interpret mode elsewhere, which is slow). The same
    parameters and numbers to float rounding; `network: mlp` without `layer_norm` only. The
    `pallas-mlp` lever of `fastpop bench update`."""
    mlp_kernel_tiles: tuple[int, ...] | None = None
    """A pallas MLP's tiling, [rows, chunk, warps] (agents/pallas_mlp.py's `Tiles`): rows of one
    member per program, the widest tile of columns it holds, Triton's warps; null: [32, 64, 8].
    It changes the speed, never the parameters, and the numbers only to float rounding."""

    weight_decay: float = 0.0
    """AdamW's decoupled weight decay of the actor's and critics' parameters (FastTD3: 0.1):
    each step also takes learning_rate * weight_decay * params off them; 0: Adam. SAC's
    temperature has none."""

    @property
    def actor_widths(self) -> tuple[int, ...]:
        """The actor's hidden layer widths."""
        return self.actor_hidden_sizes or self.hidden_sizes

    @property
    def mlp_kernels(self) -> MLPKernel:
        """What computes the actor's and critics' MLPs."""
        return MLPKernel(self.mlp_kernel, self.mlp_kernel_tiles)


def init_actor_critic(key: PRNGKey, actor_net, critic_net, spec: EnvSpec):
    """Independently initialised actor and twin-critic parameters for one member."""
    actor_key, critic_key = jax.random.split(key)
    obs = jnp.zeros((1, *spec.obs_shape), spec.obs_dtype)
    action = jnp.zeros((1, spec.action_dim), jnp.float32)
    return actor_net.init(actor_key, obs), critic_net.init(critic_key, obs, action)


class UpdateAnatomy(NamedTuple):
    """What one member's update step reads and writes of its state, and which of its parts run
    on which steps, named by the algorithm's own state fields: what `fastpop bench update`
    judges a step against (bench/floors.py: the state-traffic floor, XLA's costs of the parts)."""

    optimised: tuple[tuple[str, str], ...]
    """(tree, its optimizer's state) for every tree an optimizer steps."""
    targets: tuple[str, ...] = ()
    """Target trees (None in a state without one): read by every step, written when updated."""
    write_fractions: Mapping[str, float] = MappingProxyType({})
    """The fraction of steps that write a tree, for the trees a delayed step writes (else 1)."""
    parts: tuple[tuple[Callable, float], ...] = ()
    """Where the update branches (XLA costs a conditional as its larger branch): its parts,
    each (part(state, batch, hparams, key), the fraction of steps that run it); (): the whole
    update, on every step."""
    branch_fraction: float | None = None
    """The fraction of steps whose update takes its conditional branch (its kernels counted as
    they run); None: the update has no conditional."""


class AlgorithmEntry(NamedTuple):
    """Everything fastpop needs to know about one algorithm (`agents/registry.py` lists them):
    each algorithm's module defines its entry next to its factory."""

    name: str
    """What `algo:` in a config names it by."""
    make: Callable[[EnvSpec, Any], Agent]
    """The agent factory: make(spec, config_type(**config's agent section))."""
    config_type: type
    """Frozen dataclass of the static fields a config's `agent:` section sets."""
    actions: str
    """The action kind it acts in: "continuous" or "discrete"."""
    numpy_policy: str | None
    """How a collector acts for it without JAX: a kind of `NUMPY_POLICY_HPARAMS`
    (`collect/numpy_policy.KINDS`: "deterministic", "squashed_gaussian", "epsilon_greedy");
    None: the agent's jitted act."""
    deterministic_action: str
    """What its act(..., explore=False) is, in words (`fastpop export`'s policy.json)."""
    shared_critic: bool = False
    """Its state and `internals` are TD3's (deterministic actor, twin critics and their targets),
    which the shared-critic strategies (cemrl, dvd) recombine."""
    asymmetric: bool = False
    """Its actor sees the EnvSpec's `actor_observes` and its critics `critic_observes`: it
    trains on envs whose observation holds privileged state for the critics alone
    (`policy_obs_size` > 0), which refuse the algorithms that do not say so."""
    numpy_hparams: Mapping[str, str] = MappingProxyType({})
    """role -> the field of its HParams that its numpy policy reads for that role
    (`NUMPY_POLICY_HPARAMS`), where the field is not named as the role, e.g.
    {"exploration_noise": "noise_std"}."""
    policy_torso: str = "MLP_0"
    """Its numpy policy's MLP: the module of its policy params' "params" whose `Dense_<i>`
    layers are the deterministic kind's whole actor, the other kinds' hidden layers (their
    heads: the `Dense_<i>` layers beside it). flax names an actor's first MLP `MLP_0`."""
    update_anatomy: Callable[[Agent, Any], UpdateAnatomy] | None = None
    """(agent, hparams) -> its `UpdateAnatomy`, for `fastpop bench update`'s floor; None: the
    benchmark knows no floor for it (and says so)."""

    def numpy_hparam_names(self) -> dict[str, str]:
        """role -> its HParams field, of every hparam its numpy policy reads ({} without one)."""
        roles = NUMPY_POLICY_HPARAMS.get(self.numpy_policy, ())
        return {role: self.numpy_hparams.get(role, role) for role in roles}


ACTION_KINDS = ("continuous", "discrete")
NUMPY_POLICY_HPARAMS = {
    "deterministic": ("exploration_noise",),
    "squashed_gaussian": (),
    "epsilon_greedy": ("epsilon_start", "epsilon_end", "epsilon_decay_steps"),
}
"""The numpy policies' kinds (`collect/numpy_policy.KINDS`, which acts them) and the roles of
the hparams each reads: the deterministic kind's Gaussian noise std in half action ranges (with
agent.exploration_std_min, the top of each episode's draw); epsilon_greedy's epsilon at the
start, at the end, and the env steps of its linear decay. An algorithm's field of a role is
named as the role unless its entry names another (`AlgorithmEntry.numpy_hparams`)."""
