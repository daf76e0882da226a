"""`fastpop export RUN_DIR --out DIR`: one member's policy, usable without fastpop.

DIR holds three files:

    weights.npz   the member's policy parameters as plain arrays (np.load(..., allow_pickle=False))
    policy.jax    `jax.export` serialization of the deterministic inference function
                  action = policy(weights, obs), lowered for CPU and CUDA, batch size symbolic
    policy.json   its spaces (observation shape and dtype, action shape and bounds or number of
                  actions, frame stack, Atari preprocessing), algo, env, run, member, checkpoint,
                  and with agent.observation_norm the normalization the function applies; an
                  asymmetric actor-critic's policy takes the state alone (`trained_on`)

The function is fastpop's own `agent.act(..., explore=False)`: TD3's actor, SAC's mean action
squashed and scaled to the bounds, DQN's greedy argmax; the member's hparams are constants in
it. With agent.observation_norm the member's observation statistics are weights too
(`observation_norm/mean`, `observation_norm/var`), applied inside the function as everywhere
else in fastpop (policy.json's "observation_norm" gives the formula). Reading it back needs jax,
numpy and flatbuffers:

    exported = jax.export.deserialize(bytearray(Path("DIR/policy.jax").read_bytes()))
    weights = dict(np.load("DIR/weights.npz", allow_pickle=False))
    actions = exported.call(weights, obs)   # obs: (batch, *observation shape)

DIR is written whole or not at all (a temporary directory renamed into place).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from fastpop.commands import evaluate
from fastpop.commands.args import fail, warn

WEIGHTS_FILE = "weights.npz"
FUNCTION_FILE = "policy.jax"
SPEC_FILE = "policy.json"
PLATFORMS = ("cpu", "cuda")
FORMAT = "fastpop-policy"
FORMAT_VERSION = 1


class ExportError(ValueError):
    """Bad input to `fastpop export`; the message says what and what would be right."""


def add_parser(commands) -> argparse.ArgumentParser:
    """Add `export` to the `fastpop` subcommands (`commands`: from add_subparsers)."""
    parser = commands.add_parser(
        "export",
        help="write one member's policy as plain arrays and a jax.export function",
        description="Write one member's policy from the run's newest usable checkpoint into "
        f"--out: {WEIGHTS_FILE} (its parameters as plain arrays), {FUNCTION_FILE} (a "
        "jax.export serialized function: deterministic action = policy(weights, obs), for "
        f"CPU and CUDA, any batch size) and {SPEC_FILE} (observation and action spaces, "
        "algo, env, run and member). Loading it needs only jax and numpy.",
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="run directory (holds checkpoints/)"
    )
    parser.add_argument(
        "--member",
        default="best",
        metavar="best|N",
        help="member index, or best: the highest return of the checkpoint's latest evaluation "
        "round (for cemrl, member 0: the CEM mean) (default best)",
    )
    parser.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="directory to write (new or empty)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace DIR if it holds an earlier export"
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """The `fastpop export` handler: 0 on success, 2 (with a message) on bad input."""
    try:
        return _run(args)
    except (ExportError, evaluate.EvalError) as error:
        return fail(str(error))


def _run(args: argparse.Namespace) -> int:
    requested = evaluate.parse_member(args.member)
    check_out_dir(args.out, args.overwrite)
    loaded = evaluate.load_latest(args.run_dir, warn)
    size = loaded.config.population.size
    member, reason = evaluate.resolve_member(requested, loaded.metadata, loaded.config)
    if member >= size:
        raise ExportError(
            f"--member {member}: the run's population has {size} members (0..{size - 1})"
        )
    files = export_files(loaded, member, reason, args.run_dir)
    write_directory(args.out, files, args.overwrite)
    spec = json.loads(files[SPEC_FILE])
    print(
        f"wrote {args.out}: member {member}{f' ({reason})' if reason else ''} of {args.run_dir} "
        f"(checkpoint {loaded.path.name}), {spec['algo']} on {spec['env_id']}; "
        f"{WEIGHTS_FILE}, {FUNCTION_FILE} ({', '.join(PLATFORMS)}), {SPEC_FILE}"
    )
    return 0


# --- the output directory ---


def check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuses an --out that is a file, or a non-empty directory unless --overwrite and it holds
    an earlier export (its policy.json): nothing else is ever deleted."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out}: exists and is not a directory; choose another --out")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ExportError(
            f"--out {out}: exists and is not empty; choose another --out, or pass --overwrite "
            "to replace an earlier export"
        )
    if not (out / SPEC_FILE).is_file():
        raise ExportError(
            f"--out {out}: --overwrite replaces only an earlier export (a directory with "
            f"{SPEC_FILE}), and {out} holds other files; choose another --out"
        )


def write_directory(out: Path, files: dict[str, bytes], overwrite: bool) -> None:
    """`files` written into a temporary sibling of `out`, which is then renamed to `out` (an
    empty or, with `overwrite`, earlier-export `out` is replaced): `out` is whole or absent."""
    check_out_dir(out, overwrite)
    out = out.absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"--out {out}: cannot create {out.parent}: {error.strerror}") from None
    temporary = out.parent / f".{out.name}.export-{os.getpid()}"
    previous = out.parent / f".{out.name}.previous-{os.getpid()}"
    try:
        temporary.mkdir()
        for name, data in files.items():
            (temporary / name).write_bytes(data)
        if out.exists():
            out.rename(previous)
        temporary.rename(out)
    except OSError as error:
        if previous.exists() and not out.exists():
            previous.rename(out)  # put the earlier export back
        raise ExportError(f"--out {out}: writing failed ({error}); nothing was written") from None
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
        shutil.rmtree(previous, ignore_errors=True)


# --- what is written ---


def leaf_name(path) -> str:
    """'params/Dense_0/kernel' for a pytree key path."""
    import jax

    parts = []
    for entry in path:
        if isinstance(entry, jax.tree_util.DictKey):
            parts.append(str(entry.key))
        elif isinstance(entry, jax.tree_util.GetAttrKey):
            parts.append(entry.name)
        elif isinstance(entry, jax.tree_util.SequenceKey):
            parts.append(str(entry.idx))
        else:
            parts.append(str(entry).strip(".[]'\""))
    return "/".join(parts)


def flat_weights(policy) -> tuple[dict[str, Any], Any, list[str]]:
    """(name -> numpy array, the tree's structure, the names in leaf order) of one member's
    policy parameters."""
    import jax
    import numpy as np

    leaves, treedef = jax.tree_util.tree_flatten_with_path(policy)
    names = [leaf_name(path) for path, _ in leaves]
    if len(set(names)) != len(names):
        raise ExportError(f"policy parameters with clashing names: {names}")
    return {n: np.asarray(leaf) for n, (_, leaf) in zip(names, leaves, strict=True)}, treedef, names


def inference_function(agent, treedef, names: list[str], hparams, privileged: int = 0):
    """policy(weights, obs) -> agent.act(params, obs, ..., explore=False): the member's
    deterministic action for a batch of observations; `hparams` are constants in it. An
    asymmetric actor-critic's policy takes the state alone: its `privileged` entries, which the
    actor never reads, are zeros appended before the call."""
    import jax
    import jax.numpy as jnp

    def policy(weights: dict, obs):
        params = jax.tree_util.tree_unflatten(treedef, [weights[name] for name in names])
        if privileged:
            obs = jnp.concatenate([obs, jnp.zeros((*obs.shape[:-1], privileged), obs.dtype)], -1)
        # The key is never used for a deterministic action (noise scaled by zero, epsilon 0).
        return agent.act(params, obs, jax.random.key(0), hparams, False, 0)

    return policy


def policy_observation_shape(spec) -> tuple[int, ...]:
    """The observation the exported policy takes: the env's, or an asymmetric actor-critic's
    state alone (its first `policy_obs_size` entries; the privileged rest was its critics')."""
    return (spec.policy_obs_size,) if spec.policy_obs_size else tuple(spec.obs_shape)


def export_policy(agent, policy, hparams, spec) -> tuple[dict[str, Any], bytes]:
    """(weights, the serialized `jax.export` of `inference_function`) of one member (leaves
    without a member axis); the batch dimension is symbolic."""
    import jax
    from jax import export

    weights, treedef, names = flat_weights(policy)
    observed = policy_observation_shape(spec)
    privileged = spec.obs_shape[-1] - observed[-1]  # 0 but for an asymmetric actor-critic
    function = inference_function(agent, treedef, names, hparams, privileged)
    (batch,) = export.symbolic_shape("batch")
    weight_specs = {n: jax.ShapeDtypeStruct(a.shape, a.dtype) for n, a in weights.items()}
    obs_spec = jax.ShapeDtypeStruct((batch, *observed), spec.obs_dtype)
    exported = export.export(jax.jit(function), platforms=PLATFORMS)(weight_specs, obs_spec)
    return weights, bytes(exported.serialize())


def describe(config, spec, loaded, member: int, reason: str, run_dir: Path, hparams) -> dict:
    """policy.json: what the function takes and returns, and where the policy came from."""
    import numpy as np

    from fastpop import config as config_lib
    from fastpop.agents import registry

    if spec.discrete:
        action = {
            "kind": "discrete",
            "num_actions": spec.num_actions,
            "shape": [],
            "dtype": "int32",
        }
    else:
        action = {
            "kind": "continuous",
            "shape": [spec.action_dim],
            "dtype": "float32",
            "low": spec.action_low,
            "high": spec.action_high,
        }
    atari = config_lib.atari_options(config)
    run = loaded.metadata.get("run") or {}
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "algo": config.algo,
        "env_id": config.env.id,
        "observation": {
            "shape": list(policy_observation_shape(spec)),
            "dtype": np.dtype(spec.obs_dtype).name,
        },
        "trained_on": trained_on(spec),
        "frame_stack": spec.frame_stack,
        "atari_preprocessing": None if atari is None else dataclasses.asdict(atari),
        "action": action,
        "call": "actions = jax.export.deserialize(bytearray(policy.jax bytes)).call(weights, obs)"
        ": weights = dict(np.load('weights.npz', allow_pickle=False)), obs of shape (batch, "
        "*observation.shape) and observation.dtype; actions: (batch, *action.shape)",
        "deterministic": "agent.act(..., explore=False): "
        + registry.get(config.algo).deterministic_action,
        "platforms": list(PLATFORMS),
        "run": str(Path(run_dir).resolve()),
        "member": member,
        "member_chosen": reason or "--member",
        "checkpoint": str(loaded.path.resolve()),
        "member_env_steps": run.get("member_env_steps", int(loaded.path.name)),
        "strategy": config.strategy,
        "hparams": plain_hparams(hparams),
        "seed": config.seed,
        "observation_norm": observation_norm(config),
    }


def trained_on(spec) -> dict | None:
    """An asymmetric actor-critic's training observation, [state | privileged_state], of which
    the policy takes the state alone; None where the policy takes what it was trained on."""
    if not spec.policy_obs_size:
        return None
    return {
        "observation_shape": list(spec.obs_shape),
        "policy_entries": spec.policy_obs_size,
        "note": "the policy's observation is the training observation's first policy_entries "
        "(the state); the rest, privileged state, was read by the critics alone. With "
        "observation_norm, mean and var span the training observation: the policy's entries "
        "are normalized by their first policy_entries",
    }


def observation_norm(config) -> dict | None:
    """How the function normalizes observations before its network (agent.observation_norm);
    None where it does not."""
    from fastpop import types

    if not config.agent.get("observation_norm"):
        return None
    key = types.OBSERVATION_NORM_KEY
    return {
        "mean": f"{key}/mean",
        "var": f"{key}/var",
        "applied": "inside policy.jax, before the network: clip((obs - mean) / sqrt(var + "
        "epsilon), -clip, clip), obs as float32 (uint8 scaled to [0, 1] first)",
        "epsilon": types.OBSERVATION_NORM_EPSILON,
        "clip": types.OBSERVATION_NORM_CLIP,
    }


def plain_hparams(hparams) -> dict:
    """name -> value of one member's hparams; floats as their shortest float32 repr."""
    import numpy as np

    from fastpop.agents.base import hparam_fields

    values = {name: np.asarray(value) for name, value in hparam_fields(hparams).items()}
    return {
        name: float(str(value)) if np.issubdtype(value.dtype, np.floating) else value.item()
        for name, value in values.items()
    }


def export_files(loaded, member: int, reason: str, run_dir: Path) -> dict[str, bytes]:
    """The three files of member `member` of a loaded checkpoint (`evaluate.load_latest`)."""
    import io

    import jax
    import numpy as np

    from fastpop.config.build import build_env_spec

    config = loaded.config
    spec = build_env_spec(config)
    policy = jax.tree.map(lambda leaf: np.asarray(leaf[member]), loaded.policy)
    hparams = jax.tree.map(lambda leaf: np.asarray(leaf[member]), loaded.hparams)
    weights, function = export_policy(loaded.agent, policy, hparams, spec)
    buffer = io.BytesIO()
    np.savez(buffer, **weights)
    description = describe(config, spec, loaded, member, reason, run_dir, hparams)
    return {
        WEIGHTS_FILE: buffer.getvalue(),
        FUNCTION_FILE: function,
        SPEC_FILE: (json.dumps(description, indent=1) + "\n").encode(),
    }
