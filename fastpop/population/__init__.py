"""The population axis: stacking members (`stacking.py`), an Agent's act and init over every
member (`members.py`) and the vectorized and sequential executors of its update
(`executors.py`), the population updated a chunk of members per program (`chunked.py`),
how many members a chunk holds (`chunking.py`, measured per machine and cached by
`tuning_cache.py`), the member axis over several devices (`sharding.py`) and the
device replay buffers the updates sample from (`replay.py`).

Callers import the package (`from fastpop import population`); this face re-exports the
helpers they use (and chunked's `copy_tree`).
"""

from fastpop.population.chunked import copy_tree
from fastpop.population.executors import (
    EXECUTIONS,
    Executor,
    UpdatePlan,
    image_agent_on_cpu,
    make_executor,
    member_update_loop,
    repeated,
    sequential,
    sequential_in_one_program,
    updates_per_program,
    vectorized,
)
from fastpop.population.members import (
    init_population,
    initializer,
    member_policies,
    policy_step,
    population_act,
)
from fastpop.population.stacking import (
    broadcast_hparams,
    copy_member,
    finite_members,
    gather,
    member,
    population_size,
    stack,
    unstack,
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
