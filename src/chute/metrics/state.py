"""Metric states: exact sums of floats, merging, and (de)serialising."""

from __future__ import annotations

import base64
import json
import math
import zlib
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt

from chute.errors import DataError

State = dict[str, Any]
"""A metric's partial result: numbers, NumPy arrays and nested dicts of those."""

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


# -- exact sums of floats ----------------------------------------------------------------

_EXP_BIAS = 1073  # np.frexp exponents run from -1073 (subnormals) to 1024
_N_EXP = 2098
_UNIT = 1126  # sums are integers in units of 2**-1126 (the smallest step of m * 2**(e-53))
_LIMB = 26
_CHUNK = 1 << 25  # keeps every bincount total below 2**53, so float64 adds them exactly


def _exact_sums(x: Floats, groups: Ints | None = None, n_groups: int = 1) -> list[int]:
    """Exact sums of finite float64 ``x`` per group, as integers in units of 2**-1126.

    Each value is ``mant * 2**(e-53)`` with an integer ``mant < 2**53``; the mantissas are
    split into two limbs and summed per (group, exponent) with ``bincount``. Integer sums
    make the merge exactly associative and commutative. An infinite or NaN value has no
    such form (its mantissa would be cast to a wrong integer in silence), so it is refused:
    callers leave them out or count them, as ``ColumnStats`` counts ±inf.
    """
    if not np.isfinite(x).all():
        raise ValueError("_exact_sums sums finite values only: leave out or count inf and NaN")
    totals = [0] * n_groups
    for start in range(0, len(x), _CHUNK):
        _add_chunk(totals, x[start : start + _CHUNK], groups, start, n_groups)
    return totals


def _add_chunk(totals: list[int], x: Floats, groups: Ints | None, start: int, n: int) -> None:
    frac, exp = np.frexp(x)
    mant = (frac * 2.0**53).astype(np.int64)
    key = exp.astype(np.int64) + _EXP_BIAS
    if groups is not None:
        key += groups[start : start + len(x)] * _N_EXP
    size = n * _N_EXP
    high = np.bincount(key, weights=mant >> _LIMB, minlength=size)
    low = np.bincount(key, weights=mant & ((1 << _LIMB) - 1), minlength=size)
    for k in np.flatnonzero((high != 0) | (low != 0)).tolist():
        group, shift = divmod(k, _N_EXP)
        totals[group] += ((int(high[k]) << _LIMB) + int(low[k])) << shift


def _exact(total: int) -> Fraction:
    return Fraction(total, 1 << _UNIT)


def _ratio(total: int, count: int) -> float | None:
    """``total / count`` correctly rounded (±inf beyond the float range), or None when
    nothing was counted."""
    return _to_float(Fraction(total, count << _UNIT)) if count else None


def _to_float(value: Fraction) -> float:
    """``value`` correctly rounded to a float, ±inf where it is beyond the float range
    (``float(Fraction)`` raises OverflowError there: two values of 1e308 add up to more)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _square_units(x: float) -> int:
    """The exact square of a float whose float square overflows, in units of 2**-1126.
    Such a float is beyond 2**53, so an integer, and so is its square."""
    return int(x) ** 2 << _UNIT


def _object_ints(values: list[int]) -> npt.NDArray[np.object_]:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


# -- states: merging and (de)serialising -------------------------------------------------


def add_states(a: State, b: State) -> State:
    """Merge two states by adding them field by field (nested dicts recursively)."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict):
            out[key] = add_states(out[key], value)
        else:
            out[key] = out[key] + value
    return out


_MAGIC = b"chute-metric-state/1\n"


def dumps(state: State) -> bytes:
    """Serialise a state compactly (zlib'd JSON header + raw arrays; no pickle)."""
    blobs: list[bytes] = []
    header = json.dumps(_encode(state, blobs), separators=(",", ":")).encode()
    raw = _MAGIC + len(header).to_bytes(8, "little") + header + b"".join(blobs)
    return zlib.compress(raw, 6)


def loads(data: bytes) -> State:
    """Rebuild a state written by ``dumps``."""
    try:
        raw = zlib.decompress(data)
    except zlib.error as exc:
        raise DataError(f"not a chute metric state ({exc}); was it written by dumps()?") from exc
    if not raw.startswith(_MAGIC):
        raise DataError("not a chute metric state (bad header); was it written by dumps()?")
    size = int.from_bytes(raw[len(_MAGIC) : len(_MAGIC) + 8], "little")
    start = len(_MAGIC) + 8
    header = json.loads(raw[start : start + size])
    state = _Reader(memoryview(raw)[start + size :]).read(header)
    if not isinstance(state, dict):
        raise DataError("not a chute metric state (its root is not a dict).")
    return state


def state_to_text(state: State) -> str:
    """``base64(dumps(state))``, for a JSON ledger."""
    return base64.b64encode(dumps(state)).decode("ascii")


def state_from_text(text: str) -> State:
    """Inverse of ``state_to_text``."""
    return loads(base64.b64decode(text))


def _encode(value: Any, blobs: list[bytes]) -> Any:
    if isinstance(value, dict):
        return ["d", {str(k): _encode(v, blobs) for k, v in value.items()}]
    if isinstance(value, np.ndarray):
        return _encode_array(value, blobs)
    if isinstance(value, bool | np.bool_):
        return ["b", bool(value)]
    if isinstance(value, int | np.integer):
        return ["i", hex(int(value))]
    if isinstance(value, float | np.floating):
        return ["f", float(value).hex()]
    if value is None or isinstance(value, str):
        return ["s", value]
    raise TypeError(f"a metric state holds numbers, arrays and dicts, not {type(value).__name__}")


def _encode_array(array: npt.NDArray[Any], blobs: list[bytes]) -> Any:
    if array.dtype == object:
        return ["o", list(array.shape), [hex(int(v)) for v in array.ravel()]]
    if array.dtype.kind not in "biuf":
        raise TypeError(f"a metric state cannot hold arrays of dtype {array.dtype}")
    stored = _compact_dtype(array)
    data = np.ascontiguousarray(array, dtype=stored).tobytes()
    blobs.append(data)
    return ["a", array.dtype.str, stored.str, list(array.shape), len(data)]


def _compact_dtype(array: npt.NDArray[Any]) -> np.dtype[Any]:
    """The smallest unsigned dtype for non-negative integer arrays (counts)."""
    if array.dtype.kind not in "iu" or array.size == 0 or array.min() < 0:
        return array.dtype.newbyteorder("<")
    return np.min_scalar_type(int(array.max())).newbyteorder("<")


class _Reader:
    """Walks a decoded header, taking array bytes from the blob in order."""

    def __init__(self, blob: memoryview) -> None:
        self.blob = blob
        self.offset = 0

    def read(self, node: Any) -> Any:
        tag, *rest = node
        if tag == "d":
            return {key: self.read(child) for key, child in rest[0].items()}
        if tag == "a":
            return self.array(*rest)
        if tag == "o":
            return np.array([int(v, 16) for v in rest[1]], dtype=object).reshape(rest[0])
        return _SCALARS[tag](rest[0])

    def array(self, dtype: str, stored: str, shape: list[int], size: int) -> npt.NDArray[Any]:
        chunk = self.blob[self.offset : self.offset + size]
        self.offset += size
        flat = np.frombuffer(chunk, dtype=np.dtype(stored))
        return flat.astype(np.dtype(dtype)).reshape(shape)


_SCALARS: dict[str, Callable[[Any], Any]] = {
    "b": bool,
    "i": lambda v: int(v, 16),
    "f": float.fromhex,
    "s": lambda v: v,
}
