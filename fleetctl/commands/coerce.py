"""Option values converted without pydantic (issue 16.10: start-up CPU).

typer 0.29 converts every option value through a pydantic TypeAdapter built on first use: importing
pydantic and building the adapters costs ~0.1 s of CPU on every command, for values that are plain
strings, paths and numbers. `install()` puts a fast path in front of typer's own conversion for the
annotations fleetctl uses (str, bool, int, float, Path, list[str]) and for values whose result is
certain (a canonical number in range, any string); everything else (a bad value, an edge case, any
other annotation) goes to typer's own pydantic conversion, so accepted values and every error
message stay typer's own. tests/test_startup.py compares both on many values, and fails loudly
when a typer upgrade moves the names used here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from typer import _coercion, core
from typer._param_types import coerce_cli_path

_ORIGINAL = _coercion.build_runtime_param
_INT = re.compile(r"[0-9]{1,18}")
_FLOAT = re.compile(r"[0-9]{1,15}(?:\.[0-9]{1,15})?")
_SLOW = object()


def _plain(info: Any) -> bool:
    """Parameter metadata that changes nothing about the conversion."""
    return (getattr(info, "parser", None) is None and getattr(info, "click_type", None) is None
            and not getattr(info, "clamp", False))


def _in_range(v: float, info: Any) -> bool:
    return (info.min is None or v >= info.min) and (info.max is None or v <= info.max)


def _fast(annotation: Any, info: Any, value: Any, param: Any, ctx: Any) -> Any:
    """The converted value, or _SLOW when typer's own conversion must decide."""
    if annotation is str:
        return value if isinstance(value, str) else _SLOW
    if annotation is bool:
        return value if isinstance(value, bool) else _SLOW
    if annotation is int:
        if isinstance(value, str) and _INT.fullmatch(value):
            value = int(value)
        if type(value) is int and _in_range(value, info):
            return value
        return _SLOW
    if annotation is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value):
            value = float(value)
        if type(value) in (int, float) and _in_range(value, info):
            return float(value)
        return _SLOW
    if annotation is Path:
        if isinstance(value, str) and value and "\x00" not in value:
            value = Path(value)
        if isinstance(value, Path):  # exists/dir_okay/resolve_path...: typer's own checks
            return coerce_cli_path(value, info, path_type=info.path_type or Path, param=param, ctx=ctx)
        return _SLOW
    if annotation == list[str]:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return list(value)
        return _SLOW
    return _SLOW


@dataclass(frozen=True)
class FastRuntimeParam(_coercion.RuntimeParam):
    descriptor: Any = None
    _slow: list[Any] = field(default_factory=list, compare=False)

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        got = _fast(self.annotation, self.parameter_info, value, param, ctx)
        if got is not _SLOW:
            return got
        if not self._slow:
            self._slow.append(_ORIGINAL(self.descriptor))
        return self._slow[0]._coerce_value(value, param=param, ctx=ctx)


FAST = (str, bool, int, float, Path, list[str])


def build_runtime_param(descriptor: Any) -> Any:
    if descriptor.file_annotation is None and descriptor.annotation in FAST and _plain(descriptor.parameter_info):
        return FastRuntimeParam(parameter_info=descriptor.parameter_info, annotation=descriptor.annotation,
                                descriptor=descriptor)
    return _ORIGINAL(descriptor)


def install() -> None:
    """Route typer's parameters through the fast path (idempotent)."""
    core.build_runtime_param = build_runtime_param  # type: ignore[attr-defined]
