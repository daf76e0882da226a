"""One population over several processes (`--distributed`): lock step over jax.distributed's key-
value store, the distributed run and its sharded checkpoints."""
