"""A collector's environments, stepped in lockstep under gymnasium's next-step autoreset: every
step yields one observation per env (`rows.RowStream` turns them into replay rows).

Nothing here imports JAX: a collector steps its warm-up before it has imported JAX.
"""

from __future__ import annotations

import numpy as np


class LockstepEnvs:
    """The environments of a next-step-autoreset `gymnasium.vector.SyncVectorEnv`, stepped as it
    steps them (same calls in the same order: the same observations, rewards and flags) but
    without merging their info dicts, which the collectors never read: that merge was about a
    sixth of a collector's time per HalfCheetah step (results/bench/README.md)."""

    def __init__(self, vector_env):
        self.vector_env = vector_env
        self.envs = vector_env.envs
        self.action_space = vector_env.action_space  # batched and seeded, for warm-up actions
        self._obs_dtype = vector_env.single_observation_space.dtype
        self._autoreset = np.zeros(len(self.envs), bool)

    def reset(self, seed: int):
        """Observations of every env reset with seeds seed, seed + 1, ... (as the vector env)."""
        self._autoreset[:] = False
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        return np.stack(obs).astype(self._obs_dtype, copy=False)

    def step(self, actions):
        """(obs, reward, terminated, truncated), one per env; an env whose episode ended at the
        previous step is reset instead (reward 0, flags False)."""
        count = len(self.envs)
        obs = [None] * count
        reward = np.zeros(count)
        terminated, truncated = np.zeros(count, bool), np.zeros(count, bool)
        for i, env in enumerate(self.envs):
            if self._autoreset[i]:
                obs[i], _ = env.reset()
            else:
                obs[i], reward[i], terminated[i], truncated[i], _ = env.step(actions[i])
        self._autoreset = terminated | truncated
        return np.stack(obs).astype(self._obs_dtype, copy=False), reward, terminated, truncated

    def restart(self, envs: np.ndarray, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(obs, reset): `obs` with the envs where `envs` (bool) reset now, ending their episodes
        unflagged (a fresh trial starts in them), and which were. An env whose episode ended at
        the previous step is left to its reset step, which starts a new episode anyway."""
        reset = np.asarray(envs, bool) & ~self._autoreset
        obs = obs.copy()
        for i in np.flatnonzero(reset):
            obs[i], _ = self.envs[i].reset()
        return obs, reset

    def close(self) -> None:
        self.vector_env.close()


def lockstep_envs(
    env_id: str,
    num_envs: int,
    seed: int,
    *,
    atari=None,
    atari_vector: bool = True,
    num_collectors: int = 1,
):
    """A collector's environments (reset(seed) them first) and what steps them (its stats): for an
    Atari id with `atari_vector`, ale_py's vector env (`atari_vector.AtariLockstepEnvs`, its
    share of the cores as threads) where it can run `atari` (`AtariOptions`); else gymnasium's
    (`LockstepEnvs` over `envs.make_vector_env`)."""
    from fastpop.envs import AtariOptions, check_env_id, make_vector_env
    from fastpop.envs import atari_vector as ale_vector

    env_id = check_env_id(env_id)
    reason = "off (collect.atari_vector: false)"
    if env_id.startswith("ALE/") and atari_vector:
        reason = ale_vector.unavailable_reason(atari or AtariOptions())
        if reason is None:
            threads = ale_vector.default_threads(num_envs, num_collectors)
            envs = ale_vector.AtariLockstepEnvs(
                env_id, num_envs, seed, options=atari, num_threads=threads
            )
            return envs, f"ale_py AtariVectorEnv, {threads} thread(s)"
    envs = LockstepEnvs(make_vector_env(env_id, num_envs, seed, atari=atari))
    if env_id.startswith("ALE/"):
        return envs, f"gymnasium (ale_py vector env: {reason})"
    return envs, "gymnasium"
