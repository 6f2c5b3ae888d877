"""Structured output: a JSON Schema, a regular expression or a choice list per job.

vLLM constrains decoding to the structure (``StructuredOutputsParams``); chute then parses
each reply into a typed column, ``<model>_value``. A reply that does not parse — cut short
by ``max_tokens``, or not matching — is that row's error, never the batch's.

    structured: {json: {type: object, properties: {label: {enum: [yes, no]}}}}
    structured: {regex: "[0-9]{3}"}
    structured: {choice: [positive, negative, neutral]}

A JSON Schema decides the column's Arrow type: an object with ``properties`` is a struct,
``string`` (and an ``enum`` of strings) a string, ``integer`` int64, ``number`` float64,
``boolean`` bool, an ``array`` with ``items`` a list; anything else is kept as JSON text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from chute.errors import ConfigError, did_you_mean

KINDS = ("json", "regex", "choice")


@dataclass(frozen=True)
class Structured:
    """The structure every reply of a job (or an OpenAI request) must have."""

    kind: str
    """``json``, ``regex`` or ``choice``."""
    spec: Any
    """The JSON Schema (a mapping), the pattern, or the list of choices."""

    def params(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's ``StructuredOutputsParams``."""
        return {self.kind: self.spec}

    def arrow_type(self) -> pa.DataType:
        """The type of the parsed column."""
        return schema_type(self.spec) if self.kind == "json" else pa.string()

    def parse(self, text: str) -> Any:
        """The reply as a value of :meth:`arrow_type`; ``ValueError`` saying why it is not."""
        if self.kind == "choice":
            if text not in self.spec:
                raise ValueError(f"the reply {_short(text)} is none of the choices {self.spec}")
            return text
        if self.kind == "regex":
            if re.fullmatch(self.spec, text) is None:
                raise ValueError(f"the reply {_short(text)} does not match {self.spec!r}")
            return text
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the reply {_short(text)} is not JSON ({exc.msg})") from None
        check_json(value, self.spec, "$")
        return to_column_value(value, self.spec)


def structured(value: Any) -> Structured | None:
    """The ``structured:`` option: ``{json: schema}``, ``{regex: pattern}`` or
    ``{choice: [...]}`` (exactly one key); ``None`` when it is not given."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or len(value) != 1:
        raise ConfigError(
            f"structured must have exactly one of {', '.join(KINDS)}, got {value!r}; e.g. "
            "structured: {choice: [yes, no]}."
        )
    ((kind, spec),) = value.items()
    if kind not in KINDS:
        raise ConfigError(
            f"structured: unknown kind {kind!r}.{did_you_mean(str(kind), KINDS)} "
            f"Give one of {', '.join(KINDS)}."
        )
    _check_spec(str(kind), spec)
    return Structured(str(kind), _frozen(spec))


def _check_spec(kind: str, spec: Any) -> None:
    if kind == "json" and not isinstance(spec, Mapping):
        raise ConfigError(f"structured: json must be a JSON Schema (a mapping), got {spec!r}.")
    if kind == "regex":
        if not isinstance(spec, str):
            raise ConfigError(f"structured: regex must be a string, got {spec!r}.")
        try:
            re.compile(spec)
        except re.error as exc:
            raise ConfigError(f"structured: regex {spec!r} does not compile: {exc}.") from None
    if kind == "choice" and (
        not isinstance(spec, (list, tuple)) or not spec or not all(isinstance(c, str) for c in spec)
    ):
        raise ConfigError(f"structured: choice must be a list of strings, got {spec!r}.")


def _frozen(spec: Any) -> Any:
    """Plain JSON data (lists, dicts): what vLLM and ``json.dumps`` take."""
    return json.loads(json.dumps(spec))


def schema_type(schema: Mapping[str, Any]) -> pa.DataType:
    """The Arrow type of values that follow ``schema`` (JSON text where none fits)."""
    kind = schema.get("type")
    if "enum" in schema and all(isinstance(v, str) for v in schema["enum"]):
        return pa.string()
    if kind == "object" and isinstance(schema.get("properties"), Mapping):
        props = schema["properties"]
        return pa.struct([pa.field(str(k), schema_type(v)) for k, v in props.items()])
    if kind == "array" and isinstance(schema.get("items"), Mapping):
        return pa.list_(schema_type(schema["items"]))
    simple = {"string": pa.string(), "integer": pa.int64(), "number": pa.float64()}
    simple["boolean"] = pa.bool_()
    return simple.get(str(kind), pa.string())


def to_column_value(value: Any, schema: Mapping[str, Any]) -> Any:
    """A parsed JSON value shaped for :func:`schema_type` (JSON text where it has no type)."""
    kind = schema_type(schema)
    if pa.types.is_struct(kind):
        props = schema["properties"]
        return {k: to_column_value(value.get(k), v) for k, v in props.items()}
    if pa.types.is_list(kind):
        return None if value is None else [to_column_value(v, schema["items"]) for v in value]
    if pa.types.is_string(kind) and not isinstance(value, str) and value is not None:
        return json.dumps(value)
    return value


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def check_json(value: Any, schema: Mapping[str, Any], where: str) -> None:
    """The checks a typed column needs: types, ``required`` keys, ``enum`` members."""
    if "enum" in schema and value not in schema["enum"]:
        raise ValueError(f"{where} is {value!r}, not one of {schema['enum']}")
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _JSON_TYPES:
        allowed = _JSON_TYPES[kind]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ValueError(f"{where} is {_short(json.dumps(value))}, not of type {kind}")
    if isinstance(value, dict):
        for key in schema.get("required", ()):
            if key not in value:
                raise ValueError(f"{where} has no {key!r}, which the schema requires")
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                check_json(value[key], sub, f"{where}.{key}")
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            check_json(item, schema["items"], f"{where}[{i}]")


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else text[:80] + "…")
