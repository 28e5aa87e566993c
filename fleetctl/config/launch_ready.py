"""Is a playbook's `launch:` section there and filled in? (`launch` refuses it before any host.)

`fleetctl patch init` writes placeholders (`PLACEHOLDER`...) where the user must give a value (the
target model, a flag the patch adds); `patch check` names them and `launch` refuses them. A playbook
with no `launch:` section at all has no model to serve: `launch` refuses it naming the section.
"""

from __future__ import annotations

from typing import Any

from fleetctl.engines.base import PLACEHOLDER


def unfilled(pb: Any) -> list[str]:
    """The launch values still holding a placeholder, as `launch.flags.NAME` / `launch.env.NAME`."""
    out = [f"launch.flags.{k}" for k, v in pb.launch.flags.items() if isinstance(v, str) and PLACEHOLDER in v]
    out += [f"launch.env.{k}" for k, v in pb.launch.env.items() if isinstance(v, str) and PLACEHOLDER in v]
    if PLACEHOLDER in pb.launch.command:
        out.append("launch.command")
    return out


def launch_refusal(pb: Any) -> str | None:
    """One line: why `launch` cannot start this playbook's servers at all (None: it can try)."""
    from fleetctl.engines import engine

    if not pb.launch_declared:
        return (f"{pb.path}: the playbook has no launch: section, so launch has no model to serve: add launch: "
                f"with flags: {engine().model_flag}: MODEL (fleetctl patch init writes a commented one)")
    todo = unfilled(pb)
    if todo:
        return (f"{pb.path}: {', '.join(todo)} still {'holds' if len(todo) == 1 else 'hold'} a placeholder "
                f"({PLACEHOLDER}...>): fill {'it' if len(todo) == 1 else 'them'} in before launch")
    return None
