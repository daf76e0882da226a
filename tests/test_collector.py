"""Collector processes: no JAX during the warm-up, CPU-only JAX even when JAX was imported
before they could say so, and a member's fresh trial taken up at a chunk boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runs import with_this_checkout

# JAX imported before `force_cpu_jax` (by a test, or by whatever imports it first).
SCRIPT = """
import pickle, jax
from fastpop.collect.collector import force_cpu_jax
force_cpu_jax()
print(jax.config.jax_platforms, jax.default_backend())
"""


def test_force_cpu_jax_holds_when_jax_was_imported_first():
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["JAX_PLATFORMS"] = "definitely-not-a-platform"  # what a learner's setting could be
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        env=with_this_checkout(env),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["cpu", "cpu"]


# A main script that imports JAX, as the `fastpop` console script does (it imports the command
# line): spawning would run it again in every collector unless Workers leaves it out.
WARM_UP = """
import json, sys, time
import jax

from fastpop import config as config_lib
from fastpop.collect.workers import Workers
from fastpop.config.build import build_agent, build_env_spec, build_replay_spec
from fastpop.run.parts import config_policy_template, process_parts

if __name__ == "__main__":
    import numpy as np

    config = config_lib.config_from_dict({
        "name": "warm-up", "algo": "td3", "env": {"id": "Pendulum-v1"},
        "population": {"size": 2},
        "collect": {"num_collectors": 1, "chunk_len": 4, "warmup_steps": 1_000_000},
    })
    env_spec = build_env_spec(config)
    replay_spec = build_replay_spec(config, env_spec)
    template = config_policy_template(build_agent(config), config)
    zeros = jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), template)  # unread
    parts = process_parts(config, env_spec)
    with Workers(parts, zeros, replay_spec, log=lambda *_: None) as workers:
        deadline = time.monotonic() + 120
        while (rows := workers.next_chunk()[0]) is None and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.01)
        stats = workers.stop()["collector 0"]
    print(json.dumps({"shape": list(rows.obs.shape), **stats}))
"""


def test_a_collector_in_its_warm_up_has_not_imported_jax(tmp_path):
    """Its first rows wait only for gymnasium: 16 collectors importing JAX (~1-2 s of CPU each)
    were most of the paper preset's start-up on 2 cores (results/startup/README.md). Neither
    what it is sent nor the parent's main script brings JAX in."""
    script = tmp_path / "train_script.py"
    script.write_text(WARM_UP)
    result = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=with_this_checkout(dict(os.environ)),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout.splitlines()[-1])
    assert stats["shape"] == [2, 4, 3] and stats["env_steps"] >= 2 * 4
    assert stats["jax_imported"] is False


def test_a_collectors_warm_up_ends_on_a_chunk_boundary():
    """Its last random chunk is sent before it builds its policy (importing JAX): the learner
    can start on a replay.min_size that the warm-up fills (1,000 of 32-row chunks: 1,024)."""
    import numpy as np

    from fastpop.collect.collector import whole_chunks
    from fastpop.collect.rows import RowLayout

    rows = RowLayout(32, (3,), np.dtype(np.float32), np.dtype(np.float32), 1)
    assert [whole_chunks(steps, rows) for steps in (0, 1, 32, 1_000)] == [0, 32, 32, 1_024]


@pytest.mark.parametrize("observation_norm", [False, True], ids=["raw", "observation_norm"])
def test_collectors_started_before_the_learner_step_their_warm_up_then_wait_for_its_policies(
    observation_norm,
):
    """A fresh run starts its collectors before it makes its learner (run/startup.start_processes):
    they send exactly their warm-up's random rows, then wait for the learner's first publish
    rather than step on at random, and act with its policies once `running` publishes them
    (with agent.observation_norm, the statistics published beside the actor's params: still in
    numpy)."""
    import math
    import time

    from fastpop import config as config_lib
    from fastpop.collect.sources import ProcessCollection
    from fastpop.learn.learner import Learner
    from fastpop.run.parts import build_run

    config = config_lib.config_from_dict(
        {
            "name": "ahead",
            "algo": "td3",
            "env": {"id": "Pendulum-v1"},
            "population": {"size": 2},
            "agent": {"hidden_sizes": [8, 8], "observation_norm": observation_norm},
            "collect": {"num_collectors": 1, "chunk_len": 8, "warmup_steps": 64, "ring_slots": 32},
        }
    )
    parts = build_run(config)
    collection = ProcessCollection(parts.processes, parts.learner.replay_spec, log=lambda *_: None)
    collection.start_ahead(parts.learner.agent, parts.learner.hparams)
    workers, warm_up_chunks = collection.workers, 64 // 8

    def chunks_within(seconds: float, enough: float = math.inf) -> int:
        count, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline and count < enough:
            workers.check()
            count += workers.next_chunk()[0] is not None
            time.sleep(0.01)
        return count

    try:
        deadline = time.monotonic() + 120
        while len(workers.channels.rings[0]) < warm_up_chunks and time.monotonic() < deadline:
            time.sleep(0.05)
        assert chunks_within(1.5) == warm_up_chunks  # and nothing after them
        assert workers.processes.evaluator is None  # started with the first trained policies
        learner = Learner(parts.learner)
        with collection.running(learner, lambda *_: None, generation=0):
            assert chunks_within(60, enough=1) == 1  # policy steps, once published
            stats = workers.stop()["collector 0"]
    finally:
        workers.__exit__(None, None, None)  # every process stopped, every segment unlinked
    # TD3's actor acts in numpy: the collector never imported JAX (collect/numpy_policy.py)
    assert stats["param_version"] == 1 and stats["jax_imported"] is False
    assert stats["env_steps"] > 2 * 64


def test_a_worker_starts_with_ctrl_c_blocked_and_the_parent_gets_its_own_back():
    """A Ctrl-C to the process group while a worker still imports (before it sets SIGINT to
    ignored) printed the worker's KeyboardInterrupt traceback: workers start with it blocked."""
    import multiprocessing as mp
    import signal
    import time

    from fastpop.collect.spawning import starting_worker

    def blocked(pid: int) -> bool:
        status = Path(f"/proc/{pid}/status").read_text()
        mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:"))[7:], 16)
        return bool(mask & (1 << (signal.SIGINT - 1)))

    with starting_worker():
        worker = mp.get_context("spawn").Process(target=time.sleep, args=(30,), daemon=True)
        worker.start()
    try:
        assert blocked(worker.pid)
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    finally:
        worker.kill()
        worker.join()


def learner_with_collectors(size: int, collect: dict, **sections):
    """(ProcessParts, Learner) of TD3 on Pendulum-v1 with 8-8 networks, whose collectors send
    chunks of 8 rows after 16 warm-up steps into rings of 4 (`collect`: more of that section)."""
    from fastpop import config as config_lib
    from fastpop.learn.learner import Learner
    from fastpop.run.parts import build_run

    collect = {"chunk_len": 8, "warmup_steps": 16, "ring_slots": 4, **collect}
    config = config_lib.config_from_dict({
        "name": "collector", "algo": "td3", "env": {"id": "Pendulum-v1"},
        "population": {"size": size}, "agent": {"hidden_sizes": [8, 8]}, "collect": collect,
        **sections,
    })  # fmt: skip
    parts = build_run(config)
    return parts.processes, Learner(parts.learner)


def test_a_collector_takes_up_a_fresh_trial_at_a_chunk_boundary_in_a_new_episode():
    """Member 1 starts a fresh trial (the learner publishes its new trial) while the
    collector's ring is full: the learner gets at most one more chunk of the stopped trial (the
    one it took before the collector read the publish; it takes those rows out again), not the
    ring's 4 and the one waiting for room, because the collector withdraws its queue. From the
    next chunk on, member 1's env runs a new episode whose first 16 steps are the trial's own
    warm-up (random actions), then its policy's; member 0 acts with its policy throughout. TD3
    without action noise, so the policy's actions are exact."""
    import time

    import jax
    import numpy as np

    from fastpop.collect.workers import Workers

    processes, learner = learner_with_collectors(
        2, {"num_collectors": 1}, hparams={"exploration_noise": 0.0}
    )
    policy = learner.training.policies(learner.states)

    def acted(member: int, obs):
        pick = lambda tree: jax.tree.map(lambda leaf: leaf[member], tree)
        act = learner.agent.act(pick(policy), obs, jax.random.key(0), pick(learner.hparams), False)
        return np.asarray(act)

    def chunks(count: int, workers) -> list:
        got, deadline = [], time.monotonic() + 120
        while len(got) < count and time.monotonic() < deadline:
            workers.check()
            rows, _, trials = workers.next_chunk()
            if rows is None:
                time.sleep(0.005)
                continue
            got.append((rows, trials.tolist()))
        assert len(got) == count
        return got

    with Workers(processes, learner.host_policy_tree(), learner.replay.spec) as workers:
        before = chunks(4, workers)  # 2 chunks of warm-up, then the policy
        learner.clocks.start_trials(np.array([False, True]))
        workers.publish_from(learner)
        after = chunks(1, workers)  # the collector waits for room: then it reads the publish
        read = time.monotonic() + 5  # (before collectors withdrew their queues: never)
        while workers.channels.rings[0].skip_below == 0 and time.monotonic() < read:
            time.sleep(0.005)
        after += chunks(4, workers)  # one of the stopped trial at most, then the trial's
    assert all(trials == [0, 0] for _, trials in before)
    stamps = [trials for _, trials in after]
    first = stamps.index([0, 1])
    assert stamps[:first] == [[0, 0]] * first and stamps[first:] == [[0, 1]] * (5 - first)
    assert first <= 1  # (before collectors withdrew their queues: 6)
    fresh = [rows for rows, _ in after[first:]]
    assert fresh[0].episode_start[1, 0] and not fresh[0].autoreset[1, 0]
    for index, rows in enumerate(fresh):  # its own warm-up: 2 chunks
        assert np.allclose(acted(1, rows.obs[1]), rows.action[1], atol=1e-4) == (index >= 2)
    for rows, _ in before[2:] + after:
        assert np.allclose(acted(0, rows.obs[0]), rows.action[0], atol=1e-4)


def test_a_member_split_over_two_collectors_loses_one_chunk_of_its_fresh_trial_not_a_ring():
    """Member 0's two envs are stepped by two collectors. When its fresh trial starts,
    collector 0's ring is full (4 chunks of the stopped trial and one waiting for room) and
    collector 1's is empty (paused, its ring drained: a slower collector). The learner keeps a
    member's rows from the first chunk both collectors stamp with the new trial; before
    collectors withdrew their queues, collector 1's first 5 chunks of the new trial were lost
    beside collector 0's queue. Now only the one paired with collector 0's last stale chunk."""
    import signal
    import time

    import numpy as np

    from fastpop.collect.workers import Workers

    processes, learner = learner_with_collectors(1, {"num_collectors": 2, "envs_per_member": 2})

    def wait_until(condition, timeout: float = 60.0) -> bool:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.01)
        return condition()

    def next_stamps() -> list[int]:
        """Per lane, the trial of the next chunk the learner takes from every collector."""
        deadline = time.monotonic() + 60
        while (taken := workers.next_chunk())[0] is None and time.monotonic() < deadline:
            workers.check()
            time.sleep(0.005)
        assert taken[0] is not None
        return taken[2].tolist()

    with Workers(processes, learner.host_policy_tree(), learner.replay.spec) as workers:
        rings, slow = workers.channels.rings, workers.processes.collectors[1]
        assert wait_until(lambda: all(len(ring) == 4 for ring in rings))  # both blocked
        os.kill(slow.pid, signal.SIGSTOP)
        try:
            while rings[1].try_get() is not None:  # the slow collector's ring, drained
                pass
            learner.clocks.start_trials(np.array([True]))
            workers.publish_from(learner)
        finally:
            os.kill(slow.pid, signal.SIGCONT)
        wait_until(lambda: rings[1].skip_below > 0, timeout=5)  # read the publish
        stamps = [next_stamps()]
        wait_until(lambda: rings[0].skip_below > 0, timeout=5)  # unblocked, read it
        while len(stamps) < 12 and stamps[-3:] != [[1, 1]] * 3:
            stamps.append(next_stamps())
    mixed = [pair for pair in stamps if sorted(pair) == [0, 1]]
    first = stamps.index([1, 1])  # the trial's own rows begin: no stale lane after it
    assert stamps[first:] == [[1, 1]] * (len(stamps) - first) and len(stamps) - first == 3
    assert len(mixed) <= 1, stamps  # (before collectors withdrew their queues: 4)


# What a spawned worker does with its recipe, in a fresh interpreter: no config is read.
REBUILD = """
import json, pickle, sys
from fastpop.collect.collector import rebuild_agent
recipe, hparams = pickle.load(open(sys.argv[1], "rb"))  # as spawning hands them over
agent, treedef = rebuild_agent(recipe, hparams)
read_config = sorted(m for m in sys.modules if m.startswith("fastpop.config"))
print(json.dumps({"name": agent.name, "structure": str(treedef), "config": read_config}))
"""


def test_a_worker_rebuilds_the_learners_agent_from_its_recipe_without_the_config(tmp_path):
    """Workers are handed their piece, not the config: the `AgentRecipe` of `process_parts` and
    the layout of the published hparams rebuild, in a fresh process, the agent the learner
    publishes for and the structure of what it publishes (a residual actor: collectors act
    with it through JAX), without importing the config."""
    import pickle

    import jax

    from fastpop.collect.collector import hparams_layout, policy_template
    from fastpop.config import load_config
    from fastpop.config.build import build_agent, build_env_spec, initial_hparams
    from fastpop.run.parts import process_parts

    overrides = ["population.size=2", "agent.network=residual", "agent.hidden_sizes=[16,16]"]
    config = load_config(None, overrides)
    spec = build_env_spec(config)
    agent = build_agent(config, spec)
    template = policy_template(agent, initial_hparams(config, agent))
    recipe = process_parts(config, spec).agent
    assert "fastpop.config" not in type(recipe).__module__
    published = hparams_layout(template[1])
    (tmp_path / "recipe.pkl").write_bytes(pickle.dumps((recipe, published)))
    result = subprocess.run(
        [sys.executable, "-c", REBUILD, str(tmp_path / "recipe.pkl")],
        capture_output=True,
        text=True,
        env=with_this_checkout({**os.environ, "JAX_PLATFORMS": "cpu"}),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rebuilt = json.loads(result.stdout.strip().splitlines()[-1])
    structure = str(jax.tree.structure(template))
    assert rebuilt == {"name": agent.name, "structure": structure, "config": []}
