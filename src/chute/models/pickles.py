"""Untrusted artifacts: pickle and joblib files run code when they are loaded.

Loading a pickle executes whatever the file says (``os.system`` included), so chute loads
one only when the job says it trusts the file: ``trust_pickle: true`` in the model's
options, ``adapter(..., trust_pickle=True)``, or ``chute run --trust-pickle``. The check
runs when the job is planned (``chute validate`` too), before anything is loaded.

>>> is_pickle("model.joblib")
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from chute.errors import ConfigError

PICKLE_SUFFIXES = (".pkl", ".pickle", ".pck", ".joblib", ".jbl", ".sav")
"""Names that say "pickle" (``model.joblib.gz`` counts: the suffix may precede another)."""
SAFE_SUFFIXES = (".safetensors", ".onnx", ".skops", ".keras", ".json", ".ubj", ".txt")
"""Formats that never hold a pickle of their own: a file so named is still sniffed, since a
name proves nothing (a pickle renamed ``model.skops`` is refused)."""
_ZIP = (b"PK\x03\x04", b"PK\x05\x06")
"""skops and Keras files are zip archives."""
SAFE_FORMATS = (
    "skops (.skops) for scikit-learn, ONNX (.onnx), native booster files (XGBoost .json/.ubj, "
    "LightGBM .txt), safetensors (.safetensors) or TorchScript (.pt from torch.jit.save)"
)
_COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ", b"\x5d\x00\x00", b"\x04\x22\x4d\x18")
"""gzip, bz2, xz, lzma and lz4 headers: how joblib writes a compressed pickle."""


def trusts_pickle(options: Mapping[str, Any]) -> bool:
    """Whether the model's options opt in to loading pickles."""
    value = options.get("trust_pickle", False)
    if not isinstance(value, bool):
        raise ConfigError(f"trust_pickle must be true or false, got {value!r}.")
    return value


def is_pickle(path: str) -> bool:
    """Whether ``path`` is (or may be) a pickle: by its name, else by its first bytes."""
    name = os.path.basename(path).lower()
    if any(f"{suffix}." in name or name.endswith(suffix) for suffix in PICKLE_SUFFIXES):
        return True
    if "://" in path or not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        head = f.read(16)
    if _own_header(name, head):
        return False
    return _pickle_header(head) or head.startswith(_COMPRESSED) or _zlib_header(head)


def _own_header(name: str, head: bytes) -> bool:
    """Whether a safe format's file starts as that format does (safetensors: an 8-byte
    header length, then its JSON header; skops and Keras: a zip archive)."""
    if name.endswith((".skops", ".keras")):
        return head.startswith(_ZIP)
    return name.endswith(".safetensors") and head[8:9] == b"{"


def _pickle_header(head: bytes) -> bool:
    """Protocol 2+ pickles start with PROTO n; 4 and 5 then open a FRAME."""
    if len(head) < 3 or head[0] != 0x80:
        return False
    return (head[1] in (4, 5) and head[2] == 0x95) or (head[1] in (2, 3) and head[2] != 0)


def _zlib_header(head: bytes) -> bool:
    """joblib's zlib compression: a raw zlib stream (0x78 and one of zlib's level bytes)."""
    return len(head) >= 2 and head[0] == 0x78 and head[1] in (0x01, 0x5E, 0x9C, 0xDA)


def refuse_untrusted(kind: str, path: str, options: Mapping[str, Any]) -> None:
    """Raise unless ``path`` is not a pickle or the job trusts pickles."""
    if not trusts_pickle(options) and is_pickle(path):
        raise untrusted_error(kind, path)


def untrusted_error(kind: str, path: str) -> ConfigError:
    """The refusal: the risk, the safe formats, and how to opt in."""
    return ConfigError(
        f"model artifact {path!r} ({kind}) is a pickle/joblib file, and loading a pickle runs "
        "arbitrary code from the file (it can execute any command on this machine), so chute "
        f"does not load it unless told to trust it. Prefer a safe format: {SAFE_FORMATS}. If "
        "you made this file or trust its source, set trust_pickle: true in the model's options "
        "(adapter(..., trust_pickle=True) in Python) or pass --trust-pickle to chute run / "
        "chute validate."
    )


def load_pickle(kind: str, path: str, options: Mapping[str, Any]) -> Any:
    """Load a pickle or joblib file the job trusts (joblib reads plain pickles too)."""
    if not trusts_pickle(options):
        raise untrusted_error(kind, path)
    import joblib

    return joblib.load(path)
