"""Each algorithm clearly learns a cheap task with a population of 2: the real learner (replay,
rate limiter, updates, strategy rounds) driven in-process, so the run is seeded and exact."""

import numpy as np
import pytest

from fastpop.config import load_config
from fastpop.run.inprocess import train_in_process
from tests.runs import DQN_CARTPOLE, REPO

pytestmark = pytest.mark.optimized  # every test here trains to a threshold

CASES = {
    # algo: preset, env steps per member, bar (random policy: Pendulum about -1200, CartPole
    # about 22). The presets: 64-64 networks, one update per env step after 1000 random steps.
    # Each runs about as long as its bar needs (evaluated every 1k steps to 10k: both TD3
    # members pass -400 from 6k on, SAC's from 5k, DQN's 150 from 2k-4k).
    "td3": (REPO / "configs" / "td3_pendulum_cpu.yaml", 8_000, -400.0),
    "sac": (REPO / "configs" / "sac_pendulum_cpu.yaml", 6_000, -400.0),
    "dqn": (DQN_CARTPOLE, 10_000, 150.0),
}
CHUNK = 10  # env steps per insert; one update call of 10 updates per insert
# FastTD3's recipe: a C51 critic on a support that holds Pendulum's discounted returns (rewards
# in [-16.3, 0], discount 0.99), 51 atoms, 3-step returns and observation normalization, with
# fastpop's LayerNorm (FastTD3's critic has none); one member, whose update costs about what a
# population of 2 with the scalar critic does on a CPU. TD3 only: SAC's distributional critic is
# checked against hand-computed targets (tests/test_distributional.py) and for equal numbers
# vectorized and sequential.
RECIPE = [
    "agent.critic=distributional",
    "agent.num_atoms=51",
    "agent.v_min=-1600",
    "agent.v_max=0",
    "agent.layer_norm=true",
    "agent.n_step=3",
    "agent.observation_norm=true",
    "collect.num_collectors=1",
]


def train_and_check(preset, steps, bar, overrides, members):
    config = load_config(
        preset,
        [
            f"population.size={members}",
            f"train.total_env_steps={steps}",
            f"eval.interval={steps // 5}",
            f"collect.chunk_len={CHUNK}",
            f"train.updates_per_call={CHUNK}",
            "replay.tolerance=0.01",  # the rate limiter's slack: one insert plus one call
            *overrides,
        ],
    )
    result = train_in_process(config)
    warmup = config.collect.warmup_steps
    # One update per env step after the warm-up, give or take the limiter's slack of two calls.
    assert abs(result.updates - (steps - warmup)) <= 2 * CHUNK
    assert [step for step, _ in result.evaluations] == [steps // 5 * i for i in range(1, 6)]
    history = np.stack([returns for _, returns in result.evaluations])
    assert history.shape == (5, members)
    # Every member reaches the bar, far above a random policy. Value-based learners on CartPole
    # can oscillate after reaching it, so the best of the five evaluations counts.
    assert np.all(history.max(axis=0) >= bar), history


@pytest.mark.parametrize("algo", sorted(CASES))
def test_population_of_two_learns(algo):
    train_and_check(*CASES[algo], [], members=2)


def test_td3_with_the_recipe_learns():
    train_and_check(CASES["td3"][0], 8_000, -400.0, RECIPE, members=1)
