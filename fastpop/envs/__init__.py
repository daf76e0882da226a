"""Environments: one factory for every id fastpop trains on (`gymnasium_envs.py`: gymnasium
MuJoCo v5, classic control, Atari (its preprocessing: `atari_preprocessing.py`); brax ids are
checked there too), brax on the device (`brax_envs.py`), ale_py's vectorized Atari
(`atari_vector.py`) and the errors a bad id raises (`errors.py`).

Callers import the package (`from fastpop import envs`); this face re-exports what they use.
"""

from fastpop.envs.atari_preprocessing import AtariOptions
from fastpop.envs.errors import (
    MissingExtra,
    UnknownEnvironment,
)
from fastpop.envs.gymnasium_envs import (
    check_env_id,
    env_spec,
    env_spec_from_spaces,
    make_env,
    make_vector_env,
)

__all__ = [
    "AtariOptions",
    "MissingExtra",
    "UnknownEnvironment",
    "check_env_id",
    "env_spec",
    "env_spec_from_spaces",
    "make_env",
    "make_vector_env",
]
