"""fastpop: vectorized population training of off-policy RL agents."""

__version__ = "0.1.0"
