"""Reading a job file's YAML, and naming where it went wrong."""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Any

import yaml

from chute.errors import ConfigError


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (the last one won in
    silence: a second ``output:`` sent the results elsewhere)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # <<: *common: keys it overrides
                continue
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, Hashable):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a name, not a list or a mapping", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's booleans: only true and false. YAML 1.1's (PyYAML's) made yes, no, on and off
# booleans too, so `labels: [no, yes]` named a classifier's classes False and True.
_UniqueKeys.yaml_implicit_resolvers = {
    first: [r for r in resolvers if r[0] != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_UniqueKeys.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def read_yaml(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            raw = yaml.load(f, Loader=_UniqueKeys)  # a SafeLoader: no object tags
    except FileNotFoundError as exc:
        raise ConfigError(f"job file {path!r} does not exist.") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_problem(path, exc)) from exc
    except UnicodeDecodeError as exc:
        message = f"job file {path!r} is not UTF-8 text ({exc}): save it as UTF-8."
        raise ConfigError(message) from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"job file {path!r} is a directory: name the YAML file.") from exc
    except PermissionError as exc:
        raise ConfigError(
            f"job file {path!r} is not readable by this user ({exc.strerror}): make it "
            "readable (chmod), or run as its owner."
        ) from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"job file {path!r} must be a mapping with input, models and output.")
    return raw


_OPENED = {
    "flow sequence": "the '[' opened",
    "flow mapping": "the '{' opened",
    "quoted scalar": "the quote opened",
}


def yaml_problem(path: str, exc: yaml.YAMLError) -> str:
    """Where the YAML went wrong: for an unclosed bracket or quote, the line that opened
    it (the parser only notices at a later line), else the line of the problem."""
    problem, mark = getattr(exc, "problem", None), getattr(exc, "problem_mark", None)
    context, opened = getattr(exc, "context", None) or "", getattr(exc, "context_mark", None)
    what = next((v for k, v in _OPENED.items() if context.endswith(k)), None)
    if what and opened is not None:
        stopped = f" (the parser stopped at line {mark.line + 1}: {problem})" if mark else ""
        return (
            f"job file {path!r} is not valid YAML: {what} at line {opened.line + 1}, column "
            f"{opened.column + 1} is never closed{stopped}.\n{_snippet(path, opened)}"
            "Close it on that line, or quote the value."
        )
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"job file {path!r} is not valid YAML{where}: {exc}"


def _snippet(path: str, mark: Any) -> str:
    """The marked line of the file with a caret under the column."""
    try:
        with open(path) as f:
            line = f.read().splitlines()[mark.line]
    except (OSError, IndexError):
        return ""
    return f"  {line}\n  {' ' * mark.column}^\n"
