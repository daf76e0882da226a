"""What the fresh reset computed at every step of device mode's chunk (`device_rollout.step`)
costs: XLA's compile (wall and CPU seconds) of a 32-step scan of a device env (default brax's
inverted pendulum) with random actions, and its env steps per second at 256 lanes, against the
same scan with the reset replaced by each lane's first state (what brax's AutoResetWrapper
does), or (`--variants ... when-any-ended`) computed only at the steps where some lane's
episode ended (the same numbers). Each variant in a fresh process, the compilation cache off.

    python results/startup/reset_in_chunk.py --repeats 2
    python results/startup/reset_in_chunk.py --env brax/ant --lanes 64 --repeats 1
    python results/startup/reset_in_chunk.py --env playground/CartpoleBalance --lanes 64 \
        --variants fresh-every-step first-state when-any-ended
"""

from __future__ import annotations

import argparse
import subprocess
import sys

MEASURE = """
import resource, sys, time
import jax
jax.config.update("jax_enable_compilation_cache", False)
from fastpop.collect import device_rollout
from fastpop.envs.device_envs import make_device_env

variant, lanes, length, env_id = sys.argv[1], int(sys.argv[2]), 32, sys.argv[3]
env = make_device_env(env_id, "generalized")


class FirstStates:  # the env with its reset replaced by each lane's first state
    def __init__(self, env, first):
        self.env, self.first = env, first

    def step(self, state, action):
        return self.env.step(state, action)

    def reset(self, key):
        return self.first


class WhenAnyEnded:  # the reset computed only at steps where some lane's episode ended
    def __init__(self, env, any_ended, unused):
        self.env, self.any_ended, self.unused = env, any_ended, unused

    def step(self, state, action):
        return self.env.step(state, action)

    def reset(self, key):
        return jax.lax.cond(self.any_ended, self.env.reset, lambda _: self.unused, key)


def chunk(lanes_state, key):
    first = jax.tree.map(lambda x: x[0], lanes_state.env)

    def one(state, step_key):
        stepped = env
        if variant == "first-state":
            stepped = FirstStates(env, first)
        elif variant == "when-any-ended":
            stepped = WhenAnyEnded(env, state.done.any(), first)
        action = jax.random.uniform(step_key, (lanes, env.spec.action_dim), minval=-1.0, maxval=1.0)
        state, row, _ = device_rollout.step(stepped, 1000, state, action)
        return state, row

    return jax.lax.scan(one, lanes_state, jax.random.split(key, length))


state = jax.jit(device_rollout.init, static_argnums=(0, 2))(env, jax.random.key(0), lanes)
lowered = jax.jit(chunk).lower(state, jax.random.key(1))
before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
program = lowered.compile()
wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
state, _ = jax.block_until_ready(program(state, jax.random.key(2)))
start = time.perf_counter()
for index in range(20):
    state, _ = program(state, jax.random.key(index))
jax.block_until_ready(state)
rate = 20 * length * lanes / (time.perf_counter() - start)
print(f"{wall:.2f} {cpu:.2f} {rate:.0f}")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--lanes", type=int, default=256)
    parser.add_argument("--env", default="brax/inverted_pendulum")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=["fresh-every-step", "first-state"],
        choices=["fresh-every-step", "first-state", "when-any-ended"],
    )
    args = parser.parse_args()
    print("| reset in the chunk | compile wall s | compile CPU s | env steps/s |")
    print("| --- | --- | --- | --- |")
    for _ in range(args.repeats):
        for variant in args.variants:
            command = [sys.executable, "-c", MEASURE, variant, str(args.lanes), args.env]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            wall, cpu, rate = out.split()
            print(f"| {variant} | {wall} | {cpu} | {int(rate):,} |")


if __name__ == "__main__":
    main()
