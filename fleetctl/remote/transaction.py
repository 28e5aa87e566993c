"""Agent part: the deploy transaction and its undo. `deploy`: under the host lock, every planned
file checked against the plan, backed up, replaced (files.replace_file) and recorded, so the host
holds all intended or all original bytes; `rollback`: the recorded originals put back; an
interrupted deploy is repaired by the next call that takes the lock. Fault points (core's
fault_point) mark the steps a test may stop at.
"""

import os
import stat
import sys
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.atomic import fsync_dir, write_atomic
    from fleetctl.remote.core import ACTIONS, AgentError, expand, fault_point, sha256_file, sha256_new
    from fleetctl.remote.files import drop_bytecode, makedirs_private, replace_file, safe_target, sha_or_none
    from fleetctl.remote.locate import locate_package, run_probe
    from fleetctl.remote.lock import acquire_lock, pid_alive, release_lock, writer_identity
    from fleetctl.remote.records import (
        OPEN_STATES,
        current_tree,
        ensure_tree_id,
        entry_path,
        gone_reason,
        is_state,
        list_manifests,
        live_deploys,
        load_manifest,
        manifest_path,
        manifest_tree,
        mark_shared,
        save_manifest,
        state_rel,
        state_target,
        tree_records_dirs,
    )



DEPLOY_HOOKS = []  # fn(request, answer) run at the end of a deploy, still under the host lock


# ----------------------------------------------------------------------------- transactions


def _restore_files(state_dir, m, entries, force=False, forced_dir=None, p=None):
    """Put each entry's backup back (atomically) and verify sha_before. Returns per-file results."""
    results = []
    bdir = os.path.join(os.path.dirname(manifest_path(state_dir, m["id"], m.get("host"))), "backup")
    for i, f in enumerate(entries):
        if i:
            fault_point(p, "between_restores", i)
        path = entry_path(m, f)
        try:
            cur = sha256_file(path)
        except FileNotFoundError:
            cur = None
        pyc = {"prefixes": m.get("pycache_prefixes") or [], "removed": []}
        if is_state(f):
            results.append(_restore_state(m, f, path, cur, bdir, force, forced_dir))
            continue
        if cur == f["sha_before"]:
            # bytecode cached from the patched bytes meanwhile would still run them: drop it too
            drop_bytecode(path, pyc["prefixes"], pyc["removed"])
            results.append({"path": f["path"], "action": "already original", "bytecode_removed": pyc["removed"]})
            continue
        if cur != f.get("sha_after") and not force:
            results.append({"path": f["path"], "action": "refused", "sha_now": cur,
                            "why": "changed since the deploy (neither its patched nor its original bytes)"})
            continue
        if cur is not None and cur != f.get("sha_after") and forced_dir:
            makedirs_private(os.path.dirname(os.path.join(forced_dir, f["path"])))
            with open(path, "rb") as src:
                write_atomic(os.path.join(forced_dir, f["path"]), src.read(), 0o600)
        with open(os.path.join(bdir, f["path"]), "rb") as fh:
            data = fh.read()
        safe_target(m["package_dir"], f["path"])
        replace_file(path, data, f["mode"], f.get("uid"), f.get("gid"), f["sha_before"], validate_python=False,
                     tag="fleetctl-restore", hook=lambda k=i + 1: fault_point(p, "mid_write", k), pyc=pyc)
        results.append({"path": f["path"], "action": "restored", "sha_now": f["sha_before"],
                        "bytecode_removed": pyc["removed"]})
    return results


def _restore_state(m, f, path, cur, bdir, force, forced_dir):
    """Put a state file back as it was before the deploy: its backup, or no file if there was none."""
    if cur == f.get("sha_before"):
        return {"path": f["path"], "action": "already original"}
    if cur != f.get("sha_after") and not force:
        return {"path": f["path"], "action": "refused", "sha_now": cur,
                "why": "changed since the deploy (neither its deployed nor its original bytes)"}
    if cur is not None and cur != f.get("sha_after") and forced_dir:
        makedirs_private(os.path.join(forced_dir, "_state", os.path.dirname(f["rel"])))
        with open(path, "rb") as src:
            write_atomic(os.path.join(forced_dir, "_state", f["rel"]), src.read(), 0o600)
    if f.get("sha_before") is None:  # the deploy created it: remove it
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        fsync_dir(os.path.dirname(path))
        return {"path": f["path"], "action": "removed", "sha_now": None}
    with open(os.path.join(bdir, "_state", f["rel"]), "rb") as fh:
        data = fh.read()
    replace_file(state_target(m["state_real"], f["rel"]), data, f["mode"], f.get("uid"), f.get("gid"),
                 f["sha_before"], validate_python=False, tag="fleetctl-restore")
    return {"path": f["path"], "action": "restored", "sha_now": f["sha_before"]}


def _temp_name(name):
    """(base, pid) of a replace_file temp name `.<base>.fleetctl[-restore].<pid>.tmp`, else None."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    head, dot, pid = name[1:-4].rpartition(".")
    if not dot or not (pid.isascii() and pid.isdigit()):
        return None
    for tag in (".fleetctl", ".fleetctl-restore"):
        if head.endswith(tag) and len(head) > len(tag):
            return head[:-len(tag)], int(pid)
    return None


def sweep_temp(pkg_dir, rels):
    """Remove the temp files `replace_file` left beside these targets when its process was killed
    between creating and renaming them (their pid is gone). Returns the paths removed."""
    removed = []
    by_dir = {}
    for rel in rels:
        by_dir.setdefault(os.path.dirname(os.path.join(pkg_dir, rel)), set()).add(os.path.basename(rel))
    for d, bases in sorted(by_dir.items()):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for name in names:
            mt = _temp_name(name)
            if not mt or mt[0] not in bases:
                continue
            pid = mt[1]
            if pid != os.getpid() and pid_alive(pid):
                continue
            try:
                os.unlink(os.path.join(d, name))
                removed.append(os.path.relpath(os.path.join(d, name), pkg_dir))
            except OSError:
                pass
        if removed:
            fsync_dir(d)
    return removed


def recover_interrupted(state_dir):
    """Undo every deploy that was cut off half-way, so the host is all-original again (and remove
    the temp files a killed agent left in the package dir)."""
    notes = []
    for m in list_manifests(state_dir):
        if m.get("state") not in OPEN_STATES:
            continue
        gone = sweep_temp(m["package_dir"], [f["path"] for f in m.get("files", []) if not is_state(f)])
        if m.get("state_real"):
            gone += [os.path.join("{state_dir}", x) for x in
                     sweep_temp(m["state_real"], [f["rel"] for f in m.get("files", []) if is_state(f)])]
        if gone:
            notes.append("removed %d temp file(s) left by the interrupted %s: %s"
                         % (len(gone), m["id"], ", ".join(gone)))
        entries = [f for f in m.get("files", []) if f.get("backed_up")]
        res = _restore_files(state_dir, m, entries)
        bad = [r for r in res if r["action"] == "refused"]
        if bad:
            raise AgentError("interrupted deploy %s cannot be repaired automatically: %s %s"
                             % (m["id"], bad[0]["path"], bad[0]["why"]), "drifted")
        m["state"] = "interrupted-restored"
        m["note"] = "cut off while %s; restored to the original files" % m.get("state")
        save_manifest(state_dir, m)
        notes.append("repaired interrupted deploy %s: %d file(s) restored"
                     % (m["id"], sum(1 for r in res if r["action"] == "restored")))
    return notes


def close_superseded(state_dir, cur_real, cur_version):
    """Close the record of every complete deploy whose patch is no longer on disk (the package was
    reinstalled or upgraded under it): state `superseded`; nothing is restored (its backups belong to
    another release, or equal what is there). Returns notes."""
    notes = []
    for m in list_manifests(state_dir):
        why = gone_reason(m, cur_real, cur_version)
        if not why:
            continue
        m["note"] = "no longer on disk (%s) when %s; record closed, nothing restored" % (why, m.get("state"))
        m["state"] = "superseded"
        save_manifest(state_dir, m)
        notes.append("deploy %s is no longer on disk (%s): record closed, nothing restored" % (m["id"], why))
        notes += _undo_state_files(state_dir, m)
    return notes


def _undo_state_files(state_dir, m):
    """A superseded deploy's state files live in the state dir, not in the reinstalled tree: their
    backups still hold, so they are put back as before the deploy (removed if it created them) while
    they still hold what it wrote; never left behind untracked. Returns notes."""
    bdir = os.path.join(os.path.dirname(manifest_path(state_dir, m["id"], m.get("host"))), "backup")
    notes = []
    for f in m.get("files", []):
        if not is_state(f) or f.get("status") != "applied":
            continue
        path = entry_path(m, f)
        cur = sha_or_none(path)
        if cur is None or cur != f.get("sha_after"):
            continue
        res = _restore_state(m, f, path, cur, bdir, False, None)
        notes.append("deploy %s: its state file %s %s" % (m["id"], f["path"], res["action"]))
    return notes


def _final(pkg, p, state_real=None):
    """Hashes of the files the controller wants verified, read after the transaction (state files
    as "{state_dir}/files/<name>")."""
    out = {}
    for rel in p.get("verify_paths", []):
        try:
            out[rel] = sha256_file(os.path.join(pkg, rel))
        except OSError:
            out[rel] = None
    for sf in p.get("state_files") or []:
        rel = state_rel(sf.get("name"))
        out["{state_dir}/" + rel] = sha_or_none(os.path.join(state_real or os.path.realpath(expand(p["state_dir"])),
                                                              rel))
    return out


def _why(e):
    if isinstance(e, AgentError):
        return str(e)
    if isinstance(e, OSError) and e.strerror:
        return "%s%s" % (e.strerror, ": %s" % e.filename if e.filename else "")
    return "%s: %s" % (e.__class__.__name__, e)


def _close_unchanged(sd, m, bdir, e):
    """A deploy that failed before changing any package file: drop its partial backups and record
    it as failed-unchanged (best effort: if even that cannot be written, it stays open and the next
    deploy or rollback closes it, restoring nothing)."""
    import shutil
    shutil.rmtree(bdir, ignore_errors=True)
    for f in m["files"]:
        f["backed_up"] = False
    m["state"] = "failed-unchanged"
    m["note"] = _why(e)
    try:
        save_manifest(sd, m)
    except Exception:
        m["state"] = "preparing"


def _pycache_prefixes(p):
    """The pycache prefix the launch's python uses (PYTHONPYCACHEPREFIX, -X pycache_prefix), asked of
    that python itself with the launch's environment (the probe); [] without a launch."""
    launch = p.get("launch")
    if not launch:
        return []
    got = run_probe(launch)
    return [got["pycache_prefix"]] if got.get("pycache_prefix") else []


def _shown_paths(pkg, paths):
    """Paths as a note shows them: relative to the package dir when inside it (short, so a table
    cell does not cut them mid-word), else as they are (a PYTHONPYCACHEPREFIX tree)."""
    base = pkg.rstrip("/") + "/"
    return ", ".join(x[len(base):] if x.startswith(base) else x for x in paths)


def _drop_stale(pkg, rels, prefixes):
    """Remove the cached bytecode of files the deploy does not replace (the controller found it
    stale: import would run it instead of the file). Returns notes."""
    removed = []
    for rel in rels or []:
        drop_bytecode(safe_target(pkg, rel), prefixes, removed)
    if not removed:
        return []
    return ["removed %d stale cached bytecode file(s): %s" % (len(removed), _shown_paths(pkg, removed))]


def _deployed(p, res):
    """A deploy's answer, after the DEPLOY_HOOKS (still under the host lock)."""
    for hook in DEPLOY_HOOKS:
        hook(p, res)
    return res


def _check_shared_dir(sd, pkg):
    """A shared tree's records dir is the one beside that tree: nothing else is ever trusted so."""
    if not pkg or os.path.realpath(expand(sd)) not in [os.path.realpath(d) for d in tree_records_dirs(pkg)]:
        raise AgentError("%s is not the records dir of the tree %s" % (sd, pkg), "bad_input")
    mark_shared(sd, pkg)


def action_deploy(p):
    """Apply one host's planned files in one transaction: all intended, or all original."""
    sd = p["state_dir"]
    did = p["deploy_id"]
    pkg = p["package_dir"]
    kind = p.get("kind") or "deploy"
    if kind not in ("deploy", "restore-pristine"):
        raise AgentError("bad kind %r" % kind, "bad_input")
    if p.get("shared_tree"):
        _check_shared_dir(sd, pkg)
    notes = acquire_lock(sd, "deploy" if kind == "deploy" else "rollback", did, p.get("by", "?"), p)
    try:
        fault_point(p, "locked")
        if p.get("shared_tree"):
            ensure_tree_id(sd)
        notes += close_superseded(sd, os.path.realpath(pkg), p.get("version"))
        notes += recover_interrupted(sd)
        _check_unchanged_since_plan(pkg, p.get("expect") or {})
        plan = _read_planned_files(pkg, p["files"])
        # the playbook's non-package files, under <state_dir>/files/: only those not already as intended
        state_real = os.path.realpath(expand(sd))
        splan = _state_files_to_write(state_real, p.get("state_files") or [])
        if not plan and not splan:
            notes += _drop_stale(pkg, p.get("drop_bytecode"), _pycache_prefixes(p) if p.get("drop_bytecode") else [])
            return _deployed(p, {"deploy_id": None, "files": [], "notes": notes, "final": _final(pkg, p)})
        ddir = os.path.dirname(manifest_path(sd, did, p.get("host")))
        if os.path.exists(ddir):
            raise AgentError("deploy %s already exists on this host" % did, "bad_input")
        makedirs_private(os.path.join(ddir, "backup"))
        m = _new_deploy_manifest(p, kind, pkg, plan, splan, state_real)
        save_manifest(sd, m)
        fault_point(p, "before_backup")
        _back_up_planned(sd, m, plan, os.path.join(ddir, "backup"))
        fault_point(p, "after_backup")
        pyc = _apply_planned(p, sd, m, plan, splan, state_real)
        m["state"] = "complete" if kind == "deploy" else "restored-pristine"
        save_manifest(sd, m)
        fault_point(p, "after_complete")
        if pyc["removed"]:
            notes.append("removed %d cached bytecode file(s) of the replaced sources: %s"
                         % (len(pyc["removed"]), _shown_paths(pkg, pyc["removed"])))
        notes += _drop_stale(pkg, p.get("drop_bytecode"), m["pycache_prefixes"])
        return _deployed(p, {"deploy_id": did, "files": [{"path": x["path"], "sha_after": x["sha_after"]}
                                                         for x in m["files"]],
                             "notes": notes, "final": _final(pkg, p, state_real)})
    finally:
        release_lock(sd)


def _check_unchanged_since_plan(pkg, expect):
    """What the plan saw for the files it does not change must still hold, now, under the lock: a
    deploy never reports a host "as intended" from facts read before a concurrent rollback."""
    for rel, want in sorted(expect.items()):
        try:
            now = sha256_file(safe_target(pkg, rel))
        except FileNotFoundError:
            now = None
        if now != want:
            raise AgentError("%s changed since the plan (now %s, planned against %s; a concurrent rollback or "
                             "deploy?); nothing was changed; run deploy again"
                             % (rel, (now or "missing")[:12], (want or "missing")[:12]), "changed")


def _read_planned_files(pkg, files):
    """[(file, path, stat, bytes)] of each planned package file, read once, under the lock: these bytes
    are checked against the plan and are the backup."""
    plan = []
    for f in files:
        path = safe_target(pkg, f["path"])
        try:
            with open(path, "rb") as fh:
                st = os.fstat(fh.fileno())
                old = fh.read()
        except FileNotFoundError:
            raise AgentError("%s: missing on the host" % f["path"], "missing") from None
        cur = sha256_new(old).hexdigest()
        if cur != f["sha_before"]:
            raise AgentError("%s changed since the plan (now %s, planned against %s); run deploy --check again"
                             % (f["path"], cur[:12], f["sha_before"][:12]), "changed")
        plan.append((f, path, st, old))
    return plan


def _state_files_to_write(state_real, state_files):
    """[(state file, rel, path)] of the playbook's state files not already as intended."""
    splan = []
    for sf in state_files:
        rel = state_rel(sf.get("name"))
        spath = state_target(state_real, rel)
        if os.path.isdir(spath):
            raise AgentError("{state_dir}/%s is a directory; nothing was changed" % rel, "bad_input")
        if sha_or_none(spath) != sf["sha_after"]:
            splan.append((sf, rel, spath))
    return splan


def _new_deploy_manifest(p, kind, pkg, plan, splan, state_real):
    """The deploy's manifest as first saved ('preparing'): every file it will write, pending."""
    m = {"id": p["deploy_id"], "kind": kind, "state": "preparing", "created": time.time(),
         "package_dir": os.path.realpath(pkg), "package_real": os.path.realpath(pkg), "package_located": pkg,
         "writer": writer_identity(), "version": p.get("version"), "playbook": p.get("playbook"), "by": p.get("by"),
         "host": p.get("host"), "files": [], "pycache_prefixes": _pycache_prefixes(p), "state_real": state_real}
    if isinstance(p.get("container"), dict):  # the container it patched (its id: re-creation loses the patch)
        m["container"] = p["container"]
    for f, path, st, _ in plan:
        m["files"].append({"path": f["path"], "sha_before": f["sha_before"], "sha_after": f["sha_after"],
                           "mode": stat.S_IMODE(st.st_mode), "uid": st.st_uid, "gid": st.st_gid,
                           "status": "pending", "backed_up": False})
    for sf, rel, spath in splan:  # (sha_before None: the deploy creates it; rollback removes it)
        m["files"].append({"path": "{state_dir}/" + rel, "root": "state", "rel": rel,
                           "sha_before": sha_or_none(spath), "sha_after": sf["sha_after"],
                           "mode": int(sf.get("mode", 0o644)) & 0o777, "uid": None, "gid": None,
                           "status": "pending", "backed_up": False})
    return m


def _back_up_planned(sd, m, plan, bdir):
    """Copy what each file of the manifest holds now into `bdir`, then mark the manifest 'applying';
    on failure nothing in the package was touched: the record is closed and the space freed."""
    try:
        for entry, (f, path, st, old) in zip(m["files"], plan):  # (the bytes checked above)
            dst = os.path.join(bdir, f["path"])
            makedirs_private(os.path.dirname(dst))
            write_atomic(dst, old, 0o600)
            entry["backed_up"] = True
        for entry in m["files"][len(plan):]:  # state files: a copy of what was there, if anything
            if entry["sha_before"] is not None:
                dst = os.path.join(bdir, "_state", entry["rel"])
                makedirs_private(os.path.dirname(dst))
                with open(entry_path(m, entry), "rb") as src:
                    data = src.read()
                if sha256_new(data).hexdigest() != entry["sha_before"]:
                    raise AgentError("%s changed while backing up" % entry["path"], "changed")
                write_atomic(dst, data, 0o600)
            entry["backed_up"] = True
        m["state"] = "applying"
        save_manifest(sd, m)
    except Exception as e:
        _close_unchanged(sd, m, bdir, e)
        raise AgentError("%s: %s; nothing was changed on the host"
                         % ("backing up" if m["state"] == "failed-unchanged" else "saving the manifest",
                            _why(e)), getattr(e, "kind", "failed")) from None


def _apply_planned(p, sd, m, plan, splan, state_real):
    """Write every planned file (package files, then state files), the manifest saved after each; on
    any failure the backed-up files are put back and the deploy fails. The bytecode removed: `pyc`."""
    # the intended bytes are the same on every host of a version: the controller compiled them
    # once with its own Python; a host whose Python has the same grammar (major.minor) need not
    # compile them again; any other Python checks them itself before the rename
    validate = p.get("validate", True) and p.get("validated_by") != "%d.%d" % sys.version_info[:2]
    done = 0
    pyc = {"prefixes": m["pycache_prefixes"], "removed": []}
    try:
        for entry, (f, path, st, _) in zip(m["files"], plan):
            if done:
                fault_point(p, "between_renames", done)
            data = f["content"]  # raw bytes (marshal carries them)
            replace_file(path, data, entry["mode"], entry["uid"], entry["gid"], f["sha_after"],
                         validate_python=validate,
                         hook=lambda k=done + 1: fault_point(p, "mid_write", k), pyc=pyc)
            entry["status"] = "applied"
            save_manifest(sd, m)
            done += 1
            fault_point(p, "applied", done)
        for entry, (sf, rel, spath) in zip(m["files"][len(plan):], splan):
            if done:
                fault_point(p, "between_renames", done)
            replace_file(state_target(state_real, rel), sf["content"], entry["mode"],
                         None, None, sf["sha_after"], validate_python=False,
                         hook=lambda k=done + 1: fault_point(p, "mid_write", k))
            entry["status"] = "applied"
            save_manifest(sd, m)
            done += 1
            fault_point(p, "applied", done)
        fault_point(p, "before_complete")
    except BaseException as e:
        res = _restore_files(sd, m, [x for x in m["files"] if x["backed_up"]], force=True)
        m["state"] = "failed-restored"
        m["note"] = str(e)
        save_manifest(sd, m)
        raise AgentError("%s; the host was restored to its original files (%d restored)"
                         % (e, sum(1 for r in res if r["action"] == "restored")), getattr(e, "kind", "failed")) from None
    return pyc


def action_rollback(p):
    """Undo the named deploys, newest first, restoring their recorded original bytes."""
    sd = p["state_dir"]
    force = bool(p.get("force"))
    if p.get("shared_tree"):
        _check_shared_dir(sd, p["shared_tree"] if isinstance(p["shared_tree"], str) else p.get("package_dir"))
    notes = acquire_lock(sd, "rollback", p.get("rollback_id"), p.get("by", "?"), p)
    try:
        fault_point(p, "locked")
        cur_real = None
        if "engine" in p:  # where this python imports the package from now (what a restore must not miss)
            # (the launch's python when the controller sends the launch, as facts located it)
            cur_real, cur_version = current_tree(locate_package(p["engine"], p.get("package_dir"), p.get("launch"),
                                                                 strict=False))
            notes += close_superseded(sd, cur_real, cur_version)
        notes += recover_interrupted(sd)
        expect = p.get("expect_live")
        live_now = live_deploys(sd, p.get("entry"), cur_real)
        if expect is not None and live_now != list(expect):
            # the plan was made from facts read without the lock: what it would undo is not what is here now
            raise AgentError("the deploys on this host changed since the plan (planned against %s, now %s; a "
                             "concurrent deploy?); nothing was changed; run rollback again"
                             % (", ".join(expect) or "none", ", ".join(live_now) or "none"), "changed")
        done = []
        for did in p["deploy_ids"]:
            try:
                m = load_manifest(sd, did, p.get("entry"))
            except FileNotFoundError:
                raise AgentError("no deploy %s on this host" % did, "bad_input") from None
            if m.get("state") not in ("complete",):
                done.append({"deploy_id": did, "state": m.get("state"), "files": [], "skipped": True})
                continue
            tree = manifest_tree(m)
            if cur_real and tree and os.path.realpath(tree) != cur_real and not p.get("old_tree"):
                raise AgentError("deploy %s patched %s; this python now imports %s; nothing was changed; rerun "
                                 "with --old-tree to restore %s anyway" % (did, tree, cur_real, tree), "moved")
            entries = [f for f in m["files"] if f.get("status") == "applied"]
            # check everything first: refuse before changing anything
            pre = []
            for f in entries:
                if not is_state(f):
                    safe_target(m["package_dir"], f["path"])
                try:
                    cur = sha256_file(entry_path(m, f))
                except FileNotFoundError:
                    cur = None
                if cur not in (f["sha_after"], f["sha_before"]) and not force:
                    pre.append("%s changed since deploy %s (now %s)" % (f["path"], did, (cur or "missing")[:12]))
            if pre:
                raise AgentError(pre[0] + "; rerun with --force to overwrite it (a copy is kept)", "drifted")
            m["state"] = "rolling-back"
            save_manifest(sd, m)
            fault_point(p, "before_restore")
            forced_dir = os.path.join(os.path.dirname(manifest_path(sd, did, m.get("host"))),
                                      "forced-%d" % int(time.time()))
            res = _restore_files(sd, m, entries, force=force, forced_dir=forced_dir, p=p)
            fault_point(p, "before_complete")
            m["state"] = "rolled-back"
            m["rolled_back_at"] = time.time()
            m["rolled_back_by"] = p.get("by")
            save_manifest(sd, m)
            done.append({"deploy_id": did, "state": "rolled-back", "files": res})
        fault_point(p, "after_complete")
        return {"rollbacks": done, "notes": notes}
    finally:
        release_lock(sd)


def action_read_files(p):
    from binascii import b2a_base64
    pkg = p["package_dir"]
    out = {}
    for rel in p["paths"]:
        path = safe_target(pkg, rel)
        try:
            with open(path, "rb") as fh:
                out[rel] = b2a_base64(fh.read(), newline=False).decode()
        except FileNotFoundError:
            out[rel] = None
    return out


ACTIONS.update({"deploy": action_deploy, "rollback": action_rollback, "read_files": action_read_files})
