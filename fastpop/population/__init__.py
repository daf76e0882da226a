"""The population axis: stacking members and the vectorized and sequential executors of an
Agent (`executors.py`), the population updated a chunk of members per program (`chunked.py`),
how many members a chunk holds (`chunking.py`, measured per machine and cached by
`tuning_cache.py`), the member axis over several devices (`sharding.py`) and the
device replay buffers the updates sample from (`replay.py`).

Callers import the package (`from fastpop import population`); this face re-exports the
executors' helpers they use (and chunked's `copy_tree`).
"""

from fastpop.population.chunked import copy_tree
from fastpop.population.executors import (
    EXECUTIONS,
    Executor,
    UpdatePlan,
    broadcast_hparams,
    copy_member,
    finite_members,
    gather,
    image_agent_on_cpu,
    init_population,
    initializer,
    make_executor,
    member,
    member_policies,
    member_update_loop,
    policy_step,
    population_act,
    population_size,
    repeated,
    sequential,
    sequential_in_one_program,
    stack,
    unstack,
    updates_per_program,
    vectorized,
)

__all__ = [
    "EXECUTIONS",
    "Executor",
    "UpdatePlan",
    "broadcast_hparams",
    "copy_member",
    "copy_tree",
    "finite_members",
    "gather",
    "image_agent_on_cpu",
    "init_population",
    "initializer",
    "make_executor",
    "member",
    "member_policies",
    "member_update_loop",
    "policy_step",
    "population_act",
    "population_size",
    "repeated",
    "sequential",
    "sequential_in_one_program",
    "stack",
    "unstack",
    "updates_per_program",
    "vectorized",
]
