"""YAML loading that remembers where each key came from, so errors can say file:line.

We compose the YAML into a node tree (which carries marks), build plain Python data from it,
and keep the tree to map a pydantic error location (a tuple of keys) back to a line number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from fleetctl.errors import InputError

M = TypeVar("M", bound=BaseModel)


@dataclass
class YamlDoc:
    path: Path
    data: Any
    root: yaml.Node | None

    def line_of(self, loc: tuple[Any, ...]) -> int:
        """1-based line of the deepest node along `loc` that exists (key line for mappings)."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else 1
        for key in loc:
            if isinstance(node, yaml.MappingNode):
                found = None
                for knode, vnode in node.value:
                    if isinstance(knode, yaml.ScalarNode) and knode.value == str(key):
                        found = (knode, vnode)
                        break
                if found is None:
                    return line
                line = found[0].start_mark.line + 1
                node = found[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(key, int):
                if key >= len(node.value):
                    return line
                node = node.value[key]
                line = node.start_mark.line + 1
            else:
                return line
        return line


# libyaml's parser when PyYAML was built with it (the wheels are): the same nodes and marks, ~10x
# faster than the pure-Python one on a 256-host inventory
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _yaml_in(d: Path, what: str) -> str:
    """What to pass instead of the directory `d`: its WHAT.yaml, else the YAML files it holds."""
    own = d / f"{what.replace(' ', '-')}.yaml"
    if own.is_file():
        return f"pass the file: {own}"
    try:
        found = sorted(p.name for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    except OSError:
        found = []
    if not found:
        return f"pass the {what} YAML file itself"
    more = f" (+{len(found) - 3} more)" if len(found) > 3 else ""
    return f"pass one of its YAML files: {', '.join(found[:3])}{more}"


# what a file is -> (its reference when it cannot be read, when it is not valid): docs/errors.md
FILE_REFERENCES = {
    "inventory": ("inventory-not-found", "inventory-invalid"),
    "playbook": ("playbook-not-found", "playbook-invalid"),
}
OTHER_FILE_REFERENCES = ("file-not-found", "file-invalid")


def references(what: str) -> tuple[str, str]:
    """The error references of a `what` file: (cannot be read, not valid)."""
    return FILE_REFERENCES.get(what, OTHER_FILE_REFERENCES)


def load_yaml(path: Path, what: str) -> YamlDoc:
    """Read and parse a YAML file; any problem is one InputError line naming file:line."""
    missing, invalid = references(what)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} file not found", hint="check the path", reference=missing) from None
    except IsADirectoryError:
        a = "an" if what[:1] in "aeiou" else "a"
        raise InputError(f"{path}: is a directory, not {a} {what} file", hint=_yaml_in(path, what),
                         reference=missing) from None
    except (PermissionError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read {what}: {e.__class__.__name__}: {e}", reference=missing) from None
    try:
        # one parse: the node tree (for lines) and the data constructed from that same tree
        loader = _LOADER(text)
        try:
            root = loader.get_single_node()
            data = loader.construct_document(root) if root is not None else None
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = e.problem or str(e)
        raise InputError(f"{path}{line}: malformed YAML: {problem}", hint="fix the YAML syntax",
                         reference=invalid) from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: malformed YAML: {e}", hint="fix the YAML syntax", reference=invalid) from None
    dup = _duplicate_key(root)
    if dup is not None:
        key, first, again = dup
        raise InputError(f"{path}:{again}: duplicate key '{key}' (first at line {first})",
                         hint="YAML would silently keep only the last one; remove or rename one", reference=invalid)
    if data is None:
        data = {}
    return YamlDoc(path=path, data=data, root=root)


def _duplicate_key(node: yaml.Node | None) -> tuple[str, int, int] | None:
    """The first mapping key that appears twice in one mapping: (key, first line, second line)."""
    todo = [node] if node is not None else []
    while todo:
        n = todo.pop()
        if isinstance(n, yaml.MappingNode):
            seen: dict[str, int] = {}
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    line = k.start_mark.line + 1
                    if k.value in seen:
                        return k.value, seen[k.value], line
                    seen[k.value] = line
                todo.append(v)
        elif isinstance(n, yaml.SequenceNode):
            todo.extend(n.value)
    return None


# an unknown key: of a model (extra_forbidden) or of a dataclass the model holds (config/playbook_model.py)
_UNKNOWN = ("extra_forbidden", "unexpected_keyword_argument")
_NOT_A_MAPPING = ("model_type", "dataclass_type", "dict_type")


def _fix_for(err: dict[str, Any], key: str) -> str | None:
    kind = err.get("type", "")
    if kind in _NOT_A_MAPPING:
        return f"write '{key}' as key: value lines under it"
    if kind in _UNKNOWN:
        return f"remove '{key}' or check its spelling"
    if kind == "missing":
        return f"add '{key}:'"
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"'{key}' must be {kind.split('_')[0]}"
    return None


def _part(p: Any) -> str:
    """One part of a key path for a one-line message: plain names as they are, others quoted and
    escaped (a key holding a newline or shell syntax never breaks the line or reads as code)."""
    text = str(p)
    if text == "[key]" or re.fullmatch(r"[A-Za-z0-9_.\-]+", text):
        return text
    return json.dumps(text, ensure_ascii=False)


def validate(doc: YamlDoc, model: type[M], what: str) -> M:
    """Validate parsed YAML against a pydantic model; the first error becomes one line."""
    invalid = references(what)[1]
    if not isinstance(doc.data, dict):
        raise InputError(f"{doc.path}:1: {what} must be a YAML mapping at the top level", reference=invalid)
    try:
        return model.model_validate(doc.data)
    except ValidationError as e:
        errors = e.errors()
        # a misspelt key explains a "missing" one: report unknown keys first
        err = next((x for x in errors if x.get("type") in _UNKNOWN), errors[0])
        loc = tuple(err.get("loc", ()))
        keypath = ".".join(_part(p) for p in loc) or "(top level)"
        key = _part(loc[-1]) if loc else "(top level)"
        line = doc.line_of(loc)
        msg = err.get("msg", "invalid")
        kind = err.get("type")
        if kind in _UNKNOWN:
            msg = "unknown key"
        elif kind in _NOT_A_MAPPING:
            msg = "not a mapping"
        elif kind == "missing":
            msg = "missing"
        elif kind == "value_error":
            msg = msg.removeprefix("Value error, ")
        elif kind == "string_pattern_mismatch" and loc and loc[-1] == "[key]":
            msg = "not a valid name (letters, digits and _ . - only; not starting with . or -)"
        raise InputError(f"{doc.path}:{line}: {keypath}: {msg}", hint=_fix_for(err, key), reference=invalid) from None
