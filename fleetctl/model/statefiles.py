"""A playbook's non-package files (`state_files:`): where they go on a host and how launch flags
refer to them.

Each is deployed to {state_dir}/files/<playbook name>/<name> by the agent, in the same transaction
as the playbook's package files (fleetctl/remote/transaction.py), and rolled back with them. A
launch flag value may name one as `{file:<name>}`; launch expands it to the absolute path on that
host (the state dir as the host's agent resolved it), so the server reads exactly the deployed file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fleetctl.config.playbook_model import Playbook
from fleetctl.engines.base import REF_RE
from fleetctl.model.instances import Instance

ROOT = "files"


def rel(pb: Playbook, name: str) -> str:
    """The file's path under the host's state dir."""
    return f"{ROOT}/{pb.name}/{name}"


def shown(pb: Playbook, name: str) -> str:
    """How manifests and results name it."""
    return "{state_dir}/" + rel(pb, name)


def payload(pb: Playbook) -> list[dict[str, Any]]:
    """The agent's `state_files` for a deploy of this playbook."""
    return [{"name": f"{pb.name}/{f.name}", "sha_after": f.sha256, "mode": f.mode,
             "content": f.data} for f in pb.state_files]


def expand(value: Any, pb: Playbook, state_dir: str) -> Any:
    if not isinstance(value, str) or "{file:" not in value:
        return value
    return REF_RE.sub(lambda m: f"{state_dir.rstrip('/')}/{rel(pb, m.group(1))}", value)


def expand_instances(plan: list[Instance], pb: Playbook, state_dir: str | None) -> list[Instance]:
    """The instances with every `{file:<name>}` in their flags and argv made an absolute path."""
    if not pb.state_files or not state_dir:
        return plan
    out = []
    for inst in plan:
        out.append(dataclasses.replace(
            inst, flags={k: expand(v, pb, state_dir) for k, v in inst.flags.items()},
            argv=[expand(a, pb, state_dir) for a in inst.argv],
            public_argv=[expand(a, pb, state_dir) for a in inst.public_argv]))
    return out


def not_deployed(pb: Playbook, facts: Any) -> list[str]:
    """The playbook's state files that no deploy record of this host shows with their intended bytes
    now (never deployed, rolled back, edited or deleted since): a launch naming them would read
    something else, or nothing."""
    from fleetctl.model import hoststate

    now: dict[str, str | None] = {}
    for m in hoststate.own(facts):
        if m.state != "complete" or m.gone:  # a record closed (superseded) or about to be: tracks nothing
            continue
        for f in m.files:
            if f.path.startswith("{state_dir}/"):
                now[f.path] = f.sha_now
    return [shown(pb, f.name) for f in pb.state_files if now.get(shown(pb, f.name)) != f.sha256]


def check_rows(pb: Playbook, versions: list[str]) -> list[Any]:
    """`fleetctl patch check` rows for the playbook's state files, per release: shipped as-is (sha256),
    and, for the config an adaptive launch names, whether that release's own loader takes it."""
    from fleetctl.engines import engine
    from fleetctl.patching.authoring import OK, FileCheck

    rows = []
    for version in versions:
        for f in pb.state_files:
            ok, detail = True, f"shipped as-is, {len(f.data)} bytes, sha256 {f.sha256}"
            loaded = engine().state_file_check(pb, version, f.name, f.data)
            if loaded is not None:
                ok, why = loaded
                detail = f"{detail}; {why}"
            rows.append(FileCheck(version, shown(pb, f.name), OK if ok else "refused", detail))
    return rows


def left_behind(facts: Any) -> list[str]:
    """State files a deploy wrote whose patch a package reinstall or upgrade took away (`gone`; the
    next rollback or deploy closes the record, `superseded`, and undoes them, remote/transaction.py
    close_superseded), still on the host as that deploy wrote them and tracked by no live record.
    One line each (status names them)."""
    from fleetctl.model import hoststate

    own = hoststate.own(facts)
    tracked = {f.path for m in own if m.state == "complete" and not m.gone for f in m.files
               if f.path.startswith("{state_dir}/") and f.sha_now == f.sha_after}
    out: list[str] = []
    for m in own:
        if m.kind != "deploy" or not (m.gone or m.state == "superseded"):
            continue
        for f in m.files:
            if f.path.startswith("{state_dir}/") and f.sha_now is not None and f.sha_now == f.sha_after \
                    and f.path not in tracked:
                out.append(f"{f.path} is still there from deploy {m.id}, whose patch the package "
                           f"reinstall/upgrade took away: 'fleetctl rollback' closes the record and removes "
                           f"it (or puts back what was there before); 'fleetctl deploy' of its playbook "
                           f"writes it again under a new record")
    return list(dict.fromkeys(out))
