"""The tasks of ray_sweep.py's `--task`: env, fixed TD3 settings, hparam priors, PB2 bounds.

A sibling module of ray_sweep.py (imported through sys.path[0], the script's directory). Each
task's priors are the ones of the fastpop config it is compared with. PBT resamples from the
priors (log-uniform learning rates); PB2 only takes [low, high] bounds and works on a LINEAR
scale (see ray_sweep.make_scheduler); its initial draws still come from the priors.
"""

from __future__ import annotations

import math

from ray import tune

TASKS = {
    # results/vs_ray_tune/td3_inverted_double_pendulum_sweep.yaml (why this env: README.md)
    "inverted_double_pendulum": {
        "env_id": "InvertedDoublePendulum-v5",
        "td3": {
            "gamma": 0.99,
            "policy_delay": 2,
            "target_policy_noise": 0.2,
            "target_noise_clip": 0.5,
        },
        "priors": {
            "actor_lr": tune.loguniform(1e-4, 3e-3),
            "critic_lr": tune.loguniform(1e-4, 3e-3),
            "exploration_noise": tune.uniform(0.05, 0.5),
        },
        "bounds": {
            "actor_lr": [1e-4, 3e-3],
            "critic_lr": [1e-4, 3e-3],
            "exploration_noise": [0.05, 0.5],
        },
        "report_steps": 2500,  # env steps per step(): one evaluation each
        "perturbation_interval": 5000,  # env steps
    },
    # results/sweeps_long_cpu/td3_gymnax_pendulum_long.yaml (gymnax's Pendulum-v1 there)
    "pendulum": {
        "env_id": "Pendulum-v1",
        "td3": {},  # discount, target noise and policy delay are hparams (SB3_ATTRS)
        "priors": {
            "actor_lr": tune.loguniform(3e-5, 3e-3),
            "critic_lr": tune.loguniform(3e-5, 3e-3),
            "discount": tune.uniform(0.9, 1.0),
            "exploration_noise": tune.uniform(0.0, 1.0),
            "policy_noise": tune.uniform(0.0, 1.0),
            "noise_clip": tune.uniform(0.0, 1.0),
            "policy_delay": tune.randint(1, 6),  # fastpop's int_uniform [1, 5]: upper excluded
        },
        "bounds": {
            "actor_lr": [3e-5, 3e-3],
            "critic_lr": [3e-5, 3e-3],
            "discount": [0.9, 1.0],
            "exploration_noise": [0.0, 1.0],
            "policy_noise": [0.0, 1.0],
            "noise_clip": [0.0, 1.0],
            # Ray's PB2 casts a proposal to the type of the hparam's current value, an int here
            # (tune.randint), with int(), which truncates: over [1, 5] a delay of 5 would need a
            # proposal of exactly 5.0. Over [1, 6] each of 1..5 gets a cell of width 1 (6.0 is
            # clamped to 5 by SB3_ATTRS), as the initial draws give each 1/5.
            "policy_delay": [1, 6],
        },
        "report_steps": 2000,  # fastpop's eval.interval
        "perturbation_interval": 2000,  # fastpop's ready interval (pbt.interval)
    },
}


def _discount(value) -> float:
    # PBT's x1.2 perturbation is not clipped by Ray (README.md): a discount above 1 would make
    # the TD targets diverge, so it is capped at 1 (fastpop clips to the prior, [0.9, 1]).
    return min(float(value), 1.0)


def _policy_delay(value) -> int:
    # Rounded half up and clamped to the prior's [1, 5]: PB2 may propose 6 (its bounds above),
    # PBT's x1.2 (rounded by Ray) takes a delay of 5 to 6, and a float from elsewhere rounds.
    return min(5, max(1, math.floor(float(value) + 0.5)))


# Hparams that are plain TD3 attributes: name -> (SB3 TD3 attribute, conversion). TD3.train()
# reads these attributes at every call, so setting them on the model takes effect at once.
SB3_ATTRS = {
    "discount": ("gamma", _discount),
    "policy_noise": ("target_policy_noise", float),
    "noise_clip": ("target_noise_clip", float),
    "policy_delay": ("policy_delay", _policy_delay),
}


def applied_value(name: str, value):
    """The value of hparam `name` that the model trains with (reported in rows.jsonl)."""
    return SB3_ATTRS[name][1](value) if name in SB3_ATTRS else float(value)
