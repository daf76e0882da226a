"""rejax's DQN, the pure-JAX peer, on gymnax's CartPole-v1 with the values of
configs/dqn_gymnax_cartpole_cpu.yaml: SEEDS independent runs vmapped into one program (a
population of SEEDS members), evaluated every 2,000 env steps on 5 episodes, as fastpop's runs.
It runs in its own environment, not fastpop's (results/device_envs_cpu/run.sh makes it):

    python -m venv /tmp/rejax-venv
    /tmp/rejax-venv/bin/pip install rejax==0.1.3 jax==0.10.2 gymnax==0.0.9
    /tmp/rejax-venv/bin/python results/device_envs_cpu/rejax_dqn.py --seeds 4 --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import time

START = time.perf_counter()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from rejax import DQN  # noqa: E402
from rejax.evaluate import evaluate  # noqa: E402

EVAL_EPISODES = 5


def eval_callback(algo, train_state, key):
    act = algo.make_act(train_state)
    max_steps = algo.env_params.max_steps_in_episode
    return evaluate(act, key, algo.env, algo.env_params, EVAL_EPISODES, max_steps)


def make_dqn(env: str, steps: int, eval_every: int) -> DQN:
    """The preset's values in rejax's names: one env, one update per env step after 1,000
    random steps, a hard target copy every 200 steps (polyak 0), epsilon 1 -> 0.02 over the
    first 60% of the steps (6,000 of 10,000), double DQN, 64-64 ReLU network (a grid is
    flattened into it, as fastpop's agent.torso: mlp).
    rejax's own defaults for the rest (Adam's epsilon, gradient clipping)."""
    return DQN.create(
        env=env,
        num_envs=1,
        buffer_size=20_000,
        fill_buffer=1_000,
        batch_size=64,
        learning_rate=5e-4,
        gamma=0.99,
        eps_start=1.0,
        eps_end=0.02,
        exploration_fraction=0.6,
        target_update_freq=200,
        polyak=0.0,
        ddqn=True,
        total_timesteps=steps,
        eval_freq=eval_every,
        agent_kwargs={"activation": "relu"},  # rejax's DQN network is 64-64 (its default: swish)
    ).replace(eval_callback=eval_callback)  # 5 episodes, where rejax's own plays 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--env", default="CartPole-v1", help="a gymnax id")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--eval-every", type=int, default=2_000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    algo = make_dqn(args.env, args.steps, args.eval_every)
    keys = jax.random.split(jax.random.PRNGKey(0), args.seeds)
    train = jax.jit(jax.vmap(algo.train))
    compile_start = time.perf_counter()
    compiled = train.lower(keys).compile()
    run_start = time.perf_counter()
    _, (_, returns) = jax.block_until_ready(compiled(keys))
    end = time.perf_counter()
    returns = np.asarray(returns).mean(axis=-1)  # (seeds, evaluations): mean over episodes
    result = {
        "command": f"rejax_dqn.py --seeds {args.seeds} --env {args.env} --steps {args.steps}",
        "rejax": "0.1.3",
        "jax": jax.__version__,
        "seeds": args.seeds,
        "env_steps": [args.eval_every * i for i in range(returns.shape[1])],
        "returns": returns.round(1).tolist(),
        "seconds": {
            "import_and_setup": compile_start - START,
            "compile": run_start - compile_start,
            "train": end - run_start,
            "wall": end - START,
        },
    }
    with open(args.out, "w") as file:
        json.dump(result, file, indent=1)
    print(json.dumps(result["seconds"]), result["returns"])


if __name__ == "__main__":
    main()
