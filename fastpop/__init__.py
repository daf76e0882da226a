"""fastpop: vectorized population training of off-policy RL agents."""

from fastpop.xla_defaults import apply_xla_defaults

# Before anything below imports JAX: the CPU backend reads XLA_FLAGS when it starts.
apply_xla_defaults()

__version__ = "0.1.0"
