"""Bytes a distributed fastpop run moves between hosts, from fastpop's own networks and replay
layout (no run needed): python results/scaling/bytes_per_round.py"""

from __future__ import annotations

import jax
import numpy as np

from fastpop import config as config_lib
from fastpop.config.build import build_agent, build_env_spec, build_replay_spec
from fastpop.population import replay


def tree_bytes(tree) -> int:
    return int(sum(np.prod(leaf.shape) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)))


def sizes(preset: str, overrides=()) -> dict:
    config = config_lib.load_config(f"configs/{preset}.yaml", list(overrides))
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    hparams = config_lib.default_member_hparams(config, agent)
    state = jax.eval_shape(agent.init, jax.random.key(0), hparams)
    policy = jax.eval_shape(agent.policy_params, state)
    replay_spec = build_replay_spec(config, spec)
    return {
        "preset": preset,
        "member_state_bytes": tree_bytes(state),
        "policy_bytes": tree_bytes(policy),
        "policy_parameters": tree_bytes(policy) // 4,
        "replay_bytes_per_member": replay.memory_estimate_bytes(replay_spec),
        "row_bytes": replay.memory_estimate_bytes(replay_spec) // config.replay.capacity,
        "chunk_len": config.collect.chunk_len,
        # what CEM-RL and DvD all-reduce every update: the shared critic's gradients (TD3)
        "critic_bytes": tree_bytes(getattr(state, "critic", None)),
    }


if __name__ == "__main__":
    for preset in ("td3_halfcheetah", "dqn_pong"):
        print(sizes(preset))
