"""Device mode's evaluation (fastpop.collect.device_collection): a snapshot's members played on
a separate batch of envs with the snapshot's policy held constant, by one program compiled in a
thread once the loop is `running` and its first update calls have run."""

from __future__ import annotations

import time
from concurrent import futures
from concurrent.futures import Future

import jax
import numpy as np

from fastpop.collect import device_rollout, snapshot
from fastpop.compilation import stored_programs
from fastpop.compilation.background import in_background
from fastpop.xla_defaults import env_stepping_options


class DeviceEvaluation:
    """Snapshots handed in (`evaluate`), evaluated in order once the program is compiled, and
    their results kept until `evaluations` asks for them."""

    def __init__(self, parts, identity: str | None):
        """parts: the collection's `DeviceParts`; identity: what keys its program on disk
        (None: not kept)."""
        self.parts = parts
        stepping = env_stepping_options()  # CPU: a shorter compile of an env's step
        self.jitted = stored_programs.stored_jit(
            self._evaluate_members, identity, "evaluate", compiler_options=stepping
        )
        self.compiling: Future | None = None  # the program compiled ahead, once `start`ed
        self._compile_wanted = False
        self._wait_for_program = True  # `start` tells: each snapshot evaluated when handed in
        self._snapshots: list[dict] = []  # handed in, evaluated once the program is compiled
        self._results: list[dict] = []

    def set_policy_template(self, policy_template) -> None:
        """What a snapshot decodes to: host arrays of the policy tree's shapes."""
        self.snapshot_shapes = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), policy_template
        )
        self.treedef = jax.tree.structure(policy_template)

    def start(self, wait_for_program: bool) -> None:
        """The program may compile ahead (`compile_ahead`) from now on; `wait_for_program`:
        each snapshot is evaluated as it is handed in (the strategy acts on evaluations)."""
        self._compile_wanted = True
        self._wait_for_program = wait_for_program

    def compile_ahead(self) -> None:
        """The program's compile started in a thread, once, if `start`ed."""
        if self._compile_wanted and self.compiling is None:
            self.compiling = in_background(self._compile)

    def evaluate(self, arrays: dict) -> None:
        """Evaluates the snapshot now, or, where the strategy does not act on evaluations and
        the evaluation program is still compiling, once `evaluations` finds it compiled: the
        loop trains meanwhile (a cold brax pendulum run's first evaluation held training ~4 s
        for that compile). Where the strategy acts on them, waiting keeps a run's rounds, and
        so its numbers, the same from run to run."""
        self._snapshots.append(arrays)
        self._evaluate_handed_in(None if self._wait_for_program else 0.0)

    def evaluations(self, timeout: float = 0.0) -> list[dict]:
        self._evaluate_handed_in(timeout)
        results, self._results = self._results, []
        return results

    def _evaluate_handed_in(self, timeout: float | None) -> None:
        """Evaluates the snapshots handed in, in order, once the evaluation program is compiled
        (waiting for it at most `timeout` seconds; None: as long as it takes). Without one it
        starts nothing: the loop asks every pass, and the compile waits for the first update."""
        if not self._snapshots:
            return
        self.compile_ahead()
        if self.compiling is not None:
            futures.wait([self.compiling], timeout)
            if not self.compiling.done():
                return
        while self._snapshots:
            self._evaluate_now(self._snapshots.pop(0))

    def _evaluate_now(self, arrays: dict) -> None:
        leaves, meta = snapshot.decode(arrays)
        policy, hparams, _ = jax.tree.unflatten(self.treedef, leaves)
        start = time.perf_counter()
        returns = self._member_returns(policy, hparams, self.key(meta))
        self._results.append(
            {
                "eval_index": meta.eval_index,
                "env_steps": meta.env_steps,
                "updates": meta.updates,
                "wall_time": meta.wall_time,
                "return_mean": returns.mean(axis=1).tolist(),
                "return_std": returns.std(axis=1).tolist(),
                "seconds": time.perf_counter() - start,
            }
        )

    def _member_returns(self, policy, hparams, key) -> np.ndarray:
        """(P, episodes) returns of a decoded snapshot's members."""
        return np.asarray(self.program()(policy, hparams, key), np.float64)

    def key(self, meta: snapshot.SnapshotMeta):
        return jax.random.fold_in(jax.random.key(self.parts.seed), 7919 * (meta.eval_index + 1))

    def _compile(self):
        """The program for a decoded snapshot, as `evaluate` passes it (so it runs where the
        jitted call would). Shapes only: the learner's state is the loop's."""
        key = jax.eval_shape(lambda: self.key(snapshot.SnapshotMeta(0, 0, 0, 0.0)))
        policy, hparams, _ = self.snapshot_shapes
        return self.jitted.lower(policy, hparams, key).compile()

    def program(self):
        """The program compiled in the background (started now by an evaluation that comes
        before the first update: compiled from shapes either way, so that the program stored on
        disk is the same whichever came first), or, where that failed (or it was not
        `start`ed), the jitted call, which raises the same error here in the loop."""
        self.compile_ahead()
        if self.compiling is not None:
            try:
                return self.compiling.result()
            except Exception:  # the jitted call below raises it where the loop reports it
                pass
        return self.jitted

    # --- the compiled program ---

    def _evaluate_members(self, policy, hparams, key):
        parts = self.parts
        return device_rollout.evaluate_members(
            parts.env, parts.episode_length, parts.agent, policy, hparams, key, parts.eval_episodes
        )
