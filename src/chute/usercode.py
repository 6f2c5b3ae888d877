"""User code named by a string: ``"package.module:name"`` or ``"path/to/file.py:name"``.

Models, preprocess functions and custom metrics can all be named this way (in YAML they
must be). A file is executed once per process, under a lock, because replica threads
resolve the same model at once; a module that raised is never cached half-run.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
from typing import Any

from chute.errors import ConfigError, ModelError


def import_string(target: str) -> Any:
    """Load ``"pkg.module:attr"`` or ``"path/to/file.py:attr"``."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"cannot import {target!r}: write it as 'package.module:name' or 'file.py:name'."
        )
    try:
        module = _import_module(module_name)
    except (ImportError, OSError) as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {target!r}): {exc}") from exc
    except Exception as exc:
        raise ModelError(
            f"importing {module_name!r} (from {target!r}) raised {type(exc).__name__}: {exc}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}.") from exc


def add_code_dir(path: str) -> None:
    """Let ``module:name`` targets import modules from ``path`` (a job's own directory)."""
    if path not in sys.path:
        sys.path.append(path)  # never ahead of installed packages


_IMPORT_LOCK = threading.Lock()
"""Replica threads resolve the same model file at once: only one may execute it."""


def _import_module(name: str) -> Any:
    if not name.endswith(".py"):
        return importlib.import_module(name)
    with _IMPORT_LOCK:
        return _import_file(os.path.abspath(name))


def _import_file(path: str) -> Any:
    mod_name = os.path.splitext(os.path.basename(path))[0]
    if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == path:
        return sys.modules[mod_name]
    directory = os.path.dirname(path)
    if directory not in sys.path:
        sys.path.append(directory)  # for its sibling modules; never ahead of installed ones
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"no Python module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]  # like importlib: never cache a half-run module
        raise
    return module


def resolve(fn: Any) -> Any:
    """The user's function, class or callable object, importing it if named by string."""
    return import_string(fn) if isinstance(fn, str) else fn
