"""Returns of fixed policies on brax/inverted_pendulum per backend (8 episodes of at most 1000
steps each): uniform random actions, zero force, and a linear controller on (position, angle,
velocity, angular velocity) that balances the generalized pendulum.

    python results/brax_inverted_pendulum_cpu/baselines.py [backend ...]
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from fastpop.collect import device_rollout
from fastpop.envs import brax_envs

GAINS = jnp.array([0.05, 3.0, 0.1, 0.3])  # force = clip(gains . obs, -1, 1)
POLICIES = {
    "random": lambda obs, key, t: jax.random.uniform(key, (obs.shape[0], 1), minval=-1.0),
    "zero force": lambda obs, key, t: jnp.zeros((obs.shape[0], 1)),
    "linear": lambda obs, key, t: jnp.clip(obs @ GAINS, -1.0, 1.0)[:, None],
}

for backend in sys.argv[1:] or ["generalized", "spring"]:
    env = brax_envs.make_brax_env("brax/inverted_pendulum", backend)
    for name, act in POLICIES.items():
        run = jax.jit(lambda key, act=act, env=env: device_rollout.evaluate(env, 1000, act, key, 8))
        returns = np.asarray(run(jax.random.PRNGKey(0)))
        print(f"{backend} (dt {env.dt:.2f} s) {name}: mean {returns.mean():.0f} {returns}")
