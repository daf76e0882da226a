"""A pytree node's static data as JSON bytes and back, for programs stored with jax.export.

jax.export writes a custom node's static (auxiliary) data through functions its owner gives.
Dataclass nodes usually keep plain values there (names, sizes), but MuJoCo MJX's keep NumPy
arrays, wrapped in a hashable class of MJX's own, and NumPy scalars: so Playground's env state
could not be stored. Encoded here: None, bools, ints, floats, strings, tuples and lists of them,
NumPy arrays and scalars, and objects of a class that wraps one array (`cls(array)` rebuilds
it, its `array` attribute holds it) among the modules already imported. Nothing else: the
caller then keeps the program unstored. Decoding builds arrays from bytes with NumPy and finds
classes only among imported modules: nothing is unpickled and nothing is imported by name.
"""

from __future__ import annotations

import base64
import json
import sys

import numpy as np

PLAIN = (type(None), bool, int, float, str)


def encode(values: tuple) -> bytes:
    """`values` (a node's static data) as JSON bytes; TypeError for what is not encodable."""
    return json.dumps(_encode(tuple(values))).encode()


def decode(data: bytes) -> tuple:
    return _decode(json.loads(data))


def _encode(value):
    if type(value) in PLAIN:
        return value
    if isinstance(value, (tuple, list)):
        return {"tuple" if isinstance(value, tuple) else "list": [_encode(v) for v in value]}
    if isinstance(value, np.ndarray):
        return {"ndarray": _array(value)}
    if isinstance(value, np.generic):
        return {"scalar": _array(np.asarray(value))}
    wrapped = getattr(value, "array", None)
    if isinstance(wrapped, np.ndarray) and resolve_type(type_name(type(value))) is type(value):
        return {"wrapper": type_name(type(value)), "ndarray": _array(wrapped)}
    raise TypeError(f"static data of type {type_name(type(value))} is not encodable")


def _decode(value):
    if not isinstance(value, dict):
        return value
    if "tuple" in value:
        return tuple(_decode(v) for v in value["tuple"])
    if "list" in value:
        return [_decode(v) for v in value["list"]]
    if "scalar" in value:
        return _from_array(value["scalar"])[()]
    if "wrapper" in value:
        cls = resolve_type(value["wrapper"])
        if cls is None:
            raise ValueError(f"{value['wrapper']}: not among the imported modules")
        return cls(_from_array(value["ndarray"]))
    return _from_array(value["ndarray"])


def _array(array: np.ndarray) -> dict:
    if array.dtype.hasobject:
        raise TypeError("an array of Python objects is not encodable")
    contiguous = np.ascontiguousarray(array)
    data = base64.b64encode(contiguous.tobytes()).decode()
    return {"dtype": array.dtype.str, "shape": list(array.shape), "data": data}


def _from_array(encoded: dict) -> np.ndarray:
    dtype = np.dtype(encoded["dtype"])
    if dtype.hasobject:
        raise ValueError("an array of Python objects is not decodable")
    flat = np.frombuffer(base64.b64decode(encoded["data"]), dtype=dtype)
    return flat.reshape(encoded["shape"]).copy()  # writable, as the original was


def type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_type(name: str) -> type | None:
    """A class by "module:qualname" among the modules this process has imported."""
    module_name, _, qualname = name.partition(":")
    found = sys.modules.get(module_name)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None
