"""User code named by a string: ``"package.module:name"`` or ``"path/to/file.py:name"``.

Models, preprocess functions and custom metrics can all be named this way (in YAML they
must be). A file is executed once per process, under a lock, because replica threads
resolve the same model at once; a module that raised is never cached half-run.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import pkgutil
import sys
import threading
from typing import Any

from chute.errors import ConfigError, ModelError, did_you_mean

HOW_FN_RESOLVES = (
    "A target is 'module:name', the module imported from sys.path (installed packages, and "
    "the job file's directory), or 'file.py:name', a file relative to the job file."
)


def import_string(target: str) -> Any:
    """Load ``"pkg.module:attr"`` or ``"path/to/file.py:attr"``."""
    module_name, sep, attr = target.rpartition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"cannot import {target!r}: write it as 'package.module:name' or 'file.py:name'."
        )
    try:
        module = _import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(_not_found(module_name, target, exc)) from exc
    except FileNotFoundError as exc:
        raise ConfigError(
            f"cannot import {target!r}: the file {module_name} does not exist."
            f"{_near_file(module_name)} {HOW_FN_RESOLVES}"
        ) from exc
    except (ImportError, OSError) as exc:
        raise ConfigError(f"cannot import {module_name!r} (from {target!r}): {exc}") from exc
    except ConfigError:
        raise
    except (Exception, SystemExit) as exc:  # sys.exit() at import: it raised
        raise ModelError(
            f"importing {module_name!r} (from {target!r}) raised {type(exc).__name__}: {exc}"
            f"{user_frame(exc)}"
        ) from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        names = _own_names(module)
        raise ConfigError(
            f"module {module_name!r} (from {target!r}) has no attribute {attr!r}."
            f"{did_you_mean(attr, names)} Its names: {', '.join(names[:20])}"
            f"{', …' if len(names) > 20 else ''}."
        ) from exc


def _not_found(module_name: str, target: str, exc: ModuleNotFoundError) -> str:
    """The module itself is not on sys.path (did you mean …?), or it imports a missing one."""
    missing = exc.name or ""
    if missing and missing not in _with_parents(module_name):
        return (
            f"importing {module_name!r} (from {target!r}) failed: it imports {missing!r}, "
            f"which is not installed here ({exc}). Install it, or fix the import."
        )
    missing = missing or module_name
    parent = missing.rpartition(".")[0]
    near = [f"{parent}.{name}" if parent else name for name in _modules_in(parent)]
    return (
        f"cannot import {target!r}: no module named {missing!r} on sys.path."
        f"{did_you_mean(missing, near, cutoff=0.8)} {HOW_FN_RESOLVES}"
    )


def _own_names(module: Any) -> list[str]:
    """The public names ``module`` defines (not the modules and names it imports)."""
    own = module.__name__
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, type(sys))
        and getattr(value, "__module__", own) in (own, None)
        and not (callable(value) and getattr(value, "__module__", None) != own)
    ]


def _modules_in(package: str) -> list[str]:
    """Module names importable at the top level, or inside ``package``."""
    if not package:
        return [m.name for m in pkgutil.iter_modules()]
    try:
        path = importlib.import_module(package).__path__
    except (ImportError, AttributeError):
        return []
    return [m.name for m in pkgutil.iter_modules(path)]


def _near_file(path: str) -> str:
    """`` Did you mean '/job/model.py'?`` over the Python files beside ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".py")]
    except OSError:
        return ""
    hint = did_you_mean(os.path.basename(path), names)
    return hint.replace("'", f"'{folder}{os.sep}", 1) if hint else ""


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


def user_frame(exc: BaseException) -> str:
    """`` (at model.py:12 in helper)``: the innermost line of the user's own code in the
    traceback of ``exc`` (not the standard library's, an installed package's or chute's),
    for an error message; "" when there is none."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not _installed(f.filename)]
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno} in {last.name})"


def _python_or_installed(module: Any) -> bool:
    """Whether ``module`` is Python's own or an installed package's (not the user's code)."""
    where = getattr(module, "__file__", None)
    return where is None or _installed(where)  # no file: built into the interpreter


def _import_file(path: str) -> Any:
    mod_name = os.path.splitext(os.path.basename(path))[0]
    if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == path:
        return sys.modules[mod_name]
    taken = mod_name in sys.modules and _python_or_installed(sys.modules[mod_name])
    if taken or mod_name in sys.stdlib_module_names:
        # imported under its name, it would replace that module for everything in this
        # process (chute's own json, a library's tokenize)
        raise ConfigError(
            f"the file {path!r} is named like the module {mod_name!r}, which Python already "
            f"has: rename the file (such as my_{mod_name}.py) and the fn: that names it."
        )
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


def forget_interrupted_imports() -> list[str]:
    """Forget the modules an interrupted import left in ``sys.modules``; their names.

    An import that raises (or is interrupted: Ray cancels a running task by raising
    ``KeyboardInterrupt`` in it, wherever it is) drops the package it was running from
    ``sys.modules`` but keeps the submodules that package had finished importing. The
    package's next import then runs against those: Python finds them loaded and never
    sets them as the package's attributes, so ``fsspec/__init__.py`` fails on
    ``fsspec.utils`` ("partially initialized module 'fsspec' has no attribute 'utils'") in
    every later import in that process. A module whose package is not loaded is such a
    leftover (a healthy process has none); forgotten, it is imported afresh with its
    package.
    """
    leftovers = [
        name
        for name in list(sys.modules)
        if any(parent not in sys.modules for parent in _with_parents(name)[:-1])
    ]
    for name in leftovers:
        sys.modules.pop(name, None)
    return leftovers


# -- the source a job's fingerprint covers -------------------------------------------------


def code_files(target: Any) -> dict[str, str]:
    """The source files of user code, as ``{path relative to its code folder: hash}``.

    ``target`` is a function, class or callable object, or a ``"module:name"`` /
    ``"file.py:name"`` string. Its *code folder* is the folder it is imported from (the one
    holding ``file.py``, or the top-level package or module of ``module``). Covered: the
    file that defines the target, the ``__init__.py`` of packages it lives in, and every
    module of the code folder that those files import, directly or through one another
    (read from their import statements, never run). The bytes are hashed, so an edited
    comment counts. Nothing is covered for code in installed packages (site-packages, the
    standard library, chute itself), nor for code without a file (a notebook cell).

    >>> code_files("json:dumps")
    {}
    """
    origin = _origin(target)
    if origin is None:
        return {}
    path, root = origin
    return {
        os.path.relpath(file, root).replace(os.sep, "/"): _file_hash(file)
        for file in sorted(_local_modules(path, root))
    }


def _origin(target: Any) -> tuple[str, str] | None:
    """The file defining ``target`` and its code folder, unless installed or fileless."""
    if not isinstance(target, str):
        return _object_origin(target)
    module, _, _ = target.rpartition(":")
    if not module.endswith(".py"):
        return _module_origin(module)
    path = os.path.abspath(module)
    found = os.path.isfile(path) and not _installed(path)
    return (path, os.path.dirname(path)) if found else None


def _object_origin(target: Any) -> tuple[str, str] | None:
    """Where the module of a function, class or (the class of) an object is."""
    owner = target if isinstance(target, type) or hasattr(target, "__code__") else type(target)
    name = getattr(owner, "__module__", None)
    file = getattr(sys.modules.get(name), "__file__", None) if isinstance(name, str) else None
    if not isinstance(name, str) or not isinstance(file, str) or not os.path.isfile(file):
        return None
    path = os.path.abspath(file)
    root = _root_of(path, 0 if name == "__main__" else name.count("."))
    return None if _installed(path) else (path, root)


def _module_origin(module: str) -> tuple[str, str] | None:
    """Where ``module`` is, found without importing it (nor its packages)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        root = os.path.dirname(os.path.abspath(next(iter(spec.submodule_search_locations))))
    elif spec.origin and os.path.isfile(spec.origin):
        root = os.path.dirname(os.path.abspath(spec.origin))
    else:
        return None  # built in, frozen
    path = _module_file(root, module)
    return None if path is None or _installed(path) else (path, root)


def _root_of(path: str, depth: int) -> str:
    """The folder a module at ``path``, ``depth`` dots deep in its name, is imported from."""
    root = os.path.dirname(path)
    if os.path.basename(path) == "__init__.py":
        root = os.path.dirname(root)
    for _ in range(depth):
        root = os.path.dirname(root)
    return root


def _module_file(root: str, module: str) -> str | None:
    """The file of ``module`` (``a.b`` → ``a/b.py`` or ``a/b/__init__.py``) under ``root``."""
    base = os.path.join(root, *module.split("."))
    for path in (f"{base}.py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _installed(path: str) -> bool:
    """Whether ``path`` belongs to an installed package, the standard library or chute."""
    real = os.path.realpath(path)
    if {"site-packages", "dist-packages"} & set(real.split(os.sep)):
        return True
    return any(_under(real, folder) for folder in _installed_folders())


@functools.cache
def _installed_folders() -> tuple[str, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    folders = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    return tuple(os.path.realpath(f) for f in [*folders, os.path.dirname(__file__)])


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _local_modules(path: str, root: str) -> set[str]:
    """``path``, the packages it lives in, and the modules under ``root`` they import."""
    found: set[str] = set()
    pending = [path]
    while pending:
        file = pending.pop()
        if file in found:
            continue
        found.add(file)
        pending += _packages_of(file, root)
        pending += [m for m in _imports(file, root) if m not in found]
    return found


def _packages_of(path: str, root: str) -> list[str]:
    """The ``__init__.py`` of each package between ``path`` and ``root``."""
    inits = []
    folder = os.path.dirname(path)
    while _under(folder, root) and folder != root:
        init = os.path.join(folder, "__init__.py")
        if os.path.isfile(init):
            inits.append(init)
        folder = os.path.dirname(folder)
    return inits


def _imports(path: str, root: str) -> list[str]:
    """The files under ``root`` that the import statements of ``path`` name."""
    import ast

    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[tuple[str, str]] = []  # (folder to resolve in, dotted module name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(root, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names += _from_names(node, path, root)
    return [
        file
        for folder, name in names
        for module in _with_parents(name)
        if (file := _module_file(folder, module)) is not None and _under(file, root)
    ]


def _from_names(node: Any, path: str, root: str) -> list[tuple[str, str]]:
    """``from a import b`` may import module ``a`` or module ``a.b``; relative ones too."""
    folder = root
    if node.level:
        folder = os.path.dirname(path)
        for _ in range(node.level - 1):
            folder = os.path.dirname(folder)
    module = node.module or ""
    names = [(folder, f"{module}.{a.name}" if module else a.name) for a in node.names]
    return [(folder, module), *names] if module else names


def _with_parents(name: str) -> list[str]:
    """``a.b.c`` → ``a``, ``a.b``, ``a.b.c`` (importing one runs its packages too)."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts)) if parts[i] and parts[i] != "*"]


def check_callable(where: str, target: Any, constructed: bool) -> None:
    """What loading will refuse, said before any compute (``chute validate`` too): a
    target that cannot be called, constructor arguments (``args``/``kwargs``) for what is
    not a class, a class whose instances cannot be called."""
    if isinstance(target, type):
        if not any("__call__" in vars(k) for k in target.__mro__ if k is not object):
            raise ConfigError(
                f"{where}: the class {target.__name__} has no __call__ method: the model's "
                "replicas call an instance of it with each batch. Give it one, or name a "
                "function."
            )
        return
    if constructed:
        raise ConfigError(
            f"{where}: args/kwargs are constructor arguments, but {_shown(target)} is not a "
            "class. Leave them out, or name the class."
        )
    if not callable(target):
        raise ConfigError(
            f"{where}: {_shown(target)} is not callable: name a function or a class (fn: "
            "module:name, or file.py:name)."
        )


def _shown(target: Any) -> str:
    name = getattr(target, "__qualname__", None)
    return f"{type(target).__name__} {name}" if name else repr(target)[:80]


def _file_hash(path: str) -> str:
    import hashlib

    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except PermissionError as exc:
        raise ConfigError(
            f"the model file {path!r} is not readable by this user ({exc.strerror}): make it "
            "readable (chmod), or run as its owner."
        ) from exc
