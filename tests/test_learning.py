"""Each algorithm clearly learns a cheap task with a population of 2 (in-process loop, seeded)."""

import numpy as np
import pytest

from fastpop import population
from fastpop.agents import make_agent
from fastpop.envs import env_spec_from_spaces, make_vector_env
from fastpop.inprocess import train_in_process

CASES = {
    # algo: env id, agent config, hparams, env steps, warm-up steps, bar (random policy: Pendulum
    # about -1200, CartPole about 22)
    "td3": (
        "Pendulum-v1",
        {"hidden_sizes": (64, 64), "batch_size": 128},
        {"actor_lr": 1e-3, "critic_lr": 1e-3},
        10_000,
        1_000,
        -400.0,
    ),
    "sac": (
        "Pendulum-v1",
        {"hidden_sizes": (64, 64), "batch_size": 128},
        {"actor_lr": 1e-3, "critic_lr": 1e-3, "alpha_lr": 1e-3},
        10_000,
        1_000,
        -400.0,
    ),
    "dqn": (
        "CartPole-v1",
        {"hidden_sizes": (64, 64), "batch_size": 64},
        {
            "learning_rate": 2.5e-3,
            "target_update_period": 100,
            "epsilon_decay_steps": 6_000,
            "epsilon_end": 0.02,
        },
        20_000,
        1_000,
        150.0,
    ),
}


@pytest.mark.parametrize("algo", sorted(CASES))
def test_population_of_two_learns(algo):
    env_id, config, hparams_values, steps, warmup, bar = CASES[algo]
    probe = make_vector_env(env_id, 1, seed=0)
    spec = env_spec_from_spaces(probe.single_observation_space, probe.single_action_space)
    probe.close()
    agent = make_agent(algo, spec, **config)
    hparams = population.broadcast_hparams(
        agent.default_hparams(), 2, **{k: [v, v] for k, v in hparams_values.items()}
    )
    result = train_in_process(
        agent,
        env_id,
        hparams,
        env_steps=steps,
        warmup_steps=warmup,
        seed=0,
        eval_interval=steps // 5,
        eval_episodes=5,
    )
    # One update per env step after warm-up, starting with the chunk that completes it.
    assert result.updates == steps - warmup + 10
    assert [step for step, _ in result.evaluations] == [steps // 5 * i for i in range(1, 6)]
    history = np.stack([returns for _, returns in result.evaluations])
    # Every member reaches the bar, far above a random policy. Value-based learners on CartPole
    # can oscillate after reaching it, so the best of the five evaluations counts.
    assert np.all(history.max(axis=0) >= bar), history
