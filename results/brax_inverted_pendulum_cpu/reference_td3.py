"""A minimal TD3 (CleanRL-style, one file, independent of fastpop) on a gymnasium env: the
baseline that tells a fastpop defect from a hard task (README.md here).

    python results/brax_inverted_pendulum_cpu/reference_td3.py InvertedPendulum-v5 30000 1

Arguments: env id, env steps, seed, hidden width (64), learning rate (1e-3), batch (128), tau
(0.005).
1000 uniform random steps first, then one update per env step; policy delay 2,
exploration noise 0.1 and target noise 0.2 (clip 0.5) of the action half-range.
"""

import sys
import time

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

args = sys.argv[1:] + [None] * 7
ENV_ID, TOTAL, SEED = args[0], int(args[1]), int(args[2] or 0)
HIDDEN, LR, BATCH = int(args[3] or 64), float(args[4] or 1e-3), int(args[5] or 128)
START, GAMMA, TAU = 1000, 0.99, float(args[6] or 0.005)

env, eval_env = gym.make(ENV_ID), gym.make(ENV_ID)
obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
high = float(env.action_space.high[0])


class Actor(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(HIDDEN)(nn.relu(nn.Dense(HIDDEN)(x))))
        return jnp.tanh(nn.Dense(act_dim)(x)) * high


class Critic(nn.Module):
    @nn.compact
    def __call__(self, x, a):
        x = jnp.concatenate([x, a], -1)
        return nn.Dense(1)(nn.relu(nn.Dense(HIDDEN)(nn.relu(nn.Dense(HIDDEN)(x)))))[..., 0]


actor, critic = Actor(), Critic()
key = jax.random.PRNGKey(SEED)
k1, k2, k3, key = jax.random.split(key, 4)
o0, a0 = jnp.zeros((1, obs_dim)), jnp.zeros((1, act_dim))
actor_params = actor.init(k1, o0)
critic_params = (critic.init(k2, o0, a0), critic.init(k3, o0, a0))
target_actor, target_critic = actor_params, critic_params
optimizer = optax.adam(LR)
actor_opt, critic_opt = optimizer.init(actor_params), optimizer.init(critic_params)


@jax.jit
def update(actor_params, critic_params, target_actor, target_critic, opts, batch, key, due):
    actor_opt, critic_opt = opts
    o, a, r, o2, terminated = batch
    noise = jnp.clip(jax.random.normal(key, a.shape) * 0.2, -0.5, 0.5) * high
    a2 = jnp.clip(actor.apply(target_actor, o2) + noise, -high, high)
    q2 = jnp.minimum(*(critic.apply(p, o2, a2) for p in target_critic))
    y = r + GAMMA * (1 - terminated) * q2

    def critic_loss(params):
        return sum(((critic.apply(p, o, a) - y) ** 2).mean() for p in params)

    grads = jax.grad(critic_loss)(critic_params)
    step, critic_opt = optimizer.update(grads, critic_opt)
    critic_params = optax.apply_updates(critic_params, step)

    def actor_loss(params):
        return -critic.apply(critic_params[0], o, actor.apply(params, o)).mean()

    step, new_opt = optimizer.update(jax.grad(actor_loss)(actor_params), actor_opt)
    new_actor = optax.apply_updates(actor_params, step)
    pick = lambda new, old: jax.tree.map(lambda x, y: jnp.where(due, x, y), new, old)
    actor_params, actor_opt = pick(new_actor, actor_params), pick(new_opt, actor_opt)
    target_actor = pick(optax.incremental_update(actor_params, target_actor, TAU), target_actor)
    target_critic = pick(optax.incremental_update(critic_params, target_critic, TAU), target_critic)
    return actor_params, critic_params, target_actor, target_critic, (actor_opt, critic_opt)


policy = jax.jit(actor.apply)


def evaluate(episodes=5):
    total = 0.0
    for i in range(episodes):
        x, _ = eval_env.reset(seed=1000 + i)
        done = False
        while not done:
            x, reward, terminated, truncated, _ = eval_env.step(np.asarray(policy(actor_params, x)))
            total, done = total + reward, terminated or truncated
    return total / episodes


OBS, NEXT_OBS = np.zeros((TOTAL, obs_dim), np.float32), np.zeros((TOTAL, obs_dim), np.float32)
ACTIONS, REWARDS, TERMINATED = (
    np.zeros((TOTAL, act_dim), np.float32),
    np.zeros(TOTAL, np.float32),
    np.zeros(TOTAL),
)
rng = np.random.default_rng(SEED)
obs, _ = env.reset(seed=SEED)
opts, episode_return, returns, start = (actor_opt, critic_opt), 0.0, [], time.time()
for t in range(TOTAL):
    if t < START:
        action = env.action_space.sample()
    else:
        noise = rng.normal(size=act_dim) * 0.1 * high
        action = np.clip(np.asarray(policy(actor_params, obs)) + noise, -high, high)
    next_obs, reward, terminated, truncated, _ = env.step(action)
    OBS[t], ACTIONS[t], REWARDS[t], NEXT_OBS[t], TERMINATED[t] = (
        obs,
        action,
        reward,
        next_obs,
        float(terminated),
    )
    episode_return, obs = episode_return + reward, next_obs
    if terminated or truncated:
        returns.append(episode_return)
        episode_return, (obs, _) = 0.0, env.reset()
    if t >= START:
        index = rng.integers(0, t + 1, BATCH)
        key, update_key = jax.random.split(key)
        batch = (
            OBS[index],
            ACTIONS[index],
            REWARDS[index],
            NEXT_OBS[index],
            TERMINATED[index].astype(np.float32),
        )
        actor_params, critic_params, target_actor, target_critic, opts = update(
            actor_params,
            critic_params,
            target_actor,
            target_critic,
            opts,
            batch,
            update_key,
            t % 2 == 0,
        )
    if (t + 1) % 2000 == 0:
        print(
            f"{t + 1} eval {evaluate():.1f} train {np.mean(returns[-5:]):.1f} "
            f"{time.time() - start:.0f}s",
            flush=True,
        )
