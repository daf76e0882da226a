"""The store of stored_programs.py on disk: one exported program (`jax.export`) per file,
written whole (a temporary file renamed; every pytree node of its arguments and outputs
registered with jax.export under a name every process gives it), read back (a file that does not
read is None: the caller exports it again), and the folder kept within FASTPOP_PROGRAMS_MAX_BYTES
(default 256 MiB), least recently used first out. `counts()`: what this process loaded, wrote,
or could not store.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from pathlib import Path

from jax import export

from fastpop.compilation import static_codec

log = logging.getLogger(__name__)

MAX_BYTES_VARIABLE = "FASTPOP_PROGRAMS_MAX_BYTES"
DEFAULT_MAX_BYTES = 256 << 20
MAGIC = b"fastpop stored program 1\n"
SUFFIX = ".program"
BUILTIN_NODES = (tuple, list, dict, type(None))

_lock = threading.Lock()
_counts = {"loaded": 0, "written": 0, "not_stored": 0}
_registered: set[type] = set()


def counts() -> dict:
    """Programs this process loaded from the store, wrote to it, or could not store."""
    with _lock:
        return dict(_counts)


def count(what: str) -> None:
    with _lock:
        _counts[what] += 1


def export_and_store(jitted, args: tuple, path: Path):
    """The exported program, written to `path` (None where it cannot be exported or named)."""
    try:
        exported = export.export(jitted)(*args)
        types = _node_types(exported.in_tree) | _node_types(exported.out_tree)
        names = [_register(node_type) for node_type in sorted(types, key=str)]
        if None in names:
            log.info("%s: not stored (a pytree node fastpop cannot name)", path.name)
            return None
        blob = exported.serialize()
        again = export.deserialize(blob)
        if (again.in_tree, again.out_tree) != (exported.in_tree, exported.out_tree):
            log.info("%s: not stored (its tree structure does not read back)", path.name)
            return None
    except Exception as error:  # a host callback, an effect, ...: plain jit serves
        log.info("%s: not stored (%s: %s)", path.name, type(error).__name__, error)
        return None
    header = json.dumps({"node_types": names}).encode() + b"\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_bytes(MAGIC + header + bytes(blob))
        os.replace(temporary, path)  # another process writing the same key writes the same
        count("written")
        _prune(path.parent)
    except OSError as error:
        log.warning("fastpop: could not store %s (%s)", path, error.strerror)
    return exported


def load(path: Path):
    """The exported program stored at `path`, or None (absent, or not readable: then written
    again by the caller)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            raise ValueError("not a stored program")
        header, _, blob = data[len(MAGIC) :].partition(b"\n")
        for name in json.loads(header)["node_types"]:
            node_type = static_codec.resolve_type(name)
            if node_type is None or _register(node_type) is None:
                return None  # its module is not imported in this process: export anew
        exported = export.deserialize(bytearray(blob))
    except Exception as error:  # truncated or foreign: exported and written again
        log.warning("fastpop: ignoring the stored program %s (%s)", path, error)
        return None
    os.utime(path)  # its last use, for pruning
    count("loaded")
    return exported


def _node_types(treedef) -> set[type]:
    node = treedef.node_data()
    found = {node[0]} if node is not None and node[0] not in BUILTIN_NODES else set()
    for child in treedef.children():
        found |= _node_types(child)
    return found


def _register(node_type: type) -> str | None:
    """Teach jax.export to write `node_type` (a NamedTuple, or a dataclass-like node whose
    static data fastpop.compilation.static_codec encodes); its name, or None where it cannot be
    named."""
    name = static_codec.type_name(node_type)
    with _lock:
        if node_type in _registered:
            return name
        try:
            if issubclass(node_type, tuple) and hasattr(node_type, "_fields"):
                export.register_namedtuple_serialization(node_type, serialized_name=name)
            elif dataclasses.is_dataclass(node_type):
                export.register_pytree_node_serialization(
                    node_type,
                    serialized_name=name,
                    serialize_auxdata=static_codec.encode,  # TypeError: not stored
                    deserialize_auxdata=static_codec.decode,
                )
            else:
                return None
        except ValueError as error:  # registered already, under another name: not ours to use
            log.info("%s: %s", name, error)
            return None
        _registered.add(node_type)
    return name


def _prune(folder: Path) -> None:
    """Least recently used programs out until the folder holds at most the limit."""
    try:
        limit = int(float(os.environ.get(MAX_BYTES_VARIABLE) or DEFAULT_MAX_BYTES))
    except ValueError:
        limit = DEFAULT_MAX_BYTES
    try:
        files = [(p.stat().st_mtime, p.stat().st_size, p) for p in folder.glob(f"*{SUFFIX}")]
    except OSError:
        return
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
