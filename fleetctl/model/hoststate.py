"""What the host's deploy records say, and what they cannot: the controller's reading of the agent's
`state` facts (fleetctl/remote/records.py: state_facts).

Every manifest the agent reports is marked when another machine wrote it into a shared state dir
(`foreign`: ignored here, never acted on), when this python now imports another tree than the one
it patched (`moved`), or when its patch is no longer on disk (`gone`: the package was reinstalled
or upgraded under it). Files that differ from the release's pristine bytes (the wheel's RECORD) and
that no record explains are "changed without a record" (a hand edit, a deleted or moved state dir, or a changed
`state_dir` in the inventory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetctl.errors import FleetctlError
from fleetctl.protocol.answers import Lock, Manifest
from fleetctl.protocol.names import OPEN_STATES

if TYPE_CHECKING:
    from fleetctl.model.facts import HostFacts


def own(facts: HostFacts) -> list[Manifest]:
    """This machine's deploy records, oldest first; not those another inventory entry made of another
    tree (two entries for one machine and one state dir, each with its own SGLang: each entry's
    deploys are its own; a deploy of this entry's tree is its own whoever made it)."""
    return [m for m in facts.deploys() if not m.foreign and not _other_entrys(facts, m)]


def _other_entrys(facts: HostFacts, m: Manifest) -> bool:
    return bool(m.host) and m.host != facts.host and m.moved is not None


def foreign(facts: HostFacts) -> list[Manifest]:
    return [m for m in facts.deploys() if m.foreign]


def live(facts: HostFacts) -> list[Manifest]:
    """Complete deploys a rollback would undo (moved ones included: they are still on disk, elsewhere)."""
    return [m for m in own(facts) if m.state == "complete" and m.kind == "deploy" and not m.gone]


def gone(facts: HostFacts) -> list[Manifest]:
    """Complete or interrupted deploys whose tree now holds another release (or, complete, whose files
    all hold their original bytes again): the next deploy or rollback closes them, restoring nothing."""
    return [m for m in own(facts) if m.state in ("complete", *OPEN_STATES) and m.gone]


def interrupted(facts: HostFacts) -> list[Manifest]:
    """Deploys cut off half-way that the next deploy or rollback repairs from their backups."""
    return [m for m in own(facts) if m.state in OPEN_STATES and not m.gone]


def on_disk(facts: HostFacts) -> list[Manifest]:
    """Live deploys in the tree this python imports now."""
    return [m for m in live(facts) if not m.moved]


def edited(facts: HostFacts) -> list[tuple[str, str, str | None, str | None]]:
    """Deployed files that no longer hold what their deploy wrote: (path, deploy id, sha now, sha the
    deploy wrote), from the records' own hashes (no playbook needed). Per path, the newest live deploy
    in the tree imported now is the one that counts."""
    last: dict[str, tuple[str, str | None, str | None]] = {}
    for m in on_disk(facts):
        for f in m.files:
            if f.sha_after is not None:
                last[f.path] = (m.id, f.sha_now, f.sha_after)
    return [(p, mid, now, after) for p, (mid, now, after) in sorted(last.items()) if now != after]


def edited_msg(path: str, deploy_id: str, now: str | None, after: str | None) -> str:
    held = "is missing" if now is None else f"hashes {now[:12]}"
    return (f"{path} was changed after deploy {deploy_id} wrote it (not by fleetctl: edited by hand or by "
            f"another tool): it {held}, the deploy wrote {(after or '?')[:12]}; a deploy or rollback of it "
            f"refuses until you keep what you need and rerun it with --force")


def explained(facts: HostFacts, rel: str, sha: str | None) -> bool:
    """Does a record of this machine, for the tree imported now, account for `rel` (holding `sha`)? A
    live or open deploy of that file does (its own checks say whether the file drifted since)."""
    for m in own(facts):
        if m.moved or m.gone:
            continue
        if m.state not in ("complete", *OPEN_STATES):
            continue
        if any(f.path == rel for f in m.files):
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
    from fleetctl.engines import wheels

    try:
        return wheels.pristine_hashes(version), ""
    except FleetctlError as e:
        return None, e.message


def unrecorded_msg(host: str, version: str | None, files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return (f"{host}: changed without a record: {len(files)} file(s) differ from pristine sglang {version} and "
            f"no deploy record on this host explains them ({shown}); edited by hand or by another tool, or "
            f"(if fleetctl deployed them) was the state dir deleted or moved, or state_dir changed in the "
            f"inventory? 'fleetctl rollback --from-pristine -p PLAYBOOK' restores the "
            f"release's pristine bytes (verified, with backups) into the files PLAYBOOK patches where they hold "
            f"its patched bytes")


def moved_msg(m: Manifest) -> str:
    mv = m.moved
    return (f"deploy {m.id} patched {mv.patched if mv else '?'}; this python now imports "
            f"{mv.imports_now if mv else '?'}")


def gone_msg(m: Manifest) -> str:
    return f"deploy {m.id} is no longer on disk ({m.gone})"


def foreign_note(facts: HostFacts) -> str | None:
    fm = foreign(facts)
    if not fm:
        return None
    who = sorted({str(m.foreign) for m in fm})
    return (f"{len(fm)} deploy record(s) in this state dir were written by another machine ({', '.join(who)}): "
            f"ignored, never acted on; give each host its own state_dir")


def lock_problem(lock: Lock) -> str:
    if lock.foreign:
        return (f"lock held by another machine ({lock.owner}): {lock.holder()} (pid {lock.pid} there); never "
                f"taken over automatically: --break-lock for this host if that holder is surely gone")
    return f"{'stale ' if lock.stale else ''}lock: {lock.holder()}"
