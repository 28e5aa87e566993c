"""The strict patch engine (git-apply semantics, bytes only) and the tools for patch authors."""

from fleetctl.patching.authoring import make_patch
from fleetctl.patching.engine import (
    ApplyResult,
    FilePatch,
    Hunk,
    PatchDoesNotApply,
    PatchError,
    apply_patch,
    is_applied,
    parse_patch,
    reverse_apply,
)

__all__ = [
    "ApplyResult",
    "FilePatch",
    "Hunk",
    "PatchDoesNotApply",
    "PatchError",
    "apply_patch",
    "is_applied",
    "make_patch",
    "parse_patch",
    "reverse_apply",
]
