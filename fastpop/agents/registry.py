"""The one registry of algorithms: name -> `AlgorithmEntry` (agent factory, config type, action
kind, numpy policy, export description, shared-critic capability).

Code outside an algorithm's own module asks this registry, never for an algorithm by name:
`get(config.algo).actions`, not `config.algo == "dqn"`. The built-in entries come from their
modules (`td3.ENTRY`, ...); `register` adds one at run time (a plugin, a test's toy agent).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax

from fastpop.agents import dqn, sac, td3
from fastpop.agents.base import ACTION_KINDS, NUMPY_POLICY_HPARAMS, AlgorithmEntry, hparam_fields
from fastpop.registry import Registry
from fastpop.types import EnvSpec

DEFAULT = td3.ENTRY.name  # a config's algo when it names none
BUILT_IN = (td3.ENTRY, sac.ENTRY, dqn.ENTRY)


def _check(entry: AlgorithmEntry) -> None:
    """What an entry must say of itself (every entry: nothing is built)."""
    if entry.actions not in ACTION_KINDS:
        raise ValueError(
            f"algorithm {entry.name!r}: actions must be one of {', '.join(ACTION_KINDS)}, "
            f"got {entry.actions!r}"
        )
    kinds = NUMPY_POLICY_HPARAMS
    if entry.numpy_policy is not None and entry.numpy_policy not in kinds:
        raise ValueError(
            f"algorithm {entry.name!r}: numpy_policy must be one of {', '.join(kinds)} or None "
            f"(its jitted act), got {entry.numpy_policy!r}"
        )
    roles = kinds.get(entry.numpy_policy, ())
    if unknown := [role for role in entry.numpy_hparams if role not in roles]:
        raise ValueError(
            f"algorithm {entry.name!r}: numpy_hparams names {', '.join(map(repr, unknown))}, "
            f"not a role of the hparams its numpy policy ({entry.numpy_policy}) reads (its "
            f"roles: {', '.join(roles) or 'none'})"
        )


def numpy_policy_problem(entry: AlgorithmEntry) -> str | None:
    """What the numpy policy an entry claims would not find in its agent (built on a probe env
    from its config's defaults, shapes only: nothing computed), in words; None: nothing, or no
    numpy policy. A collector process would otherwise fail at its first policy."""
    if entry.numpy_policy is None:
        return None
    discrete = entry.actions == "discrete"
    probe = EnvSpec((1,), num_actions=2) if discrete else EnvSpec((1,), action_dim=1)
    agent = entry.make(probe, entry.config_type())

    def shapes():
        hparams = agent.default_hparams()
        return hparams, agent.policy_params(agent.init(jax.random.key(0), hparams))

    hparams, policy = jax.eval_shape(shapes)
    claim = f"algorithm {entry.name!r}: its numpy policy ({entry.numpy_policy}) reads"
    otherwise = "or numpy_policy=None (its collectors then act with its jitted act)"
    fields = hparam_fields(hparams)
    for role, name in entry.numpy_hparam_names().items():
        if name not in fields:
            return (
                f"{claim} its {role} from hparam {name!r}, which its default hparams do not "
                f"have (they have: {', '.join(fields)}); set AlgorithmEntry.numpy_hparams to "
                f"{{{role!r}: one of them}}, {otherwise}"
            )
    modules = policy.get("params") if isinstance(policy, Mapping) else None
    torso = modules.get(entry.policy_torso) if isinstance(modules, Mapping) else None
    if not isinstance(torso, Mapping) or not any(str(n).startswith("Dense_") for n in torso):
        found = ", ".join(map(str, modules)) if isinstance(modules, Mapping) else "no such dict"
        return (
            f"{claim} its MLP's Dense layers from its policy params' ['params']"
            f"[{entry.policy_torso!r}], which hold none (['params'] has: {found}); set "
            f"AlgorithmEntry.policy_torso to the module that holds them, {otherwise}"
        )
    return None


_REGISTRY = Registry("algorithm", _check)
unregister, get = _REGISTRY.unregister, _REGISTRY.get
entries, names_with = _REGISTRY.entries, _REGISTRY.names_with
NAMES = _REGISTRY.names  # live: a config field's choices that follows `register`


def register(entry: AlgorithmEntry, replace: bool = False) -> AlgorithmEntry:
    """Add `entry` at run time (a plugin, a test's toy): refused (ValueError) where it is
    malformed or its numpy policy would not find what it reads in its agent
    (`numpy_policy_problem`), so that a config naming its plugin fails in the learner's
    process (`plugins:`, a ConfigError), before any collector starts. The built-ins are
    checked by tests/test_algorithm_registry.py, not at every import."""
    _check(entry)
    if (problem := numpy_policy_problem(entry)) is not None:
        raise ValueError(problem)
    return _REGISTRY.register(entry, replace)


def default_for(actions: str) -> str:
    """The algorithm for an env of `actions` where none is named (`fastpop bench`): the configs'
    default where it acts in that kind, else the first registered that does."""
    if get(DEFAULT).actions == actions:
        return DEFAULT
    if fits := names_with(actions=actions):
        return fits[0]
    raise ValueError(f"no registered algorithm acts in {actions} actions")


for _entry in BUILT_IN:
    _REGISTRY.register(_entry)
