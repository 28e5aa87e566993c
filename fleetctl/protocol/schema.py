"""Checking untrusted JSON against a dataclass, once, at the boundary.

An answer type is a plain dataclass whose field types ARE its schema: `str`, `int`, `float`,
`bool`, `None`, `Literal[...]`, `list[X]`, `dict[str, X]`, unions (`X | None`), other answer
dataclasses, and `Annotated[X, check]` where `check(value) -> problem or None`. A field without a
default is required; one with a default may be absent. A field may read another JSON key
(`field(metadata={"json": "class"})`). Keys the type does not name are ignored (a newer agent may
send more); wrong types, missing required keys and unknown Literal values are refused with
`Invalid`, which says where (`servers.instances[0].instance`) and what, never echoing more than a
few dozen characters of what the host sent.

Hand-written on purpose: every CLI start imports the answer types, and defining pydantic models
costs ~10x more than dataclasses (measured side by side on the 2-CPU build machine: 25 strict
pydantic models 320-510 ms, 25 dataclasses 30-70 ms, under the same load); these checkers are
built on first use and cached.
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
import types
from collections.abc import Callable
from typing import (
    Annotated,
    Any,
    Literal,
    TypeVar,
    Union,
    dataclass_transform,
    get_args,
    get_origin,
    get_type_hints,
)

T = TypeVar("T")
Checker = Callable[[Any], Any]

MAX_KEY = 40  # characters of a host-sent key or value shown in a message


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def answer_type(cls: type[T]) -> type[T]:
    """`@dataclass`, with the __repr__ and __eq__ of every answer type shared (they behave as the
    generated ones: the fields in order, `repr=False`/`compare=False` fields left out, equal only to
    the same class). dataclasses compiles each method it generates (~0.2 ms apiece): the 52 answer
    types cost ~33 ms of every command's start, ~2/3 of it their repr and eq."""
    made = dataclasses.dataclass(cls, repr=False, eq=False)
    if "__repr__" not in cls.__dict__:
        made.__repr__ = _answer_repr  # type: ignore[assignment]
    if "__eq__" not in cls.__dict__:
        made.__eq__ = _answer_eq  # type: ignore[assignment]
        made.__hash__ = None  # type: ignore[assignment]  # (as @dataclass: mutable and compared by value)
    return made


@reprlib.recursive_repr()
def _answer_repr(self: Any) -> str:
    shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    return f"{type(self).__qualname__}({shown})"


def _answer_eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = [f.name for f in dataclasses.fields(self) if f.compare]
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


class Invalid(Exception):
    """A value does not fit its schema; `where` is the path to it, innermost segment added first."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self._path: list[str] = []

    def at(self, segment: str) -> Invalid:
        self._path.append(segment)
        return self

    @property
    def where_known(self) -> bool:
        return bool(self._path)

    @property
    def where(self) -> str:
        return "".join(reversed(self._path)).lstrip(".") or "(the whole answer)"


def shown(value: Any) -> str:
    """A short, escaped rendering of something a host sent (ASCII only, bounded)."""
    if isinstance(value, str):
        return ascii(value[:MAX_KEY]) + ("..." if len(value) > MAX_KEY else "")
    if value is None or isinstance(value, (bool, int, float)):
        return json.dumps(value)[:MAX_KEY]
    return kind(value)


def kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _scalar(py: type | tuple[type, ...], name: str) -> Checker:
    def check(v: Any) -> Any:
        if isinstance(v, py) and not isinstance(v, bool):
            return v
        raise Invalid(f"expected {name}, got {kind(v)}")
    return check


def _check_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise Invalid(f"expected a string, got {kind(v)}")


def _check_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise Invalid(f"expected true or false, got {kind(v)}")


def _check_float(v: Any) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    raise Invalid(f"expected a number, got {kind(v)}")


def _check_any(v: Any) -> Any:
    return v


def _check_none(v: Any) -> None:
    if v is None:
        return None
    raise Invalid(f"expected null, got {kind(v)}")


_cache: dict[Any, Checker] = {}


def checker(tp: Any) -> Checker:
    """The checker for a type (built once per process, then cached)."""
    got = _cache.get(tp)
    if got is None:
        got = _cache[tp] = _build(tp)
    return got


def _build(tp: Any) -> Checker:
    if tp is Any:
        return _check_any
    if tp is str:
        return _check_str
    if tp is bool:
        return _check_bool
    if tp is int:
        return _scalar(int, "a whole number")
    if tp is float:
        return _check_float
    if tp is None or tp is type(None):
        return _check_none
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp)
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        return _annotated(checker(args[0]), args[1:])
    if origin is Literal:
        return _literal(args)
    if origin is list:
        return _list(checker(args[0]))
    if origin is dict:
        if args[0] is not str:
            raise TypeError(f"JSON object keys are strings: {tp}")
        return _dict(checker(args[1]))
    if origin is Union or origin is types.UnionType:
        return _union(args)
    raise TypeError(f"no answer checker for {tp!r}")


def _annotated(inner: Checker, checks: tuple[Any, ...]) -> Checker:
    def check(v: Any) -> Any:
        v = inner(v)
        for c in checks:
            problem = c(v)
            if problem:
                raise Invalid(problem)
        return v
    return check


def _literal(allowed: tuple[Any, ...]) -> Checker:
    options = set(allowed)
    listed = ", ".join(repr(a) for a in allowed)

    def check(v: Any) -> Any:
        if isinstance(v, (str, int)) and not isinstance(v, bool) and v in options:
            return v
        raise Invalid(f"unknown value {shown(v)} (known: {listed})")
    return check


def _list(item: Checker) -> Checker:
    def check(v: Any) -> list[Any]:
        if not isinstance(v, list):
            raise Invalid(f"expected a list, got {kind(v)}")
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except Invalid as e:
                raise e.at(f"[{i}]") from None
        return out
    return check


def _dict(value: Checker) -> Checker:
    def check(v: Any) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise Invalid(f"expected an object, got {kind(v)}")
        out = {}
        for k, x in v.items():
            try:
                out[k] = value(x)
            except Invalid as e:
                raise e.at(f"[{shown(k)}]") from None
        return out
    return check


def _union(alternatives: tuple[Any, ...]) -> Checker:
    optional = type(None) in alternatives
    rest = [a for a in alternatives if a is not type(None)]
    if len(rest) == 1:  # X | None: say what X wants
        inner = checker(rest[0])

        def check_optional(v: Any) -> Any:
            return None if v is None else inner(v)
        return check_optional
    checks = [checker(a) for a in rest]

    def check(v: Any) -> Any:
        if v is None and optional:
            return None
        for c in checks:
            try:
                return c(v)
            except Invalid:
                continue
        raise Invalid(f"unexpected {kind(v)}")
    return check


def _dataclass(cls: type) -> Checker:
    hints = get_type_hints(cls, include_extras=True)
    fields: list[tuple[str, str, Checker, bool]] = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, f.metadata.get("json", f.name), checker(hints[f.name]), required))

    def check(v: Any) -> Any:
        if not isinstance(v, dict):
            raise Invalid(f"expected an object, got {kind(v)}")
        kw = {}
        for name, key, chk, required in fields:
            if key in v:
                try:
                    kw[name] = chk(v[key])
                except Invalid as e:
                    raise e.at("." + key) from None
            elif required:
                raise Invalid("missing").at("." + key)
        return cls(**kw)
    return check


def parse(tp: type[T], value: Any) -> T:
    """`value` as a `tp`, or Invalid."""
    return checker(tp)(value)  # type: ignore[no-any-return]


def to_json(obj: Any) -> Any:
    """A parsed answer back to JSON data (field names mapped back to their JSON keys)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.metadata.get("json", f.name): to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_json(x) for k, x in obj.items()}
    return obj
