"""configs/td3_cemrl_hopper.yaml against the authors' code (apourchot/CEM-RL, es_grad.py).

Each generation there (lines 413-460): every sampled actor plays one episode into the shared
replay; before the next evaluation, each of the n_grad = 5 trained actors takes `actor_steps`
actor steps (the env steps the generation collected, line 431) and the critic `actor_steps //
n_grad` steps per trained actor (line 427): as many critic steps as env steps in all, and one
actor step per critic step (its --policy_freq, line 314, is never read).
"""

from __future__ import annotations

from pathlib import Path

from fastpop import config as config_lib

PRESET = Path(__file__).resolve().parents[1] / "configs" / "td3_cemrl_hopper.yaml"


def test_the_paper_preset_trains_each_actor_as_long_as_the_generation_collects():
    config = config_lib.load_config(str(PRESET), [])
    samples = config.population.size - 1  # member 0 acts with the CEM mean
    collected = samples * config.section("cemrl").generation_steps  # the samples' env steps, in all
    # The rate limiter: samples_per_insert / batch_size updates per env step of each member.
    updates = (config.replay.samples_per_insert / config.agent["batch_size"]) * config.section(
        "cemrl"
    ).generation_steps
    actor_steps = updates / config.hparams["policy_delay"]  # per trained actor
    assert updates == collected  # critic steps: es_grad.py line 427 (x n_grad)
    assert actor_steps == collected  # each trained actor: es_grad.py line 431


def test_the_paper_preset_starts_learning_and_explores_as_the_authors_code():
    config = config_lib.load_config(str(PRESET), [])
    samples = config.population.size - 1
    # Learning starts after --start_steps 10000 env steps in all (lines 299, 416) ...
    assert config.replay.min_size * samples == 10_000
    # ... taken by the sampled actors themselves, without action noise (line 451; the noisy
    # actors of lines 440-445 are off by default, --n_noisy 0, line 338).
    assert config.collect.warmup_steps == 0
    assert config.hparams["exploration_noise"] == 0.0
    # --max_steps 1000000 counts every actor's steps (lines 336, 409); fastpop counts per member.
    assert config.train.total_env_steps * samples == 1_000_000
