"""Ray Tune PBT / PB2 sweep of stable-baselines3 TD3 on InvertedDoublePendulum-v5 or Pendulum-v1.

The Ray half of the "sweep a Ray user would write" vs fastpop PBT/PB2 comparison. It runs in its
own environment (not a fastpop dependency):

    python3.11 -m venv .venv-raytune
    .venv-raytune/bin/pip install -r results/vs_ray_tune/requirements.txt
    .venv-raytune/bin/python results/vs_ray_tune/ray_sweep.py --scheduler pbt --out /tmp/ray_pbt

One Ray trial = one SB3 TD3 agent in its own actor process (one CPU each); `--population` trials
share `--cpus` CPUs, so with 8 trials on 2 CPUs Tune's PBT time-multiplexes them (pausing a trial
checkpoints it to disk and frees its CPU for a paused/pending one).

`--task` picks the env, the fixed TD3 settings, the hparams with their priors and PB2 bounds, and
the defaults of --report-steps / --perturbation-interval (the tables: ray_tasks.py):
    inverted_double_pendulum  (default) InvertedDoublePendulum-v5; actor_lr, critic_lr,
                              exploration_noise (results/vs_ray_tune/)
    pendulum                  Pendulum-v1; those and discount, policy_noise, noise_clip,
                              policy_delay, fastpop's wide TD3 priors (results/sweeps_long_cpu/)

Outputs under --out:
    rows.jsonl     one line per reported result (framework, scheduler, trial, wall_seconds,
                   env_steps, return, hparams)
    running.jsonl  every ~5 s: how many trials are RUNNING / PAUSED / PENDING
    summary.json   totals (env steps, wall seconds, env steps/s, perturbations) and versions
    ray/           Ray's own experiment storage (trial dirs, checkpoints, pbt_global.txt)
"""

from __future__ import annotations

import argparse
import json
import random
import time
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np
import ray
import torch
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.schedulers.pb2 import PB2
from ray.tune.search.basic_variant import BasicVariantGenerator
from ray_tasks import SB3_ATTRS, TASKS, applied_value  # sibling module (sys.path[0])
from stable_baselines3 import TD3
from stable_baselines3.common.noise import NormalActionNoise
from stable_baselines3.common.utils import update_learning_rate

EVAL_EPISODES = 5


class TwoLrTD3(TD3):
    """SB3 TD3 with separate actor and critic learning rates.

    SB3's TD3 has a single `learning_rate`, and `TD3.train()` calls `_update_learning_rate` at
    the start of every training call, which writes `lr_schedule(progress)` into BOTH optimizers'
    param_groups. Setting the param_group lr once after construction would therefore be undone by
    the next gradient step; overriding the hook keeps actor_lr / critic_lr in force. The two
    attributes are (re)set after construction, after every checkpoint load and on every hparam
    change (see Trainable._apply_hparams).
    """

    actor_lr: float = 1e-3
    critic_lr: float = 1e-3

    def _update_learning_rate(self, optimizers) -> None:
        self.logger.record("train/actor_lr", self.actor_lr)
        self.logger.record("train/critic_lr", self.critic_lr)
        update_learning_rate(self.actor.optimizer, self.actor_lr)
        update_learning_rate(self.critic.optimizer, self.critic_lr)


class TD3Trainable(tune.Trainable):
    """One population member: an SB3 TD3 agent, trained `report_steps` env steps per step()."""

    def setup(self, config: dict) -> None:
        torch.set_num_threads(1)  # one CPU per trial; Ray also sets OMP_NUM_THREADS=1
        self.task = TASKS[config["task"]]  # the same for every trial of a sweep
        self.eval_env = gym.make(self.task["env_id"])
        self.train_env = None
        self.model: TwoLrTD3 | None = None
        self.reset_config(config)

    # ----------------------------------------------------------------------------------------
    # Model construction and hyperparameters
    # ----------------------------------------------------------------------------------------

    def _new_train_env(self) -> gym.Env:
        if self.train_env is not None:
            self.train_env.close()
        self.train_env = gym.make(self.task["env_id"])
        return self.train_env

    def _build_fresh_model(self) -> TwoLrTD3:
        model = TwoLrTD3(
            "MlpPolicy",
            self._new_train_env(),
            learning_rate=self.config["actor_lr"],  # unused: TwoLrTD3 sets both lrs itself
            buffer_size=100_000,
            learning_starts=1000,
            batch_size=128,
            tau=0.005,
            train_freq=1,
            gradient_steps=1,
            **self.task["td3"],  # gamma, policy delay, target noise unless they are hparams
            policy_kwargs={"net_arch": [64, 64]},
            seed=self.config["seed"],
            device="cpu",
            verbose=0,
        )
        self._apply_hparams(model)
        return model

    def _apply_hparams(self, model: TwoLrTD3) -> None:
        """Put the task's hparams (lrs, action noise, SB3_ATTRS) from self.config in `model`."""
        model.actor_lr = float(self.config["actor_lr"])
        model.critic_lr = float(self.config["critic_lr"])
        update_learning_rate(model.actor.optimizer, model.actor_lr)
        update_learning_rate(model.critic.optimizer, model.critic_lr)
        # SB3 adds action noise to the action rescaled to [-1, 1] (then clips and unscales), so
        # sigma = exploration_noise here IS "exploration_noise x action half-range" in env units,
        # which is fastpop's definition (InvertedDoublePendulum's actions are in [-1, 1],
        # Pendulum's in [-2, 2]).
        n_act = model.action_space.shape[0]
        model.action_noise = NormalActionNoise(
            mean=np.zeros(n_act), sigma=float(self.config["exploration_noise"]) * np.ones(n_act)
        )
        for name, (attr, convert) in SB3_ATTRS.items():  # discount, target noise, policy delay
            if name in self.config:
                setattr(model, attr, convert(self.config[name]))

    def reset_config(self, new_config: dict) -> bool:
        """Apply a new config without restarting the actor process (reuse_actors=True).

        Ray calls this when it hands this actor to a trial: (a) a paused trial resuming, or a
        trial that just exploited another (PBT/PB2), which Ray follows with load_checkpoint; or
        (b) a trial that has never run, with no checkpoint. Updating the hparams of the model in
        place would let (b) inherit the previous trial's weights and replay buffer, so the model
        is dropped here and rebuilt lazily: load_checkpoint loads one (then applies the new
        lrs and noise sigma), else step() builds a fresh one with this config's seed.
        """
        self.config = new_config
        self.model = None
        return True

    # ----------------------------------------------------------------------------------------
    # Training step, evaluation
    # ----------------------------------------------------------------------------------------

    def step(self) -> dict:
        if self.model is None:
            self.model = self._build_fresh_model()
        steps_before = self.model.num_timesteps
        self.model.learn(self.config["report_steps"], reset_num_timesteps=False)
        return {
            "episode_return": self._evaluate(),
            "env_steps": int(self.model.num_timesteps),
            "env_steps_this_step": int(self.model.num_timesteps - steps_before),
            "wall_time": time.time(),
            "hparams": {k: applied_value(k, self.config[k]) for k in self.task["priors"]},
        }

    def _evaluate(self) -> float:
        """Mean undiscounted return of the deterministic policy over EVAL_EPISODES episodes.

        The eval env is seeded per episode (trial seed + 10_000 + episode), so every evaluation
        of a trial starts from the same initial states.
        """
        returns = []
        for episode in range(EVAL_EPISODES):
            obs, _ = self.eval_env.reset(seed=int(self.config["seed"]) + 10_000 + episode)
            done, total = False, 0.0
            while not done:
                action, _ = self.model.predict(obs, deterministic=True)
                obs, reward, terminated, truncated, _ = self.eval_env.step(action)
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        return float(np.mean(returns))

    # ----------------------------------------------------------------------------------------
    # Checkpoints: PBT's exploit copies the whole state through these files on disk
    # ----------------------------------------------------------------------------------------

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        if self.model is None:  # asked to save before the first step (not expected)
            self.model = self._build_fresh_model()
        self.model.save(Path(checkpoint_dir) / "model.zip")  # weights, optimizers, counters
        self.model.save_replay_buffer(Path(checkpoint_dir) / "replay_buffer.pkl")

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        model = TwoLrTD3.load(
            Path(checkpoint_dir) / "model.zip", env=self._new_train_env(), device="cpu"
        )
        model.load_replay_buffer(Path(checkpoint_dir) / "replay_buffer.pkl")
        # The saved `_last_obs` belongs to the saving trial's env, not to this fresh one: drop
        # it so the next learn() resets the env instead of storing a transition that never was.
        model._last_obs = None
        # The zip restores the SAVER's hparams (and the optimizers' param_groups); the config
        # Ray just gave us (possibly perturbed by PBT/PB2) wins.
        self._apply_hparams(model)
        self.model = model

    def cleanup(self) -> None:
        self.eval_env.close()
        if self.train_env is not None:
            self.train_env.close()


class RowsCallback(tune.Callback):
    """Driver-side logger: one row per result, and how many trials run, every ~5 s."""

    def __init__(self, out: Path, scheduler: str, t0_holder: dict):
        # Paths, not open files: Tune pickles its callbacks (the experiment state).
        self.rows = out / "rows.jsonl"
        self.running = out / "running.jsonl"
        self.rows.write_text("")
        self.running.write_text("")
        self.scheduler = scheduler
        self.t0 = t0_holder  # {"t0": time.time() right before tuner.fit()}, set by main
        self.last_running_write = -1e9
        self.total_env_steps = 0
        self.num_results = 0
        self.per_trial = {}  # trial id -> {"results": n, "env_steps": last reported}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.total_env_steps += result["env_steps_this_step"]
        self.num_results += 1
        stats = self.per_trial.setdefault(trial.trial_id, {"results": 0})
        stats["results"] += 1
        stats["env_steps"] = result["env_steps"]
        row = {
            "framework": "ray_tune",
            "scheduler": self.scheduler,
            "trial": trial.trial_id,
            "wall_seconds": result["wall_time"] - self.t0["t0"],
            "env_steps": result["env_steps"],
            "trained_env_steps": result["env_steps_this_step"],  # counts steps redone after
            # an exploit (`env_steps` is the trial's count, taken over from its source)
            "return": result["episode_return"],
            "hparams": result["hparams"],  # what this step trained with
        }
        with self.rows.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def on_step_begin(self, iteration, trials, **info):
        now = time.time()
        if now - self.last_running_write < 5.0:
            return
        self.last_running_write = now
        counts = {s: sum(t.status == s for t in trials) for s in ("RUNNING", "PAUSED", "PENDING")}
        line = {"wall_seconds": now - self.t0["t0"], **{k.lower(): v for k, v in counts.items()}}
        with self.running.open("a") as f:
            f.write(json.dumps(line) + "\n")


def make_scheduler(name: str, task: dict, perturbation_interval: int, synch: bool):
    if name == "pbt":
        # On exploit, each hparam is resampled from its prior with probability 0.25, else
        # multiplied by 0.8 or 1.2. Ray does not clip the multiplied value to the prior's range.
        return PopulationBasedTraining(
            time_attr="env_steps",
            perturbation_interval=perturbation_interval,
            hyperparam_mutations=task["priors"],
            quantile_fraction=0.25,
            resample_probability=0.25,
            metric="episode_return",
            mode="max",
            synch=synch,
        )
    # PB2 takes only [low, high] bounds: it normalizes each one LINEARLY to [0, 1] for its GP
    # (scikit-learn GaussianProcessRegressor, time-varying squared-exponential kernel) and UCB
    # search, so a learning rate in [1e-4, 3e-3] is explored on a linear scale (no log option).
    # Initial values still come from param_space (the task's log-uniform priors).
    return PB2(
        time_attr="env_steps",
        perturbation_interval=perturbation_interval,
        hyperparam_bounds=task["bounds"],
        quantile_fraction=0.25,
        metric="episode_return",
        mode="max",
        synch=synch,
    )


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheduler", choices=["pbt", "pb2"], default="pbt")
    p.add_argument("--task", choices=list(TASKS), default="inverted_double_pendulum")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--cpus", type=int, default=2, help="ray.init(num_cpus=...)")
    p.add_argument("--budget-seconds", type=float, default=600.0, help="whole-sweep wall time")
    p.add_argument("--max-steps", type=int, default=1_000_000, help="per-trial env-step cap")
    p.add_argument("--perturbation-interval", type=int, help="env steps (default: the task's)")
    p.add_argument("--report-steps", type=int, help="env steps per step() (default: the task's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--synch",
        action="store_true",
        help="synchronous PBT/PB2 (Ray's default is asynchronous; see NOTES.md on starvation)",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    for key in ("perturbation_interval", "report_steps"):  # unset: the task's
        if getattr(args, key) is None:
            setattr(args, key, TASKS[args.task][key])
    return args


def main() -> None:
    args = parse_args()
    task = TASKS[args.task]

    out = args.out.resolve()  # Ray's storage_path must be absolute
    out.mkdir(parents=True, exist_ok=True)
    # PBT's perturbations use Python's `random`, PB2's acquisition search NumPy's global RNG.
    random.seed(args.seed)
    np.random.seed(args.seed)

    ray.init(num_cpus=args.cpus, include_dashboard=False)

    param_space = {
        **task["priors"],
        "task": args.task,
        # num_samples=1 over a grid of `population` indices gives `population` trials (the same
        # as num_samples=population), each knowing its index: trial seed = --seed + index.
        "trial_index": tune.grid_search(list(range(args.population))),
        "seed": tune.sample_from(lambda config: args.seed + config["trial_index"]),
        "report_steps": args.report_steps,
    }
    scheduler = make_scheduler(args.scheduler, task, args.perturbation_interval, args.synch)
    t0_holder = {"t0": time.time()}
    callback = RowsCallback(out, args.scheduler, t0_holder)

    tuner = tune.Tuner(
        tune.with_resources(TD3Trainable, {"cpu": 1}),
        param_space=param_space,
        tune_config=tune.TuneConfig(
            scheduler=scheduler,
            num_samples=1,
            # Seeded draws of the initial hparams from the priors.
            search_alg=BasicVariantGenerator(random_state=args.seed),
            time_budget_s=args.budget_seconds,
            # Reuse actor processes across trials (reset_config) instead of starting a new
            # Python + torch process every time PBT pauses one trial and resumes another.
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=f"td3_{args.scheduler}",
            storage_path=str(out / "ray"),
            stop={"env_steps": args.max_steps},
            callbacks=[callback],
            # PBT warns below 3: a checkpoint may be deleted before another trial exploits it.
            checkpoint_config=tune.CheckpointConfig(num_to_keep=4),
            verbose=1,
        ),
    )

    t0_holder["t0"] = time.time()
    results = tuner.fit()
    wall = time.time() - t0_holder["t0"]

    finals = [r.metrics.get("episode_return") for r in results if r.metrics]
    finals = [f for f in finals if f is not None]
    summary = {
        "framework": "ray_tune",
        "scheduler": args.scheduler,
        "task": args.task,
        "env_id": task["env_id"],
        "population": args.population,
        "cpus": args.cpus,
        "budget_seconds": args.budget_seconds,
        "perturbation_interval": args.perturbation_interval,
        "report_steps": args.report_steps,
        "seed": args.seed,
        "synch": args.synch,
        "trials": len(results),
        "results_reported": callback.num_results,
        "total_env_steps": callback.total_env_steps,  # training env steps, eval not counted
        "wall_seconds": wall,  # tuner.fit() only (ray.init not included)
        "env_steps_per_second": callback.total_env_steps / wall,
        "perturbations": scheduler._num_perturbations,  # exploits (a private PBT counter)
        "best_final_return": max(finals) if finals else None,
        # Results and last env_steps per trial: shows trials that time-multiplexing starved.
        "per_trial": callback.per_trial,
        "versions": {
            pkg: version(pkg) for pkg in ("ray", "stable-baselines3", "torch", "gymnasium")
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    ray.shutdown()


if __name__ == "__main__":
    main()
