"""What the host's deploy records say, and what they cannot: the controller's reading of the agent's
`state` facts (fleetctl/remote/agent_deploy.py: state_facts).

Every manifest the agent reports is marked when another machine wrote it into a shared state dir
(`foreign`: ignored here, never acted on), when this python now imports another tree than the one
it patched (`moved`), or when its patch is no longer on disk (`gone`: the package was reinstalled
or upgraded under it). Files that differ from the release's pristine bytes (the wheel's RECORD) and
that no record explains are "deployed without a record" (a deleted or moved state dir, a changed
`state_dir` in the inventory, or a hand edit).
"""

from __future__ import annotations

from typing import Any

from fleetctl.errors import FleetctlError
from fleetctl.facts import HostFacts

OPEN_STATES = ("preparing", "applying", "rolling-back")


def _deploys(facts: HostFacts) -> list[dict[str, Any]]:
    st = facts.extra.get("state") or {}
    return [m for m in st.get("deploys", []) if isinstance(m, dict)]


def own(facts: HostFacts) -> list[dict[str, Any]]:
    """This machine's deploy records, oldest first."""
    return [m for m in _deploys(facts) if not m.get("foreign")]


def foreign(facts: HostFacts) -> list[dict[str, Any]]:
    return [m for m in _deploys(facts) if m.get("foreign")]


def live(facts: HostFacts) -> list[dict[str, Any]]:
    """Complete deploys a rollback would undo (moved ones included: they are still on disk, elsewhere)."""
    return [m for m in own(facts) if m.get("state") == "complete" and m.get("kind", "deploy") == "deploy"
            and not m.get("gone")]


def gone(facts: HostFacts) -> list[dict[str, Any]]:
    """Complete or interrupted deploys whose tree now holds another release (or, complete, whose files
    all hold their original bytes again): the next deploy or rollback closes them, restoring nothing."""
    return [m for m in own(facts) if m.get("state") in ("complete", *OPEN_STATES) and m.get("gone")]


def interrupted(facts: HostFacts) -> list[dict[str, Any]]:
    """Deploys cut off half-way that the next deploy or rollback repairs from their backups."""
    return [m for m in own(facts) if m.get("state") in OPEN_STATES and not m.get("gone")]


def on_disk(facts: HostFacts) -> list[dict[str, Any]]:
    """Live deploys in the tree this python imports now."""
    return [m for m in live(facts) if not m.get("moved")]


def explained(facts: HostFacts, rel: str, sha: str | None) -> bool:
    """Does a record of this machine, for the tree imported now, account for `rel` (holding `sha`)? A
    live or open deploy of that file does (its own checks say whether the file drifted since)."""
    for m in own(facts):
        if m.get("moved") or m.get("gone"):
            continue
        if m.get("state") not in ("complete", *OPEN_STATES):
            continue
        if any(f.get("path") == rel for f in m.get("files", [])):
            return True
    return False


def unrecorded(facts: HostFacts, pristine: dict[str, str]) -> list[str]:
    """Files the facts hashed that differ from `pristine` (rel -> sha256) with no record explaining them."""
    out = []
    for rel, ff in sorted(facts.files.items()):
        want = pristine.get(rel)
        if want is None or not ff.exists or ff.sha256 is None or ff.sha256 == want:
            continue
        if not explained(facts, rel, ff.sha256):
            out.append(rel)
    return out


def release_pristine(version: str | None) -> tuple[dict[str, str] | None, str]:
    """The release's pristine hashes from the controller's wheel cache, or (None, why not)."""
    if not version:
        return None, "the SGLang version is unknown"
    from fleetctl import wheels

    try:
        return wheels.pristine_hashes(version), ""
    except FleetctlError as e:
        return None, e.message


def unrecorded_msg(host: str, version: str | None, files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"{host}: deployed without a record: {len(files)} file(s) differ from pristine sglang {version} and "
            f"no deploy record on this host explains them ({shown}); was the state dir deleted or moved, or "
            f"state_dir changed in the inventory? 'fleetctl rollback --from-pristine' restores the release's "
            f"pristine bytes (verified, with backups)")


def moved_msg(m: dict[str, Any]) -> str:
    mv = m.get("moved") or {}
    return (f"deploy {m.get('id')} patched {mv.get('patched')}; this python now imports {mv.get('imports_now')}")


def gone_msg(m: dict[str, Any]) -> str:
    return f"deploy {m.get('id')} is no longer on disk ({m.get('gone')})"


def foreign_note(facts: HostFacts) -> str | None:
    fm = foreign(facts)
    if not fm:
        return None
    who = sorted({str(m.get("foreign")) for m in fm})
    return (f"{len(fm)} deploy record(s) in this state dir were written by another machine ({', '.join(who)}): "
            f"ignored, never acted on; give each host its own state_dir")


def lock_problem(lock: dict[str, Any]) -> str:
    if lock.get("foreign"):
        return (f"lock held by another machine ({lock.get('owner')}): {lock.get('op')} {lock.get('id')} by "
                f"{lock.get('by')} (pid {lock.get('pid')} there); never taken over automatically: "
                f"--break-lock for this host if that holder is surely gone")
    return f"{'stale ' if lock.get('stale') else ''}lock: {lock.get('op')} {lock.get('id')} by {lock.get('by')}"
