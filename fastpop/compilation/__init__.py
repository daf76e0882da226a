"""What fastpop keeps of the programs it compiles: JAX's persistent compilation cache
(`compile_cache.py`), the count of programs compiled and loaded (`compile_stats.py`), device
mode's large programs kept traced on disk (`stored_programs.py`) and the pytree static data they
are written with (`static_codec.py`), and the thread programs are compiled ahead in
(`background.py`).

Nothing is imported here: `fastpop.compilation.compile_cache` must stay importable without JAX.
"""
