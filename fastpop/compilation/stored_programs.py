"""Traced programs kept on disk, so that a rerun skips tracing and lowering them.

JAX's persistent compilation cache (compile_cache.py) spares a rerun XLA's work, but JAX finds
an entry by hashing the lowered module: every program is still traced and lowered first. For
device mode's large programs (the chunk's two, the evaluation, the env lanes' reset) that is
most of a warm start: ~6 of brax's 10 s on a 2-core CPU. `stored_jit(fn, identity, name)`
exports the program once (`jax.export`: the traced and lowered StableHLO) into
$FASTPOP_CACHE_DIR/programs; a later process with the same key loads it and calls it, tracing
only a wrapper, and XLA's compile of it is a hit in the compilation cache.

The key is everything the traced program depends on: `identity` (what the caller knows decides
the function: device mode passes the run's config less the fields no program reads, see
fastpop.run.parts.program_identity), `name`, the arguments' tree structure, shapes and dtypes,
fastpop's source code, the versions of JAX, of the network libraries (`LIBRARIES`) and of the
env families' (each family's adapter names its own; `add_library_source`), the JAX settings that
change tracing, and the backend. `identity` None, the compilation cache off (or
FASTPOP_STORED_PROGRAMS=0), a program on several devices or processes, or anything the exporter
cannot write (a pytree node it cannot name, a host callback) is plain `jax.jit`; a stored file
that does not load is exported again. The files themselves, and the directory's bound
(FASTPOP_PROGRAMS_MAX_BYTES), are program_store.py's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from importlib import metadata
from pathlib import Path

import jax

from fastpop.compilation import compile_cache, program_store, static_codec

SWITCH = "FASTPOP_STORED_PROGRAMS"  # 0: never stored, whatever the compilation cache
PACKAGE = Path(__file__).resolve().parents[1]  # fastpop/: its sources decide the programs
# Libraries whose code ends up inside every program of device mode's. The env families' own are
# named by their adapters (fastpop.envs, a layer above this one), which add them through
# `add_library_source` when a device env is built: this module names no family.
LIBRARIES = ("jax", "jaxlib", "flax", "optax", "chex", "numpy")
# JAX settings that change what a function traces or lowers to.
JAX_SETTINGS = (
    "jax_enable_x64",
    "jax_default_matmul_precision",
    "jax_threefry_partitionable",
    "jax_default_prng_impl",
    "jax_numpy_rank_promotion",
    "jax_numpy_dtype_promotion",
    "jax_enable_checks",
    "jax_debug_nans",
    "jax_debug_infs",
    "jax_disable_jit",
)

_library_sources: dict = {}  # functions naming more libraries, as keys (`add_library_source`)


def directory() -> Path | None:
    """Where programs are kept; None while the compilation cache is off or not set up, or
    FASTPOP_STORED_PROGRAMS=0."""
    base = compile_cache.user_cache_dir()
    if base is None or not compile_cache.is_on() or os.environ.get(SWITCH, "1") == "0":
        return None
    return base / "programs"


def source_files() -> list[Path]:
    """fastpop's sources, every one of which may decide a program (the fingerprint's)."""
    return sorted(PACKAGE.rglob("*.py"))


def add_library_source(source) -> None:
    """Key programs also by the versions of the distributions `source()` names, read whenever
    the key is made (a layer above adds its libraries so: fastpop.envs.device_envs, the env
    families'). Adding the same function again changes nothing."""
    _library_sources[source] = None


def libraries() -> tuple[str, ...]:
    """The distributions whose versions key programs: `LIBRARIES` and those of every source."""
    added = {name for source in list(_library_sources) for name in source()}
    return tuple(sorted({*LIBRARIES, *added}))


def fingerprint() -> str:
    """This process's code, libraries, JAX settings and backend, as text."""
    return _fingerprint(libraries())


@functools.cache
def _fingerprint(names: tuple[str, ...]) -> str:
    source = hashlib.sha256()
    for path in source_files():
        source.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    settings = {name: str(getattr(jax.config, name, None)) for name in JAX_SETTINGS}
    device = jax.devices()[0]
    backend = f"{device.platform} {device.device_kind} x{jax.device_count()}"
    return json.dumps([source.hexdigest(), versions, settings, backend], sort_keys=True)


def stored_jit(
    fn,
    identity: str | None,
    name: str,
    donate_argnums: tuple[int, ...] = (),
    compiler_options: dict | None = None,
):
    """`jax.jit(fn, donate_argnums=..., compiler_options=...)`, whose traced program is kept on
    disk under a key of `identity` (None: never stored) and `name` (which of the caller's
    programs). A stored program loaded is compiled with the same `compiler_options`."""
    options = {"donate_argnums": donate_argnums, "compiler_options": compiler_options or None}
    jitted = jax.jit(fn, **options)
    if identity is None:
        return jitted
    return StoredJit(jitted, identity, name, options)


class StoredJit:
    """Called (or `lower`ed) as the jitted function: per argument signature, the stored program
    where one loads, else the program exported now and stored, else the jitted function
    (`jitted`, also what jax.export takes)."""

    def __init__(self, jitted, identity: str, name: str, jit_options: dict):
        self.jitted, self.identity, self.name = jitted, identity, name
        self.jit_options = jit_options  # donate_argnums, compiler_options
        self.programs: dict[tuple, object] = {}  # argument signature -> its program
        self.exported: dict[tuple, object] = {}  # -> its jax.export.Exported, or None
        # Device mode calls the lanes' program in a thread while asking it for its shapes:
        # one of them exports (traces) it, the other waits for that.
        self._making = threading.Lock()

    def __call__(self, *args):
        leaves, treedef = jax.tree.flatten(args)
        program = self._program(args, leaves, treedef)
        if program is self.jitted:
            return program(*args)
        # A stored program's outputs are committed to their device (jax.export's call pins its
        # device), a plain jit's are not: the arrays fed back would be a second variant.
        return program(*_committed(args, leaves, treedef))

    def lower(self, *args):
        leaves, treedef = jax.tree.flatten(args)
        return self._program(args, leaves, treedef).lower(*args)

    def output_shapes(self, *args):
        """The outputs' shapes and dtypes: the stored program's where there is one (loaded, or
        exported now, so that a later process loads it untraced), else traced."""
        leaves, treedef = jax.tree.flatten(args)
        self._program(args, leaves, treedef)
        exported = self.exported[_signature(leaves, treedef)]
        if exported is None:
            return jax.eval_shape(self.jitted, *args)
        shapes = [jax.ShapeDtypeStruct(aval.shape, aval.dtype) for aval in exported.out_avals]
        return jax.tree.unflatten(exported.out_tree, shapes)

    def _cache_size(self) -> int:
        """Compiled variants, as jax.jit's (benchmarks and tests check nothing recompiles)."""
        return sum(program._cache_size() for program in set(self.programs.values()))

    def _program(self, args: tuple, leaves: list, treedef):
        signature = _signature(leaves, treedef)
        if signature not in self.programs:
            with self._making:
                if signature not in self.programs:
                    text = f"{_tree_text(treedef)} {[_aval_text(leaf) for leaf in leaves]}"
                    program, self.exported[signature] = self._make(args, text)
                    self.programs[signature] = program  # last: read without the lock
        return self.programs[signature]

    def _make(self, args: tuple, signature: str) -> tuple:
        """(the program for `args`, its Exported or None where it is plain jit)."""
        folder = directory()
        if folder is None or jax.process_count() > 1 or not _on_one_device(args):
            return self.jitted, None
        text = "\n".join([self.identity, self.name, signature, fingerprint()])
        key = hashlib.sha256(text.encode()).hexdigest()[:32]
        path = folder / f"{self.name}-{key}{program_store.SUFFIX}"
        exported = program_store.load(path)
        if exported is not None and exported.in_tree != jax.tree.structure((args, {})):
            exported = None  # a node's static data read back otherwise: export anew
        if exported is None:
            exported = program_store.export_and_store(self.jitted, args, path)
            if exported is None:
                program_store.count("not_stored")
                return self.jitted, None
        call = _named(exported.call, f"stored_{self.name}")
        return jax.jit(call, **self.jit_options), exported


def _named(function, name: str):
    """`function` under `name`, which `--verbose` and summary.json's `compiles` then show
    (every stored program would be `jit(call)`, `Exported.call`'s name)."""

    def program(*args):
        return function(*args)

    program.__name__ = program.__qualname__ = name
    return program


def output_shapes(program, *args):
    """`program`'s (a `stored_jit`'s) output shapes and dtypes for `args`, as its
    `output_shapes` gives them, or traced where it is plain jit."""
    if isinstance(program, StoredJit):
        return program.output_shapes(*args)
    return jax.eval_shape(program, *args)


def _tree_text(treedef) -> str:
    """The tree structure as text that is the same in every process: `str(treedef)` prints
    static data by repr, which for some (MJX's wrapped arrays) holds a memory address."""
    node = treedef.node_data()
    if node is None:
        return "*"
    node_type, static = node
    try:
        static_text = static_codec.encode((static,)).decode()
    except TypeError:
        static_text = repr(static)  # an address in it only costs a stored program
    children = ",".join(_tree_text(child) for child in treedef.children())
    return f"{static_codec.type_name(node_type)}{static_text}({children})"


def _signature(leaves: list, treedef) -> tuple:
    """What tells one call's program from another's (the programs dicts' key)."""
    return treedef, tuple(map(_leaf_signature, leaves))


def _leaf_signature(leaf):
    """What a jit would tell apart: shape, dtype, weak type (cheap: called on every call)."""
    shape = getattr(leaf, "shape", None)
    if shape is None:  # a Python scalar
        return _aval_text(leaf)
    return shape, leaf.dtype, getattr(leaf, "weak_type", False)


def committed(args: tuple) -> tuple:
    """`args` with every uncommitted array committed to its device, no copy: what a stored
    program is called with, and what a program compiled ahead for committed shapes expects
    (fastpop.collect.chunk_programs.lowerings)."""
    leaves, treedef = jax.tree.flatten(args)
    return _committed(args, leaves, treedef)


def _committed(args: tuple, leaves: list, treedef) -> tuple:
    """`args` (flattened: `leaves`, `treedef`) with every uncommitted array committed to its
    device (no copy)."""
    if all(getattr(leaf, "committed", True) for leaf in leaves):
        return args
    leaves = [
        leaf if getattr(leaf, "committed", True) else jax.device_put(leaf, leaf.sharding)
        for leaf in leaves
    ]
    return jax.tree.unflatten(treedef, leaves)


def _aval_text(leaf) -> str:
    aval = jax.typeof(leaf)
    return f"{aval.str_short(short_dtypes=True)}{'w' if getattr(aval, 'weak_type', 0) else ''}"


def _on_one_device(args: tuple) -> bool:
    for leaf in jax.tree.leaves(args):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return False
    return True
