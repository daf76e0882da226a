"""The twin critic of a TD3 or SAC member (`ActorCriticConfig.critic`): scalar, one Q per
critic, or distributional, logits over a fixed support of returns (C51) whose mean is Q.

An agent applies `Critic.network` and reads Q from its outputs with `Critic.q_values`; its
losses (`agents/losses.py`) take the outputs themselves, and the distributional ones the
support.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np

from fastpop.agents import losses
from fastpop.agents.base import ActorCriticConfig
from fastpop.agents.networks import TwinCritic

CRITICS = ("scalar", "distributional")
# What a deterministic actor maximizes of a twin critic (`TD3Config.actor_q`): the first
# critic's Q (TD3) or the smaller of the two (FastTD3; a distributional critic's: of the means).
ACTOR_QS = ("first", "min")


class Critic(NamedTuple):
    """A twin critic's network and, distributional, its support: the atoms' returns, (num_atoms,),
    static as the network's shape (None for a scalar critic): a numpy constant the losses close
    over (`losses.support_grid` reads its ends in float64). A member whose hparams v_min and
    v_max are set (tuned per member) has its own, traced (`member_support`)."""

    network: TwinCritic
    support: np.ndarray | None

    def member_support(self, hparams=None):
        """The support a member's losses use: the constant one, or where its hparams hold v_min
        or v_max (not None), a `losses.MemberSupport` of them (the other end the agent's)."""
        v_min, v_max = (getattr(hparams, end, None) for end in ("v_min", "v_max"))
        if self.support is None or (v_min is None and v_max is None):
            return self.support
        v_min = self.support[0] if v_min is None else v_min
        v_max = self.support[-1] if v_max is None else v_max
        return losses.member_support(v_min, v_max, len(self.support))

    def q_values(self, outputs: jax.Array, hparams=None) -> jax.Array:
        """Both critics' Q from the network's outputs: (..., 2); `hparams`: the member's, for
        its own support (None: the constant one)."""
        if self.support is None:
            return outputs
        return losses.categorical_mean(outputs, self.member_support(hparams))


def make_critic(config: ActorCriticConfig, observes=(None, None)) -> Critic:
    """The twin critic `config` describes, seeing the slice `observes` of an observation
    (EnvSpec.critic_observes)."""
    if config.critic not in CRITICS:
        raise ValueError(
            f"agent.critic: must be one of {', '.join(CRITICS)}, got {config.critic!r}"
        )
    if config.critic == "scalar":
        network = TwinCritic(
            config.hidden_sizes,
            config.compute_dtype,
            config.layer_norm,
            network=config.network,
            observes=observes,
            kernel=config.mlp_kernels,
        )
        return Critic(network, None)
    if config.num_atoms < 2 or not config.v_min < config.v_max:
        raise ValueError(
            f"a distributional critic needs agent.num_atoms >= 2 and agent.v_min < agent.v_max, "
            f"got {config.num_atoms}, {config.v_min} and {config.v_max}"
        )
    network = TwinCritic(
        config.hidden_sizes,
        config.compute_dtype,
        config.layer_norm,
        config.num_atoms,
        config.network,
        observes,
        config.mlp_kernels,
    )
    support = np.linspace(config.v_min, config.v_max, config.num_atoms, dtype=np.float32)
    return Critic(network, support)
