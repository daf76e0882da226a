"""Every program fastpop compiles lowers for CUDA, checked on a CPU (`jax.export`'s platform
lowering): each algorithm's population update, device mode's chunk programs, its rollout and its
evaluation, DvD's log-det (alone and inside DvD's update), CEM's refit, and the exported policy.
The check itself fails on a host callback and on a CPU-only custom call."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpop import config as config_lib
from fastpop import population
from fastpop.agents import make_agent
from fastpop.bench.portability import NotPortable, lower_for
from fastpop.population import chunked, replay
from fastpop.types import EnvSpec
from tests.dependencies import require
from tests.helpers import TINY_OPTIONS

require("gymnax")

SPECS = {
    "td3": EnvSpec(obs_shape=(3,), action_dim=1),
    "sac": EnvSpec(obs_shape=(3,), action_dim=1),
    "dqn": EnvSpec(
        obs_shape=(84, 84, 4), obs_dtype=np.dtype(np.uint8), num_actions=6, frame_stack=4
    ),
}


def abstract(function, *args):
    """The shapes `function(*args)` returns, nothing computed."""
    return jax.eval_shape(function, *args)


@pytest.mark.parametrize(
    ("algo", "options"),
    [
        ("td3", None),
        ("sac", None),
        ("dqn", None),
        ("td3", "distributional"),  # C51's projection: a scatter-add
        ("sac", "distributional"),
        ("dqn", "dueling"),
    ],
)
def test_each_algorithms_population_update_lowers_for_cuda(algo, options):
    options = TINY_OPTIONS.get(options, {})
    agent = make_agent(algo, SPECS[algo], hidden_sizes=(16, 16), batch_size=8, **options)
    spec = replay.make_replay_spec(SPECS[algo], capacity=32, lanes=1, chunk_len=32)
    hparams = population.broadcast_hparams(agent.default_hparams(), 3)
    key = jax.random.key(0)
    buffers = abstract(lambda: replay.init_population(spec, 3))
    states = abstract(lambda k: jax.vmap(agent.init)(jax.random.split(k, 3), hparams), key)
    sample = partial(replay.sample, spec, batch_size=agent.batch_size)
    plan = population.UpdatePlan(agent, sample, 2)
    update = chunked.whole_population(population.member_update_loop(plan), 0)
    assert lower_for(update, states, buffers, hparams, key).platforms == ("cuda",)


def test_fused_pallas_mlps_lower_to_triton_kernels_in_the_update(monkeypatch):
    from fastpop.agents import pallas_mlp
    from fastpop.bench.portability import TRITON_TARGET

    monkeypatch.setattr(pallas_mlp, "default_interpret", lambda: False)  # as on a GPU
    agent = make_agent(
        "td3", SPECS["td3"], hidden_sizes=(16, 16), batch_size=8, mlp_kernel="pallas"
    )
    spec = replay.make_replay_spec(SPECS["td3"], capacity=32, lanes=1, chunk_len=32)
    hparams = population.broadcast_hparams(agent.default_hparams(), 3)
    key = jax.random.key(0)
    buffers = abstract(lambda: replay.init_population(spec, 3))
    states = abstract(lambda k: jax.vmap(agent.init)(jax.random.split(k, 3), hparams), key)
    sample = partial(replay.sample, spec, batch_size=agent.batch_size)
    update = chunked.whole_population(
        population.member_update_loop(population.UpdatePlan(agent, sample, 2)), 0
    )
    module = lower_for(update, states, buffers, hparams, key).mlir_module()
    assert module.count(f"custom_call @{TRITON_TARGET}") >= 10  # forwards and backwards


def device_learner(algo: str, env_id: str, strategy: str = "independent", size: int = 2):
    """A tiny device-mode learner and its collection (nothing trained)."""
    from fastpop.learn.learner import Learner
    from fastpop.run.parts import build_run
    from fastpop.run.startup import make_collection

    data = {"name": "portability", "algo": algo, "strategy": strategy, "env": {"id": env_id}}
    data["agent"] = {"hidden_sizes": [16, 16], "batch_size": 16}
    data["replay"] = {"capacity": 256, "min_size": 16, "samples_per_insert": 16.0}
    data["collect"] = {"mode": "device", "envs_per_member": 1, "chunk_len": 8, "warmup_steps": 0}
    data |= {"population": {"size": size}, "train": {"updates_per_call": 2}}
    if strategy == "dvd":  # DvD's log-det enters its update
        data["replay"]["shared"] = True
        data["dvd"] = {"embedding_states": 8}
    parts = build_run(config_lib.config_from_dict(data))
    learner = Learner(parts.learner)
    return learner, make_collection(parts, learner)


@pytest.mark.parametrize(
    ("algo", "env_id", "strategy"),
    [
        ("td3", "gymnax/Pendulum-v1", "independent"),
        ("dqn", "gymnax/CartPole-v1", "independent"),
        ("td3", "gymnax/Pendulum-v1", "dvd"),
    ],
)
def test_device_modes_programs_lower_for_cuda(algo, env_id, strategy):
    """The chunk's two programs (rollout and insert; updates), the rollout alone and the
    evaluation, as the collection compiles them."""
    from fastpop.collect import chunk_programs

    learner, collection = device_learner(algo, env_id, strategy, size=3)
    key = jax.random.key(0)
    buffers, states, learner_key, hparams, member_hparams = learner.state
    programs = chunk_programs.chunk_programs(
        learner.training, learner.replay.add_rows, collection.chunk_rollout
    )
    plan = learner.begin_device_chunk(1)
    lower_for(programs.collect, collection.lanes, buffers, states, key, hparams, plan)
    lower_for(programs.update, buffers, states, learner_key, member_hparams, plan)
    lanes, states, hparams = collection.lanes, learner.states, learner.hparams
    lower_for(collection._chunk, lanes, key, states, hparams, jnp.int32(0))
    policy, hparams, _ = collection.evaluation.snapshot_shapes
    lower_for(collection.evaluation.jitted, policy, hparams, key)


def test_dvds_log_det_and_cems_refit_lower_for_cuda():
    from fastpop.strategies import cem, diversity

    kernel = jax.ShapeDtypeStruct((5, 5), jnp.float32)
    lower_for(diversity.log_det, kernel)

    def refit(distribution, samples, fitness, key):
        distribution = cem.tell(distribution, samples, fitness, 0.5, 0.95, 1e-5)
        return distribution, cem.ask(distribution, key, 4)

    distribution = abstract(lambda: cem.init(jnp.zeros(10), 1e-3, 1e-3))
    samples = jax.ShapeDtypeStruct((4, 10), jnp.float32)
    fitness = jax.ShapeDtypeStruct((4,), jnp.float32)
    lower_for(refit, distribution, samples, fitness, jax.random.key(0))


def test_the_exported_policy_lowers_for_cuda():
    from fastpop.commands.export import export_policy, flat_weights, inference_function

    agent = make_agent("sac", SPECS["sac"], hidden_sizes=(16, 16))
    hparams = agent.default_hparams()
    policy = agent.policy_params(agent.init(jax.random.key(0), hparams))
    _, serialized = export_policy(agent, policy, hparams, SPECS["sac"])
    assert "cuda" in jax.export.deserialize(bytearray(serialized)).platforms
    weights, treedef, names = flat_weights(policy)
    function = inference_function(agent, treedef, names, hparams)
    lower_for(function, weights, jax.ShapeDtypeStruct((7, 3), jnp.float32))


def test_the_check_fails_on_a_host_callback_and_a_cpu_only_custom_call():
    """What would not run on a GPU is caught: a host callback does not lower for CUDA, and a
    LAPACK custom call, which the exporter lets through, is named."""
    x = jnp.eye(4)
    callback = lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v)
    with pytest.raises(NotPortable, match="does not lower for cuda"):
        lower_for(callback, x)
    result = (jax.ShapeDtypeStruct((4, 4), jnp.float32), jax.ShapeDtypeStruct((), jnp.int32))
    lapack = lambda v: jax.ffi.ffi_call("lapack_spotrf_ffi", result)(v)
    assert jax.export.export(jax.jit(lapack), platforms=("cuda",))(x)  # the exporter passes it
    with pytest.raises(NotPortable, match="CPU-only custom calls on cuda: lapack_spotrf_ffi"):
        lower_for(lapack, x)
    lower_for(lambda v: jnp.linalg.cholesky(v), x)  # jnp's own: cusolver on CUDA
    lower_for(lapack, x, platform="cpu")  # the CPU has it
