"""Agent part: the records of the deploy state: manifests (one per deploy, how far it got), the
state files a playbook ships beside the package, the records of a package tree shared by several
hosts, and the `state` facts that report them (lock, deploys, what is still on disk).
"""

import os
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.atomic import write_atomic
    from fleetctl.remote.core import AgentError, expand, jdumps, read_json_file, sha256_file
    from fleetctl.remote.files import makedirs_private, unwritable
    from fleetctl.remote.hostfacts import EXTRA_FACTS
    from fleetctl.remote.lock import (
        describe_writer,
        ident_of,
        machine_identity,
        read_first_line,
        read_lock,
        same_machine,
        state_paths,
    )



# no json, re, hashlib or signal here (core.py says why): jdumps/read_json_file, sha256_new, plain
# string checks, and `signal` imported where a process is signalled

MANIFEST = "manifest.json"
OPEN_STATES = ("preparing", "applying", "rolling-back")


# ----------------------------------------------------------------------------- state files
# A playbook's non-package files live under <state_dir>/files/<name>; they are deployed and rolled
# back in the same transaction as the package files. A manifest entry of one has "root": "state",
# "rel": "files/<name>" and, as its path, "{state_dir}/files/<name>" (never a package path).

STATE_FILES = "files"
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")


def _state_name_ok(name):
    """1-4 parts joined by /, each 1-100 of letters, digits, _ . - not starting with . or -."""
    parts = name.split("/")
    return len(parts) <= 4 and all(0 < len(x) <= 100 and x[0] not in ".-" and _NAME_CHARS.issuperset(x)
                                   for x in parts)


def state_rel(name):
    if not isinstance(name, str) or not _state_name_ok(name) or ".." in name.split("/"):
        raise AgentError("state file name %r: use letters, digits and _ . - in at most 4 parts" % (name,),
                         "bad_input")
    return STATE_FILES + "/" + name


def is_state(f):
    return f.get("root") == "state"


def entry_path(m, f):
    """The absolute path a manifest entry names (a package file, or a state file)."""
    if is_state(f):
        return os.path.join(m["state_real"], f["rel"])
    return os.path.join(m["package_dir"], f["path"])


def state_target(state_real, rel):
    """Absolute path of a state file, its directories created 0700; refuses symlinks on the way."""
    path = os.path.join(state_real, rel)
    makedirs_private(os.path.dirname(path))
    real = os.path.realpath(path)
    if not real.startswith(os.path.realpath(state_real) + os.sep) or os.path.islink(path):
        raise AgentError("%s: resolves outside the state dir or is a symlink; refusing to write it" % rel,
                         "bad_input")
    return path


# ----------------------------------------------------------------------------- shared trees
#
# One package tree may be reached by several inventory entries: two entries for one machine, or
# several machines mounting one tree (NFS, a shared venv). Such a tree is deployed and rolled back
# once, and its records (lock, manifests, backups) then live next to it, where every host that
# reaches the tree can read them: <dir of the package>/.fleetctl-tree-<name>/ (a dot-dir, never
# importable). Every machine's manifests there are about that one tree, so none is "foreign" there.
# Its `id` file (random, written by the first deploy that records there) names the tree: two
# machines whose trees merely have equal inode numbers read different ids (or none).

TREE_DIR_PREFIX = ".fleetctl-tree-"
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "9p",
              "virtiofs", "afs", "ocfs2", "gfs2", "panfs", "wekafs", "fuse")
_SHARED_DIRS = {}  # real path of a shared tree's records dir -> that tree's real path as this host sees it


TREE_DIR_INSIDE = ".fleetctl-tree"


def tree_records_dir(pkg_dir):
    """Beside the package dir: where a shared tree keeps its records when its parent is shared too."""
    real = os.path.realpath(pkg_dir)
    return os.path.join(os.path.dirname(real), TREE_DIR_PREFIX + os.path.basename(real))


def tree_records_dirs(pkg_dir):
    """Both places a shared tree's records may be: beside it, or inside it (when a host mounts the
    package dir itself, its parent is not shared: the controller then chooses inside)."""
    real = os.path.realpath(pkg_dir)
    return [tree_records_dir(real), os.path.join(real, TREE_DIR_INSIDE)]


def mark_shared(state_dir, tree_real):
    _SHARED_DIRS[os.path.realpath(expand(state_dir))] = os.path.realpath(tree_real)


def is_shared(state_dir):
    return bool(_SHARED_DIRS) and os.path.realpath(expand(state_dir)) in _SHARED_DIRS


def _as_seen_here(state_dir, m):
    """A manifest of a shared tree's records dir is about that tree, wherever this host mounts it: its
    package paths are this host's path of the tree (another host may reach it by another path)."""
    tree = _SHARED_DIRS.get(os.path.realpath(expand(state_dir))) if _SHARED_DIRS else None
    if tree and isinstance(m, dict):
        m["package_dir"] = m["package_real"] = tree
    return m


def _unescape_mount(s):
    return s.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mount_of(path):
    """(fstype, source, mount point) of the mount holding `path` (/proc/self/mountinfo; Nones if unknown)."""
    best = (None, None, None)
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            raw = fh.read(4 << 20)
    except OSError:
        return best
    for line in raw.decode("utf-8", "replace").splitlines():
        left, sep, right = line.partition(" - ")
        a, b = left.split(), right.split()
        if not sep or len(a) < 5 or len(b) < 2:
            continue
        mp = _unescape_mount(a[4])
        if (path == mp or path.startswith(mp.rstrip("/") + "/")) and (best[2] is None or len(mp) >= len(best[2])):
            best = (b[0], _unescape_mount(b[1]), mp)
    return best


def tree_identity(pkg_dir):
    """What tells this package tree apart from every other, on this machine or another: its real path,
    device and inode, the mount it is on (a network filesystem: its source), this machine (boot id:
    new at every boot, never equal on two machines) and the tree's id if its records dir has one."""
    real = os.path.realpath(pkg_dir)
    try:
        st = os.stat(real)
    except OSError:
        return None
    fs, source, mp = mount_of(real)
    me = machine_identity()
    dirs = tree_records_dirs(real)
    tid = None
    for d in dirs:
        tid = tid or read_first_line(os.path.join(d, "id"))
    out = {"real": real, "dev": st.st_dev, "ino": st.st_ino, "fs": fs, "source": source, "mount": mp,
           "boot_id": me.get("boot_id"), "machine_id": me.get("machine_id"), "hostname": me.get("hostname"),
           "records_dir": dirs[1] if mp == real else dirs[0], "mount_root": mp == real, "id": tid}
    out["network"] = bool(fs) and (fs in NETWORK_FS or fs.split(".")[0] in NETWORK_FS)
    return out


def ensure_tree_id(state_dir):
    """The shared tree's id file, created once (atomically) in its records dir."""
    path = os.path.join(expand(state_dir), "id")
    if read_first_line(path):
        return
    try:
        write_atomic(path, (os.urandom(16).hex() + "\n").encode(), 0o644, link=True)
    except FileExistsError:
        pass


# ----------------------------------------------------------------------------- manifests


def _check_id(deploy_id):
    if not deploy_id or "/" in deploy_id or deploy_id.startswith(".") or "@" in deploy_id:
        raise AgentError("bad deploy id %r" % deploy_id, "bad_input")


def _host_tag():
    return "".join(c if c in _NAME_CHARS else "_" for c in machine_identity()["hostname"] or "unknown")


def deploy_dir(state_dir, deploy_id, entry=None):
    """This machine's directory for `deploy_id`: deploys/<id>, or deploys/<id>@<hostname> when a
    state dir shared with another machine already holds that machine's deploys/<id>, or
    deploys/<id>%<entry> when another inventory entry of this machine (one state dir, another
    tree) already holds deploys/<id> from the same command."""
    _check_id(deploy_id)
    _, deploys, _ = state_paths(state_dir)
    base = os.path.join(deploys, deploy_id)
    mine = "%s@%s" % (base, _host_tag())
    if os.path.isdir(mine):
        return mine
    ent = "%s%%%s" % (base, "".join(c if c in _NAME_CHARS else "_" for c in entry)) if entry else None
    if ent and os.path.isdir(ent):
        return ent
    try:
        m = read_json_file(os.path.join(base, MANIFEST))
    except (OSError, ValueError):
        return base
    if not isinstance(m, dict):
        return base
    if not is_shared(state_dir) and not same_machine(ident_of(m)):
        return mine
    if ent and m.get("host") and m.get("host") != entry and not is_shared(state_dir):
        return ent
    return base


def manifest_path(state_dir, deploy_id, entry=None):
    return os.path.join(deploy_dir(state_dir, deploy_id, entry), MANIFEST)


def load_manifest(state_dir, deploy_id, entry=None):
    m = _as_seen_here(state_dir, read_json_file(manifest_path(state_dir, deploy_id, entry)))
    if not is_shared(state_dir) and not same_machine(ident_of(m)):  # (deploy_dir never names another machine's; belt and braces)
        raise FileNotFoundError(deploy_id)
    return m


_SAVED_AT = {}  # (state dir, deploy id, created) -> where that manifest was saved by this process


def save_manifest(state_dir, m):
    m["updated"] = time.time()
    # a manifest's dir is fixed for its life: found once (deploy_dir reads the manifest there), then
    # kept for the deploy's later saves
    key = (state_dir, m.get("id"), m.get("created"))
    path = _SAVED_AT.get(key) or manifest_path(state_dir, m["id"], m.get("host"))
    # compact (json's C encoder): a deploy saves its manifest six times, under the lock
    write_atomic(path, jdumps(m, sort_keys=True).encode())
    _SAVED_AT[key] = path


def list_manifests(state_dir, include_foreign=False):
    """Every deploy manifest in the state dir, oldest first: only this machine's unless asked (a host
    never acts on a manifest another machine wrote into a shared state dir)."""
    _, deploys, _ = state_paths(state_dir)
    out = []
    try:
        names = os.listdir(deploys)
    except OSError:
        return out
    me = machine_identity()
    shared = is_shared(state_dir)
    for name in names:
        try:
            m = _as_seen_here(state_dir, read_json_file(os.path.join(deploys, name, MANIFEST)))
        except (OSError, ValueError):
            continue
        if not isinstance(m, dict) or not isinstance(m.get("id"), str) or not isinstance(m.get("files"), list) \
                or not all(isinstance(f, dict) and isinstance(f.get("path"), str) for f in m["files"]):
            continue  # not a manifest this agent wrote: never acted on
        if not shared and not same_machine(ident_of(m), me):
            if not include_foreign:
                continue
            m["_foreign"] = describe_writer(ident_of(m))
        out.append(m)
    out.sort(key=lambda m: (m.get("created", 0), m.get("id", "")))
    return out


def manifest_tree(m):
    """The real package dir the deploy wrote into (recorded since manifests record it; else as located)."""
    return m.get("package_real") or m.get("package_dir")


def gone_reason(m, cur_real, cur_version, hashes=None):
    """Why a complete (or interrupted) deploy is no longer on disk (None: it is). Its tree now holds
    another release, or every file a complete deploy patched holds its original bytes again (the
    package was reinstalled). Its backups then belong to another release: never to be written back."""
    if m.get("state") not in ("complete", *OPEN_STATES) or m.get("kind", "deploy") != "deploy":
        return None
    tree = manifest_tree(m)
    if cur_real and tree and os.path.realpath(tree) == cur_real and m.get("version") and cur_version \
            and m.get("version") != cur_version:
        return "package reinstalled/upgraded: it patched sglang %s, %s now holds %s" % (
            m.get("version"), cur_real, cur_version)
    if m.get("state") != "complete":
        return None
    applied = [f for f in m.get("files", []) if f.get("status") == "applied" and not is_state(f)]
    if not applied:
        return None
    for f in applied:
        if hashes is not None:
            now = hashes.get(f["path"])
        else:
            try:
                now = sha256_file(os.path.join(tree, f["path"]))
            except OSError:
                now = None
        if now != f.get("sha_before"):
            return None
    return "package reinstalled/upgraded: every file it patched holds its original bytes again"


def manifest_summary(m, pkg_dir=None, cur_real=None, cur_version=None):
    files = []
    tree = manifest_tree(m) or pkg_dir
    hashes = {}
    for f in m.get("files", []):
        cur = None
        if is_state(f) and not m.get("_foreign"):
            try:
                cur = sha256_file(entry_path(m, f))
            except OSError:
                cur = None
        elif tree and not m.get("_foreign"):
            try:
                cur = sha256_file(os.path.join(tree, f["path"]))
            except OSError:
                cur = None
        hashes[f["path"]] = cur
        files.append({"path": f["path"], "sha_before": f.get("sha_before"), "sha_after": f.get("sha_after"),
                      "status": f.get("status"), "sha_now": cur})
    out = dict((k, m.get(k)) for k in ("id", "state", "created", "updated", "package_dir", "version", "playbook",
                                       "by", "rolled_back_at", "note", "package_real", "host",
                                       "container"))
    out["kind"] = m.get("kind", "deploy")
    out["files"] = files  # (no dict `|`: the agent runs on Python >= 3.8)
    if m.get("_foreign"):
        out["foreign"] = m["_foreign"]
        return out
    gone = gone_reason(m, cur_real, cur_version, hashes)  # (what close_superseded will find, under the lock)
    if gone:
        out["gone"] = gone
    elif cur_real and tree and os.path.realpath(tree) != cur_real:
        out["moved"] = {"patched": tree, "imports_now": cur_real}
    return out


def current_tree(sg):
    if not sg or not sg.get("found") or not sg.get("dir"):
        return None, None
    return os.path.realpath(sg["dir"]), sg.get("version")


def state_facts(p, sg):
    """Extra facts: lock holder and every manifest with the current hash of its files, each marked
    if another machine wrote it (`foreign`), if this python now imports another tree than the one it
    patched (`moved`), or if its patch is no longer on disk (`gone`)."""
    sd = p.get("state_dir") or "~/.fleetctl"
    cur_real, cur_version = current_tree(sg)
    out = {"lock": read_lock(sd),
           "deploys": [manifest_summary(m, cur_real=cur_real, cur_version=cur_version)
                       for m in list_manifests(sd, include_foreign=True)],
           "state_dir": expand(sd), "machine": describe_writer(machine_identity()), "package_real": cur_real}
    why = unwritable(expand(sd), "it")
    if why:
        out["unwritable"] = why
    if cur_real:
        out["tree"] = tree_identity(cur_real)
        for rdir in tree_records_dirs(cur_real):
            if os.path.isdir(rdir) and os.path.realpath(rdir) != os.path.realpath(expand(sd)):
                mark_shared(rdir, cur_real)
                for m in list_manifests(rdir):
                    ms = manifest_summary(m, cur_real=cur_real, cur_version=cur_version)
                    ms["shared"] = rdir
                    out["deploys"].append(ms)
                out["tree_lock"] = out.get("tree_lock") or read_lock(rdir)
    return out


EXTRA_FACTS["state"] = state_facts


def last_container_deploy(state_dir):
    """The newest complete deploy that recorded the container it patched, any writer's (a re-created
    container is another hostname): {"id", "container"}; None if there is none."""
    for m in reversed(list_manifests(state_dir, include_foreign=True)):
        if m.get("state") == "complete" and m.get("kind", "deploy") == "deploy" \
                and isinstance(m.get("container"), dict):
            return {"id": m.get("id"), "container": m["container"]}
    return None


def live_deploys(state_dir, entry=None, cur_real=None):
    """Ids of this machine's complete deploys (what a rollback would undo), oldest first; with the
    asking inventory entry and its tree, not another entry's deploys of another tree."""
    return [m["id"] for m in list_manifests(state_dir)
            if m.get("state") == "complete" and m.get("kind", "deploy") == "deploy"
            and not (entry and cur_real and m.get("host") and m.get("host") != entry
                     and manifest_tree(m) and os.path.realpath(manifest_tree(m)) != cur_real)]
