"""The acting policies of one policy version on their way to the host, while the learner's
device goes on (process mode publishes them to the collectors, fastpop.run.update_pipeline).

A copy is made right after the update whose states it reads is dispatched, and published once
the next update is dispatched too: by then the next update has been handed those states and
donated them. So a copy holds arrays a program made from the states (what
`Training.policies` computes), never the states' own arrays, and it starts their
device-to-host copy as it is made: the host finds them there once the update is done, instead
of waiting for the update and then for the copy.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


def owned(policy, states):
    """`policy` with every leaf that is one of `states`' own arrays copied (a shared-critic
    strategy's policies are its states' actors): the next update donates the states."""
    state_arrays = {id(leaf) for leaf in jax.tree.leaves(states)}
    return jax.tree.map(lambda leaf: jnp.copy(leaf) if id(leaf) in state_arrays else leaf, policy)


def start_host_copy(tree) -> None:
    """Starts the device-to-host copy of every device array of `tree` (asynchronous). An array
    split over several processes is left to be read shard by shard when it is needed."""
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array) and leaf.is_fully_addressable:
            leaf.copy_to_host_async()


class PolicyCopy:
    """`Learner.policy_tree` at one `policy_version`: its policies and hparams as device arrays
    of their own, their host copy under way, and the members' clocks as they were then."""

    def __init__(self, version: int, arrays: tuple, clocks: tuple, to_host: Callable):
        """`arrays`: (stacked policy params, stacked hparams), owned (`owned`); `clocks`:
        `MemberClocks.published` at the copy; `to_host`: a device array as the host reads it
        (`Learner.host_array`)."""
        self.version, self.arrays, self.clocks, self.to_host = version, arrays, clocks, to_host
        self._host: tuple | None = None
        start_host_copy(arrays)

    def ready(self) -> bool:
        """Whether the arrays are computed (the update they come from is done); never waits."""
        return all(
            leaf.is_ready() for leaf in jax.tree.leaves(self.arrays) if isinstance(leaf, jax.Array)
        )

    def wait(self) -> None:
        """Until the arrays are computed (the update they come from is done)."""
        jax.block_until_ready(self.arrays)

    def host(self, clocks_now: tuple) -> tuple:
        """(policy params, hparams, clocks) as host arrays, what the workers act with. The clocks
        are `clocks_now` (the env steps of each trial as they are now) where the members still
        run the trials of the copy, else the copy's own: a policy is never sent with the trial
        of another."""
        if self._host is None:  # read once, however often it is sent
            self._host = jax.tree.map(self.to_host, self.arrays)
        same_trials = np.array_equal(clocks_now[0], self.clocks[0])
        clocks = clocks_now if same_trials else self.clocks
        return (*self._host, tuple(self.to_host(np.asarray(c)) for c in clocks))
