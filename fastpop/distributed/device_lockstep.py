"""Device mode over several processes (`--distributed` with a brax, gymnax or Playground id).

Every process runs the same `DeviceCollection` over the global mesh: the env lanes are split over
every process's devices like the members they serve, so each process steps its own members' envs
on its own devices inside the chunk's two programs (rollout and replay add; updates), which
every process calls at the same pass of the loop. Nothing crosses between processes for a chunk.

An evaluation is the same global program as on one process (same keys, so the same returns):
each process puts its own members' snapshot into the global member arrays, the program steps
each member's evaluation envs on that member's devices, and the returns are all-gathered, so
every process has every member's returns without an exchange. The loop's other decisions are
agreed once per pass (`agree`: stops and the clock), as in process mode.

Checkpoints hold the env lanes and the collection's key: each process writes its own shards
(fastpop.distributed.checkpoint_sharded).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

from fastpop.collect.device_collection import DeviceCollection, DeviceParts
from fastpop.collect.device_evaluation import DeviceEvaluation
from fastpop.distributed.lockstep import AgreedSignals, Lockstep
from fastpop.learn.learner import Learner
from fastpop.population import sharding
from fastpop.run.stop_signals import stop_exception


class LockstepEvaluation(DeviceEvaluation):
    """The evaluation over the global mesh, never compiled ahead (module docstring)."""

    def _member_returns(self, policy, hparams, key) -> np.ndarray:
        """The snapshot holds this process's members; every member's returns come back."""
        policy, hparams = sharding.from_local_members((policy, hparams), self.parts.mesh)
        return sharding.to_host(self.jitted(policy, hparams, key)).astype(np.float64)


class LockstepDeviceCollection(DeviceCollection):
    """A `DeviceCollection` on one process of several (module docstring)."""

    evaluation_type = LockstepEvaluation

    def __init__(
        self,
        lockstep: Lockstep,
        parts: DeviceParts,
        policy_template,
        local_elapsed: Callable[[], float],
    ):
        """policy_template: shapes of the learner's `policy_tree`; local_elapsed: this process's
        run clock."""
        super().__init__(parts, policy_template)
        self.lockstep, self.local_elapsed = lockstep, local_elapsed
        self.signals = AgreedSignals(self.agree)
        self.agreed_elapsed: float | None = None  # process 0's clock at the latest pass

    @contextlib.contextmanager
    def running(self, learner: Learner, log_event, generation: int) -> Iterator[None]:
        """No evaluation compiled ahead: its first call compiles it over the global mesh."""
        self.agree()  # the processes start the loop together, on one clock
        yield

    def agree(self) -> None:
        """The agreement of one pass of the loop: a stop asked on any process (raised here on
        every one) and process 0's clock."""
        payload = {"signal": self.signals.signal, "elapsed": self.local_elapsed()}
        everyone = self.lockstep.exchange(payload)
        signals = [theirs["signal"] for theirs in everyone if theirs["signal"] is not None]
        if signals:
            raise stop_exception(signals[0])
        self.agreed_elapsed = everyone[0]["elapsed"]

    def abandon(self) -> None:
        """Another process is lost: no worker process to stop, nothing left behind."""
