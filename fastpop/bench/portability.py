"""Whether a program fastpop compiles would run on an NVIDIA GPU, checked on a machine without
one: `jax.export` lowers it for CUDA (a host callback fails there), and the lowered module must
call no custom call that exists only on the CPU (LAPACK, DUCC's FFT, Python callbacks), which
the exporter itself lets through."""

from __future__ import annotations

import re

import jax
from jax import export

# Custom-call targets XLA:CPU alone provides (their CUDA counterparts: cusolver_*, cu_*).
CPU_ONLY_TARGETS = re.compile(r"^(lapack_|ducc_|xla_python_cpu_callback|xla_ffi_python_cpu)")
CUSTOM_CALL = re.compile(r"custom_call @([\w.$-]+)")
# A Pallas kernel's call on a GPU (agents/pallas_mlp.py): XLA:GPU's own, with no serialization
# guarantee across versions, which `jax.export` checks for. This lowering is never stored.
TRITON_TARGET = "__gpu$xla.gpu.triton"


class NotPortable(ValueError):
    """A program that does not lower for the platform, or calls what only the CPU has."""


def lower_for(function, *args, platform: str = "cuda") -> export.Exported:
    """`jax.export` of `function` (jitted here unless it is already) for `platform`; args may
    be arrays or `jax.ShapeDtypeStruct`s; a stored program (fastpop.compilation.stored_programs)
    is its jitted function. NotPortable names what does not lower."""
    function = getattr(function, "jitted", function)
    jitted = function if hasattr(function, "lower") else jax.jit(function)
    try:
        allowed = [export.DisabledSafetyCheck.custom_call(TRITON_TARGET)]
        exported = export.export(jitted, platforms=(platform,), disabled_checks=allowed)(*args)
    except ValueError as error:  # a host callback, a missing lowering rule
        raise NotPortable(f"does not lower for {platform}: {error}") from error
    if platform != "cpu":
        targets = set(CUSTOM_CALL.findall(exported.mlir_module()))
        if cpu_only := sorted(t for t in targets if CPU_ONLY_TARGETS.match(t)):
            raise NotPortable(f"calls CPU-only custom calls on {platform}: {', '.join(cpu_only)}")
    return exported
