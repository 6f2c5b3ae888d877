"""What determines a job's output, as plain data, and its fingerprint: a changed model,
argument, artifact or source file makes another job (a resume refuses it, naming what
changed)."""

from __future__ import annotations

import contextvars
import functools
import hashlib
import inspect
import json
import marshal
import os
import re
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chute.job.spec import Model


def fingerprint_of(description: Mapping[str, Any]) -> str:
    """The fingerprint of a job's :meth:`JobSpec.describe` (computed once per run: describing
    hashes in-memory data and constructor arguments)."""
    blob = json.dumps(description, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def metric_code(metric: Any) -> Any:
    """The user's own class inside a (sliced, adapted) metric: its code is what counts."""
    for attribute in ("metric", "inner"):  # Sliced wraps a metric; Custom adapts an object
        if type(metric).__module__.startswith("chute.") and hasattr(metric, attribute):
            return metric_code(getattr(metric, attribute))
    return metric


def describe_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """What differs between two :meth:`JobSpec.describe` results, naming the model, field
    and source file: ``models[0].fn (model.py), carryover``."""
    changes: list[str] = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if key == "code" and isinstance(old, Mapping) and isinstance(new, Mapping):
            code = _code_changes(old, new)
            if _count(before.get("models")) != _count(after.get("models")):
                # models added or removed: their parts, by index, are other models' now
                code = [c for c in code if not c.startswith("models[")]
            changes += code
        elif key == "models" and isinstance(old, list) and isinstance(new, list):
            changes += _model_changes(old, new)
        elif key == "source" and isinstance(old, Mapping) and isinstance(new, Mapping):
            changes.append(_source_changes(old, new))
        elif key == "text_version":
            if before.get("format") != after.get("format"):
                continue  # parquet → jsonl: the format's change says it
            changes.append(
                "the way chute writes durations and nested times to CSV and JSON Lines (the "
                "output was begun by an earlier chute)"
            )
        else:
            changes.append(key)
    named = [c for c in changes if not any(o.startswith(f"{c} (") for o in changes)]
    if named and _text(before) == _legacy(after) != _text(after):
        return (
            "none that can be told: an earlier chute kept arguments over 200 characters by "
            "their length only (a prompt, a long list), so whether they changed cannot be "
            "checked. Finish the output with that chute, or start it again with --overwrite"
        )
    return ", ".join(named) or "the job description"


_DIGESTED = re.compile(r"(@\d+)#[0-9a-f]{16}")
"""A long argument's description (:func:`_digest`); an earlier chute wrote ``str@290``."""


def _text(description: Mapping[str, Any]) -> str:
    return json.dumps(description, sort_keys=True, default=str)


def _legacy(description: Mapping[str, Any]) -> str:
    """``description`` as an earlier chute wrote it: long arguments by their length only."""
    return _DIGESTED.sub(r"\1", _text(description))


def _count(models: Any) -> int | None:
    return len(models) if isinstance(models, list) else None


def _code_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``models[0].fn (model.py, helpers.py)``: each part whose source files differ."""
    changes = []
    for part in sorted(set(old) & set(new)):  # one on one side only: a model added or removed
        files_old, files_new = old.get(part) or {}, new.get(part) or {}
        files = sorted(f for f in {*files_old, *files_new} if files_old.get(f) != files_new.get(f))
        if files:
            changes.append(f"{part} ({', '.join(files)})")
    return changes


def _source_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """``source (2 files added: a.parquet, b.parquet; 1 changed: c.parquet)`` for file
    sources (their ``files``: ``[path, size, mtime]``), else ``source``."""
    before, after = old.get("files"), new.get("files")
    if not isinstance(before, list) or not isinstance(after, list):
        return "source"
    was = {str(f[0]): f[1:] for f in before if isinstance(f, list) and f}
    now = {str(f[0]): f[1:] for f in after if isinstance(f, list) and f}
    kinds = {
        "added": sorted(set(now) - set(was)),
        "removed": sorted(set(was) - set(now)),
        "changed": sorted(f for f in set(was) & set(now) if was[f] != now[f]),
    }
    moved = _moved(was, now)
    if moved:  # the same files under another folder: say so, not "added" and "removed"
        kinds["added"] = kinds["removed"] = []
    said = [
        f"{len(files):,} file{'s' * (len(files) != 1)} {kind}: "
        + ", ".join(f.rsplit("/", 1)[-1] for f in files[:3])
        + (", ..." if len(files) > 3 else "")
        for kind, files in kinds.items()
        if files
    ]
    rest = sorted(k for k in set(old) | set(new) if k != "files" and old.get(k) != new.get(k))
    said = [moved] if moved else said
    return f"source ({'; '.join(said + rest)})" if said or rest else "source"


def _moved(was: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """``the input moved from /a/data to /b/data``: where every file of the input is now
    under another folder, with the same name below it, size and time (a project folder
    moved or mounted elsewhere: ``mv`` keeps them; another day's files have others)."""
    removed, added = sorted(set(was) - set(now)), sorted(set(now) - set(was))
    if not removed or not len(removed) == len(was) == len(added) == len(now):
        return ""
    if len(removed) == 1:
        before, after = os.path.dirname(removed[0]), os.path.dirname(added[0])
    else:
        before, after = os.path.commonpath(removed), os.path.commonpath(added)
    if before == after or any(
        r[len(before) :] != a[len(after) :] or was[r] != now[a]
        for r, a in zip(removed, added, strict=True)
    ):
        return ""
    return f"the input moved from {before} to {after}: a job's files are named by where they are"


def _model_changes(old: list[Any], new: list[Any]) -> list[str]:
    """``models[1].kwargs``: each field of each model that differs."""
    if not all(isinstance(m, Mapping) for m in [*old, *new]):
        return ["models"]
    if len(old) != len(new):  # ``models (1 added: n)``
        was, now = [m.get("name") for m in old], [m.get("name") for m in new]
        said = [
            f"{len(names):,} {kind}: {', '.join(map(str, names))}"
            for kind, names in (
                ("added", [n for n in now if n not in was]),
                ("removed", [n for n in was if n not in now]),
            )
            if names
        ]
        return [f"models ({'; '.join(said)})" if said else "models"]
    return [
        f"models[{i}].{field}" + (_held(a.get(field), b.get(field)) if field == "state" else "")
        for i, (a, b) in enumerate(zip(old, new, strict=True))
        for field in sorted(set(a) | set(b))
        if a.get(field) != b.get(field)
    ]


def _held(old: Any, new: Any) -> str:
    """`` (what the model object holds: coef_, intercept_)``: the attributes that differ."""
    if old is None and new is not None:
        return (
            " (what the model object holds: the output was begun with the model given as "
            "a class or name, or by an earlier chute, which did not record it, so whether it "
            "changed cannot be told. Finish the output as it was begun, or start it again "
            "with --overwrite)"
        )
    named = ""
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
        named = (
            ": " + ", ".join(keys[:5]) + (f" and {len(keys) - 5:,} more" if len(keys) > 5 else "")
        )
    return (
        f" (what the model object holds{named}; its weights, fitted values or the values its "
        "function captured. If it only ran since, a model that loads or caches on its first "
        "call, build it afresh before running the job again)"
    )


def fn_name(fn: Any) -> str:
    """The function's import name and a hash of its code, so an edited model is a new job."""
    if isinstance(fn, str):
        return fn
    if type(fn).__name__ == "AdapterSpec":
        return _adapter_name(fn)
    named = isinstance(fn, type) or (callable(fn) and hasattr(fn, "__qualname__"))
    target = fn if named else type(fn)
    name = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
    return f"{name}#{_code_hash(target)}"


_NOT_OUTPUT = frozenset({"trust_pickle"})
"""Adapter options that permit a load but cannot change a prediction: not in the fingerprint."""


def _adapter_name(spec: Any) -> str:
    """A built-in adapter: its kind, options and the identity of the artifacts it loads."""
    from chute.artifacts import identity

    options = {k: _short_repr(v) for k, v in sorted(spec.options.items()) if k not in _NOT_OUTPUT}
    artifacts = [identity(path) for path in spec.load_class(check=False).artifacts(spec.options)]
    blob = json.dumps([options, artifacts], sort_keys=True).encode()
    return f"adapter:{spec.kind}#{hashlib.sha256(blob).hexdigest()[:12]}"


def _code_hash(target: Any) -> str:
    """Hash the bytecode of a function, or of every function a class defines."""
    codes = (
        [target.__code__]
        if hasattr(target, "__code__")
        else [
            member.__code__
            for klass in getattr(target, "__mro__", ())[:-1]
            for member in vars(klass).values()
            if hasattr(member, "__code__")
        ]
    )
    digest = hashlib.sha256()
    for code in codes:
        digest.update(marshal.dumps(code))
    return digest.hexdigest()[:12]


def describe_model(model: Model) -> dict[str, Any]:
    described = {
        "name": model.name,
        "fn": fn_name(model.fn),
        "inputs": list(model.inputs) if model.inputs is not None else None,
        "batch_format": model.batch_format,
        "on_error": model.on_error,
        "args": [_short_repr(a) for a in model.args],
        "kwargs": {k: _short_repr(v) for k, v in sorted(model.kwargs.items())},
    }
    state = fn_state(model.fn)
    if state is not None:  # absent where the code is all: a job an earlier chute began
        described["state"] = state
    return described


def fn_state(fn: Any) -> dict[str, str] | str | None:
    """What a model given as a Python object holds beside its code: an instance's
    attributes (a fitted estimator's coefficients, a module's weights), the values a
    closure captured, a ``functools.partial``'s function and arguments, the object a bound
    method belongs to, a function's default arguments. Its code alone (:func:`fn_name`)
    is the same for a model trained again: a resume mixed the two models' rows. ``None``
    for a name, a class (built from ``args`` and ``kwargs``) and a built-in adapter."""
    if isinstance(fn, (str, type)) or type(fn).__name__ == "AdapterSpec":
        return None
    if isinstance(fn, functools.partial):
        return _short_repr([fn_name(fn.func), fn_state(fn.func), fn.args, fn.keywords])
    if inspect.ismethod(fn):
        return _attributes(fn.__self__)
    if inspect.isfunction(fn):
        held = {
            "closure": [_cell(c) for c in fn.__closure__ or ()],
            "defaults": list(fn.__defaults__ or ()),
            "kwdefaults": fn.__kwdefaults__ or {},
        }
        return _short_repr(held) if any(held.values()) else None
    return _attributes(fn) if _stateful(fn) else None


def _attributes(value: Any) -> dict[str, str] | str:
    """An object's state attribute by attribute (a torch module's weight by weight), so
    that a refusal can name what changed: ``models[0].state (coef_)``."""
    state = _state(value) if _stateful(value) else None
    if not isinstance(state, Mapping):
        return _short_repr(value)
    return {str(k): _short_repr(v, 1, frozenset({id(value)}), held=True) for k, v in state.items()}


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # a cell not yet filled
        return None


def describe_metric(metric: Any) -> dict[str, Any]:
    """A metric as plain data: its type and every option it was built with (a threshold,
    bins, ``k``; a wrapped metric's own), so that a resume after one changed is another
    job, not old states merged with new ones."""
    options = {
        k: describe_metric(v) if _metric_like(v) else _short_repr(v)
        for k, v in sorted(vars(metric).items())
    }
    return {"type": f"{type(metric).__module__}.{type(metric).__qualname__}", **options}


def _metric_like(value: Any) -> bool:
    """A metric inside a metric (``Sliced``'s, a custom one's object)."""
    has = [callable(getattr(value, name, None)) for name in ("init", "merge")]
    return hasattr(value, "__dict__") and all(has)


HASHED_ARRAY_BYTES = 64 * 2**20
"""Arrays and tensors in constructor arguments and model objects up to this size are
hashed whole (a state dict's weights); of bigger ones, this many bytes evenly spaced."""


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
"""``<Foo object at 0x7f...>``: an address, new in every process, is no part of a value."""


STATE_DEPTH = 12
"""How deep an object's attributes are described (an estimator inside a pipeline inside a
model object: each object and each mapping a level); deeper ones by their ``repr``."""


def _short_repr(
    value: Any, depth: int = 0, within: frozenset[int] = frozenset(), held: bool = False
) -> str:
    """A cheap description of a constructor argument or a model object: small arrays,
    tables and frames by content, big ones by shape, mappings and sequences item by item,
    other objects by their state (what pickling them keeps: a fitted estimator's
    coefficients, a torch module's weights, a booster's model bytes). A long text or list
    is kept as a hash of its content: never its length alone, or a prompt edited to one of
    the same length would resume an output that the old prompt began.

    ``held``: inside an object's state, where a mapping's order is the object's (a dict
    built from a set differs between processes): sorted there, not in arguments, whose
    description an earlier chute kept in their order."""
    inner = functools.partial(_short_repr, depth=depth + 1, within=within | {id(value)}, held=held)
    if id(value) in within:  # an object that holds itself, through its attributes
        return f"<{type(value).__qualname__} itself>"
    if held and isinstance(value, (list, tuple, Mapping)) and len(value) > 1000 and _plain(value):
        ordered = (
            sorted(value.items(), key=lambda i: repr(i[0]))
            if held and isinstance(value, Mapping)
            else value
        )
        return _digest(value, repr(ordered))  # at C speed
    if isinstance(value, Mapping):
        items = sorted(value.items(), key=lambda i: repr(i[0])) if held else value.items()
        return "{" + ", ".join(f"{k!r}: {inner(v)}" for k, v in items) + "}"
    if isinstance(value, (list, tuple)):
        text = "[" + ", ".join(inner(v) for v in value) + "]"
        return text if len(value) <= 1000 else _digest(value, text)
    if isinstance(value, (set, frozenset)):  # sorted: their order is the process's hash seed
        text = "{" + ", ".join(sorted(inner(v) for v in value)) + "}"
        return text if len(value) <= 1000 and len(text) <= 200 else _digest(value, text)
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) > 64:
        digest = hashlib.blake2b(value, digest_size=8).hexdigest()
        return f"{type(value).__name__}@{len(value)}#{digest}"
    if (dims := _dims(value)) is not None:
        return f"{type(value).__name__}{dims}:{getattr(value, 'dtype', '')}{_content(value)}"
    if depth < STATE_DEPTH and _stateful(value) and (state := _state(value)) is not None:
        name = f"{type(value).__module__}.{type(value).__qualname__}"
        text = f"{name}({_short_repr(state, depth + 1, within | {id(value)}, held=True)})"
        return text if len(text) <= 200 else _digest(value, text)
    text = _ADDRESS.sub("", repr(value))
    return text if len(text) <= 200 else _digest(value, text)


_PRIMITIVE = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    """A long list of texts and numbers, or a mapping of them (a vocabulary): described
    by its ``repr`` at once, not item by item (5 million texts took 30 s)."""
    if isinstance(value, Mapping):
        return all(type(k) in _PRIMITIVE and type(v) in _PRIMITIVE for k, v in value.items())
    return all(type(v) in _PRIMITIVE for v in value)


def _dims(value: Any) -> tuple[Any, ...] | None:
    """An array's, tensor's, table's or frame's shape; ``None`` for anything else (a class
    such as ``np.ndarray`` has a ``shape`` too: a descriptor)."""
    shape = None if isinstance(value, type) else getattr(value, "shape", None)
    try:
        return None if shape is None or callable(shape) else tuple(shape)
    except TypeError:
        return None


def _stateful(value: Any) -> bool:
    """An object whose attributes are its state: not a module, class, function or method
    (those are described by name; a function's code is hashed apart), nor a part of the
    process that runs it (:data:`_RUNTIME`)."""
    plain = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    if isinstance(value, (*plain, types.MethodType)) or not hasattr(value, "__dict__"):
        return False
    return type(value).__module__.split(".")[0] not in _RUNTIME


_RUNTIME = frozenset(
    {"logging", "threading", "concurrent", "queue", "socket", "ssl", "selectors", "asyncio"}
    | {"multiprocessing", "subprocess", "io", "_io", "_thread", "weakref", "tempfile", "ray"}
)
"""Modules whose objects belong to the process, not the model: a logger (through it, the
process's every logger), a thread pool (named by how many the process made before), a
lock, a file, a Ray handle. Described by their ``repr``, addresses left out."""


def _state(value: Any) -> Any:
    """What pickling ``value`` keeps (``__getstate__``: a booster's model bytes in place
    of its native handle, an estimator's attributes and version), else its attributes;
    a torch module's ``state_dict()`` (every weight, however deep the module); ``None``
    when none can be had. Left out: an attribute named as an id that holds a memory
    address (scikit-learn's ``_stop_words_id``), new in every process."""
    if _torch_module(value):
        try:
            return dict(value.state_dict())
        except Exception:  # a module that cannot list its weights: its attributes
            pass
    if type(value).__module__.startswith("tokenizers") and callable(getattr(value, "to_str", None)):
        settings = json.loads(value.to_str())  # a Rust tokenizer: its vocabulary and rules,
        return {k: v for k, v in settings.items() if k not in ("padding", "truncation")}
    try:
        state = value.__getstate__()
    except Exception:  # an object that refuses to be pickled: its attributes say most
        state = None
    if state is None or state is value:
        state = getattr(value, "__dict__", None)
    if isinstance(state, Mapping):
        kept = {k: v for k, v in state.items() if not _address(k, v)}
        return dict(sorted(kept.items(), key=lambda item: str(item[0])))
    return state


def _torch_module(value: Any) -> bool:
    """A ``torch.nn.Module`` (a transformers or sentence-transformers model too): its
    weights are what it holds. Its attributes are not: ``training`` flips when it runs,
    and a generation config keeps ``hash()`` of a text, new in every process."""
    return any(
        k.__module__ == "torch.nn.modules.module" and k.__qualname__ == "Module"
        for k in type(value).__mro__
    )


def _address(key: Any, value: Any) -> bool:
    """An attribute such as ``_stop_words_id = id(self.stop_words)``: an address."""
    named = isinstance(key, str) and key.lower().endswith("id")
    return named and type(value) is int and value >= 2**32


def _digest(value: Any, text: str) -> str:
    """``str@290#<hash>``: a long description, kept short."""
    digest = hashlib.blake2b(text.encode(errors="surrogatepass"), digest_size=8).hexdigest()
    return f"{type(value).__name__}@{len(text)}#{digest}"


def _content(array: Any) -> str:
    """``#<hash>`` of an array's, tensor's, Arrow table's or pandas frame's content when it
    is small enough, else ``""``."""
    import numpy as np

    nbytes = getattr(array, "nbytes", None)
    if type(array).__module__.startswith("pandas") and hasattr(array, "memory_usage"):
        nbytes = int(np.sum(array.memory_usage(deep=True)))  # a frame has no nbytes
    if isinstance(array, np.ndarray) and array.dtype.hasobject:  # texts (feature names)
        if array.size > 100_000:
            return ""
        items = ", ".join(_short_repr(item) for item in array.ravel().tolist())
        return (
            "#" + hashlib.blake2b(items.encode(errors="surrogatepass"), digest_size=8).hexdigest()
        )
    left = _HASHED.get()
    big = isinstance(nbytes, int) and nbytes > min(HASHED_ARRAY_BYTES, left)
    if big and (isinstance(array, np.ndarray) or hasattr(array, "detach")):
        return _sampled(array, HASHED_ARRAY_BYTES if left >= HASHED_ARRAY_BYTES else 2**20)
    if isinstance(nbytes, int):
        _HASHED.set(left - nbytes)
    if not isinstance(nbytes, int) or nbytes > HASHED_ARRAY_BYTES:
        return ""
    if type(array).__module__.startswith("pandas"):
        import pandas as pd

        digest = hashlib.blake2b(digest_size=8)
        labels = getattr(array, "dtypes", getattr(array, "dtype", None))
        digest.update(repr(labels).encode())
        try:
            digest.update(pd.util.hash_pandas_object(array).to_numpy().tobytes())
        except TypeError:  # cells no hash takes (lists): described by shape only
            return ""
        return "#" + digest.hexdigest()
    if type(array).__module__.startswith("pyarrow"):
        import pyarrow as pa

        sink = pa.BufferOutputStream()
        table = array if isinstance(array, pa.Table) else pa.table({"": array})
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return "#" + hashlib.blake2b(sink.getvalue(), digest_size=8).hexdigest()
    if hasattr(array, "detach"):
        import torch  # a torch tensor: its raw bytes (NumPy has no bfloat16)

        array = array.detach().cpu().contiguous().flatten().view(torch.uint8).numpy()
    elif not isinstance(array, np.ndarray):
        return ""
    raw = np.ascontiguousarray(array).view(np.uint8)
    return "#" + hashlib.blake2b(raw.data, digest_size=8).hexdigest()


HASHED_BYTES = 256 * 2**20
"""Bytes of arrays and tensors hashed whole in one job's description; past them, each is
hashed by 1 MiB of its bytes, every n-th (training changes every weight of a layer it
trains): a 14 GB model's weights cost about a second, not 25."""

_HASHED: contextvars.ContextVar[int] = contextvars.ContextVar("hashed", default=HASHED_BYTES)
"""What is left of :data:`HASHED_BYTES` while one job is described (:func:`describing`)."""


def describing() -> contextvars.Token[int]:
    """Start describing a job: the whole of :data:`HASHED_BYTES` is left again."""
    return _HASHED.set(HASHED_BYTES)


def _sampled(array: Any, limit: int = HASHED_ARRAY_BYTES) -> str:
    """``#~<hash>`` of every n-th byte of a big array or tensor, ``limit`` bytes in all
    (taken where the tensor is: a GPU copies that much, not the whole): an 800 MB table or
    a model's weights trained again are another job, at the cost of hashing 64 MiB. A
    change confined to the bytes between those taken is not seen."""
    import numpy as np

    if hasattr(array, "detach"):
        import torch

        flat = array.detach().contiguous().reshape(-1).view(torch.uint8)
        raw = flat[:: -(-flat.numel() // limit)].cpu().numpy()
    else:
        flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        raw = np.ascontiguousarray(flat[:: -(-flat.size // limit)])
    return "#~" + hashlib.blake2b(raw.data, digest_size=8).hexdigest()
