"""Agent part: the seal of a deploy's verdict, so that the next no-op deploy can be re-checked with
one `stat` + `sha256sum` on the host instead of a Python start (fleetctl/ops/seal.py, the controller's
half, says how a seal is used).

A seal is asked for (`seal: true` in the facts and deploy requests) and made only when the launch's
python was asked in this session (in this process when same_start holds, else in a process of its
own under the launch's options, env and cwd, which reports its sys.path, the module files it had
loaded at start and its user site) and the launch's interpreter word leads to that interpreter
itself (no wrapper script): then everything that decided where the launch imports the package from
is a path that can be named. At the end of a deploy, still under the
host lock: if the deploy changed nothing, the snapshot taken right after this session's facts still
matches and every path's ctime is older than those facts (by QUIET_NS), the facts are sealed as they
are; otherwise the facts are computed again, bracketed by two snapshots of those paths, and only if
the two are identical (and name the same paths) is the seal returned. Either way the facts describe
exactly the state the snapshot shows. A snapshot is, per path, what `stat --printf='%n\t%d %i %s %f %.9Z %.9Y\n'`
prints (device, inode, size, mode, ctime and mtime in ns; nothing for a path that does not exist) and,
per hashed file, what `sha256sum` prints: the controller later runs exactly those two commands and
compares the text byte for byte. ctime cannot be set back by a user (touch sets mtime only) and
changes with every write, rename, link or chmod; a directory's changes when an entry is added,
removed or renamed in it (how Python's own import cache notices new modules).

The paths: the launch interpreter's PATH lookup (each PATH dir up to the one that holds it, the
word in each), the interpreter, its real path and pyvenv.cfg; every sys.path entry of the launch and
every .pth file in those dirs; the user site dir; every module file loaded in this process (site,
sitecustomize and whatever a .pth imported); the package dir, its __init__, version files and
dist-info; each planned file, the dirs between it and the package, its __pycache__ dir and pycs; torch's
dist-info; the model config.json the launch would read (and the HF cache ref leading to it); the
launch's cwd; the host lock and every deploy manifest in the state dir; /etc/os-release.
"""

import os
import sys
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import REREAD, expand, sha256_file, sha256_new
    from fleetctl.remote.hostfacts import FACTS_HOOKS, action_facts, home_of, hub_cache_dir
    from fleetctl.remote.locate import (
        LAST_PROBE,
        find_dist_info,
        launch_cwd,
        launch_environment,
        launch_path0,
    )
    from fleetctl.remote.lock import state_paths
    from fleetctl.remote.records import state_rel
    from fleetctl.remote.transaction import DEPLOY_HOOKS



SEAL_MAX_PATHS = 4000
_SEAL = {}  # this session's last facts request, made with `seal`


def _stat_line(path, newest=None):
    """What `stat --printf='%n\\t%d %i %s %f %.9Z %.9Y\\n' PATH` prints (lstat: a symlink itself).
    newest: a one-item list kept at the largest ctime seen."""
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return ""
    c, m = st.st_ctime_ns, st.st_mtime_ns
    if newest is not None and c > newest[0]:
        newest[0] = c
    return "%s\t%d %d %d %x %d.%09d %d.%09d\n" % (path, st.st_dev, st.st_ino, st.st_size, st.st_mode,
                                                  c // 1000000000, c % 1000000000, m // 1000000000, m % 1000000000)


def _sha_line(path):
    """What `sha256sum PATH` prints for a regular file (nothing for a missing one)."""
    try:
        return "%s  %s\n" % (sha256_file(path), path)
    except (OSError, ValueError):
        return ""


def snapshot(paths, files, held=(), newest=None):
    """`held`: paths that are there only because this agent holds them (the host lock): shown as
    absent, the state the check must find. `files` are hashed here (the playbook's state files);
    the planned package files' lines come from the facts' own hashes (sha_text), read between two
    equal snapshots."""
    return {"stat": "".join(_stat_line(p, newest) for p in paths if p not in held),
            "sha": "".join(_sha_line(f) for f in files)}


def sha_text(facts, files):
    """What `sha256sum FILES` prints for the planned files, from the facts' hashes of them."""
    pkg = os.path.abspath((facts.get("package") or {}).get("dir") or "/")
    known = facts.get("files") or {}
    out = []
    for f in files:
        info = known.get(f[len(pkg) + 1:]) if f.startswith(pkg + "/") else None
        if isinstance(info, dict) and info.get("exists") and info.get("sha256"):
            out.append("%s  %s\n" % (info["sha256"], f))
    return "".join(out)


def _links(path, limit=40):
    """`path`, every symlink met resolving it (in its dirs and at its end) and the file it ends at."""
    out = [path]
    cur = os.path.abspath(path)
    for _ in range(limit):
        parts = cur.split("/")
        hop = None
        for i in range(2, len(parts) + 1):
            pre = "/".join(parts[:i])
            if os.path.islink(pre):
                hop = pre
                break
        if hop is None:
            break
        out.append(hop)
        cur = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop), cur[len(hop) + 1:]))
    out.append(cur)
    return out


def _usable(path):
    # the controller compares text: no name that stat/sha256sum would escape or a line could hide
    return isinstance(path, str) and path.startswith("/") and not any(c in path for c in "\n\r\t\\\x00")


def seal_paths(p, res, head=None):
    """(paths, files) whose snapshot seals this facts answer, or (None, why not). head: _seal_head's
    result for this same answer, computed earlier (the records part is always read now)."""
    got, why = head if head is not None else _seal_head(p, res)
    if got is None:
        return None, why
    paths, files = list(got[0]), got[1]
    add = paths.append
    _, deploys, lock = state_paths(p.get("state_dir") or "~/.fleetctl")
    add(lock)
    add(deploys)
    try:
        for n in sorted(os.listdir(deploys)):
            add(os.path.join(deploys, n))
            add(os.path.join(deploys, n, "manifest.json"))
    except OSError:
        pass
    add("/etc/os-release")
    seen = set()
    out = []
    for x in paths:
        if x not in seen:
            seen.add(x)
            out.append(x)
    if len(out) > SEAL_MAX_PATHS:
        return None, "more than %d paths decide this host's answer" % SEAL_MAX_PATHS
    bad = [x for x in out + files if not _usable(x)]
    if bad:
        return None, "a path the seal would name is not plain text: %r" % bad[0][:200]
    return (out, files), None


def _seal_head(p, res):
    """seal_paths' part that depends on the answer and the import system, not on the state dir's
    records: ((paths, files), None) or (None, why not)."""
    launch = p.get("launch")
    sg = res.get("package") or {}
    if not launch or not sg.get("found") or not sg.get("dir"):
        return None, "the package was not located"
    if sg.get("error") or res.get("state") is None:
        return None, "the facts were incomplete"
    env = launch_environment(launch)
    cwd = launch_cwd(launch.get("cwd"), env)
    path0 = launch_path0(launch, cwd)
    pr = LAST_PROBE
    if not pr.get("executable") or not pr.get("package_dir") \
            or os.path.realpath(pr["package_dir"]) != os.path.realpath(sg["dir"]):
        return None, "the launch's python was not asked in this session"
    # the module files loaded before the probe first ran (in this process or the launch's own): the
    # same list for the whole session, whatever this agent imports later
    startup = pr.get("startup")
    if not isinstance(startup, list):
        return None, "the launch's python did not say what it loaded at start"
    if pr.get("in_agent"):  # same_start: the launch's interpreter is this process's
        exe = sys.executable
        site = sys.modules.get("site")
        try:
            usersite = site.getusersitepackages() if site is not None else None
        except Exception:
            usersite = None
    else:  # asked in a process of its own, under the launch's options, env and cwd
        exe, usersite = pr["executable"], pr.get("usersite")
    paths = []
    add = paths.append
    why = _seal_interpreter_paths(paths, launch.get("interpreter") or "", env, cwd, exe)
    if why:
        return None, why
    add(cwd)
    if path0:
        add(path0)
    if isinstance(usersite, str) and usersite:
        add(usersite)
    _seal_import_path(paths, (sg.get("launch") or {}).get("path") or sys.path, cwd)
    for f in startup:
        if isinstance(f, str) and f:
            add(os.path.abspath(f))
    files = _seal_package_paths(paths, sg, res)
    _seal_model_paths(paths, p.get("model") or {}, res, env, cwd)
    for named in p.get("launch_files") or []:  # files the launch's flags name (an adaptive config)
        if isinstance(named, str) and named:
            full = os.path.normpath(os.path.join(cwd, named))
            add(os.path.dirname(full))
            add(full)
    return (paths, files), None


def _seal_interpreter_paths(paths, word, env, cwd, exe):
    """Add what finding the launch's interpreter `word` reads (PATH's dirs up to it, its links, a
    venv's pyvenv.cfg) to `paths`; None, or why not when it is not the interpreter `exe` itself."""
    add = paths.append
    found = None
    if "/" in word:
        found = os.path.normpath(os.path.join(cwd, word))
        add(found)
    else:
        for d in (env.get("PATH") or os.environ.get("PATH") or "").split(os.pathsep):
            d = os.path.normpath(os.path.join(cwd, d or "."))
            add(d)
            add(os.path.join(d, word))
            if os.access(os.path.join(d, word), os.X_OK) and not os.path.isdir(os.path.join(d, word)):
                found = os.path.join(d, word)
                break
    if not found or not exe or os.path.realpath(found) != os.path.realpath(exe):
        # a wrapper or shim (pyenv, a module system, a site script) chooses the interpreter from
        # whatever it reads: that is not a path list anyone can name, so such a host is always asked
        return ("the launch's python %s is %s, a wrapper of the interpreter %s (what it reads to start "
                "it is not known)" % (word, found, exe))
    for x in (found, exe):
        for hop in _links(x):
            add(hop)
    for x in (os.path.join(os.path.dirname(exe), "pyvenv.cfg"),
              os.path.join(os.path.dirname(os.path.dirname(exe)), "pyvenv.cfg")):
        add(x)
    return None


def _seal_import_path(paths, spath, cwd):
    """Add each import path entry, its .pth files and torch's metadata to `paths`."""
    add = paths.append
    for e in spath:
        d = os.path.normpath(os.path.join(cwd, e or "."))
        add(d)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for n in names:
            if n.endswith(".pth") or (n.startswith("torch-") and n.endswith((".dist-info", ".egg-info"))):
                add(os.path.join(d, n))
                if n.endswith(".dist-info"):
                    add(os.path.join(d, n, "METADATA"))


def _seal_package_paths(paths, sg, res):
    """Add the package's own files, its metadata and each answered file with its bytecode to
    `paths`; the answered files' full paths."""
    add = paths.append
    pkg = os.path.abspath(sg["dir"])
    for x in (pkg, os.path.join(pkg, "__init__.py"), os.path.join(pkg, "_version.py"),
              os.path.join(pkg, "version.py")):
        add(x)
    dist = find_dist_info(os.path.dirname(pkg), os.path.basename(pkg))
    if dist:
        for x in (dist, os.path.join(dist, "METADATA"), os.path.join(dist, "direct_url.json")):
            add(x)
    files = []
    views = sg.get("bytecode") or {}
    for rel in sorted(res.get("files") or {}):
        full = os.path.join(pkg, rel)
        d = os.path.dirname(full)
        while len(d) > len(pkg):
            add(d)
            d = os.path.dirname(d)
        add(full)
        files.append(full)
        add(os.path.join(os.path.dirname(full), "__pycache__"))
        v = views.get(rel) or {}
        for pyc in [v.get("pyc"), *(v.get("other_pycs") or [])]:
            if isinstance(pyc, str) and pyc:
                add(os.path.abspath(pyc))
                add(os.path.dirname(os.path.abspath(pyc)))
    return files


def _seal_model_paths(paths, model, res, env, cwd):
    """Add where the launch's model config is read from (a local dir, the hub cache's ref) to `paths`."""
    if model.get("path"):
        add = paths.append
        mp = model["path"]
        local = os.path.normpath(os.path.join(cwd, mp))  # (an absolute mp stays as it is)
        add(local)
        add(os.path.join(local, "config.json"))
        repo = os.path.join(hub_cache_dir(env, home_of(env)), "models--" + mp.replace("/", "--"))
        add(os.path.join(repo, "refs", model.get("revision") or "main"))
        cfg = (res.get("model") or {}).get("path")
        if isinstance(cfg, str):
            add(cfg)


QUIET_NS = 2 * 10 ** 9  # a path changed this close to the facts is not trusted to predate them


def env_digest(drop):
    """sha256 of this process's sorted NAME=value environment entries, without the names in `drop`:
    what fleetctl/ops/seal.py computes over `env -0` of the check (this agent was started by the login
    shell as `env PUBLIC... python`, the check as `env PUBLIC... sh -c ...`)."""
    drop = set(drop or ())
    env = getattr(os, "environb", None)
    if env is None:
        return ""
    keep = sorted(k + b"=" + v for k, v in env.items() if k.decode("latin-1") not in drop)
    return sha256_new(b"\x00".join(keep)).hexdigest()


def _settle_paths(p, res):
    """What a deploy under the host lock would look at on a host it has nothing to change on: the
    state dir (the lock is made and removed in it), the lock, the deploys dir and every manifest,
    the package dir, each hashed file with the dirs between it and the package, its __pycache__ dir
    and pycs."""
    root, deploys, lock = state_paths(p.get("state_dir") or "~/.fleetctl")
    paths = [root, lock, deploys]
    try:
        for n in sorted(os.listdir(deploys)):
            paths += [os.path.join(deploys, n), os.path.join(deploys, n, "manifest.json")]
    except OSError:
        pass
    sg = res.get("package") or {}
    if sg.get("found") and sg.get("dir"):
        _seal_package_paths(paths, sg, res)
    return paths


def _facts_hook(p, res):
    """Keep this answer and a snapshot taken right after it. At the end of a deploy that changed
    nothing, that snapshot still matching and every path older than the facts (by QUIET_NS: a change
    during the facts would show a newer ctime) lets the seal take these facts as they are.

    `settle` (a deploy's facts): the answer says whether nothing a deploy would look at changed since
    QUIET_NS before the facts were read (`settled`: every such path's ctime older, read after the
    facts). A host whose plan is then a no-op is answered from this one reading, without the host
    lock (fleetctl/ops/deploy.py read_only_noop); with `seal` asked too and its paths as quiet, the
    answer carries the seal of these facts, as a deploy that changed nothing would have made it."""
    if not p.get("seal") and not p.get("settle"):
        return
    started = time.time_ns() - int((res.get("elapsed") or 0) * 1e9) - 10 ** 6
    plain = dict(res)  # (the facts as read: what a seal keeps)
    got = None
    if p.get("seal"):
        _SEAL.clear()
        _SEAL["request"] = dict((k, v) for k, v in p.items() if k not in ("seal", "settle"))
        _SEAL["head"] = _seal_head(_SEAL["request"], plain)  # (kept: the deploy's end adds its records to it)
        _SEAL["paths"], _SEAL["why"] = got, _ = seal_paths(_SEAL["request"], plain, _SEAL["head"])
        if got is not None:
            newest = [0]
            _SEAL["snap"] = snapshot(got[0], (), newest=newest)
            _SEAL["quiet"] = newest[0] < started - QUIET_NS
            _SEAL["facts"] = plain
    if not p.get("settle"):
        return
    newest = [0]
    snapshot(_settle_paths(p, plain), (), newest=newest)
    res["settled"] = newest[0] < started - QUIET_NS
    if res["settled"] and got is not None and _SEAL.get("quiet"):
        res["seal"] = {"paths": got[0], "files": got[1], "stat": _SEAL["snap"]["stat"],
                       "sha": sha_text(plain, got[1]), "facts": plain, "env": env_digest(_drop(p))}


def _drop(p):
    s = p.get("seal")
    return s.get("drop") if isinstance(s, dict) else ()


def _deploy_hook(p, res):
    """Under the host lock: the seal. A deploy that changed nothing seals the session's facts when
    nothing moved since they were read (_facts_hook); otherwise the facts are read again, bracketed
    by two identical snapshots."""
    if not p.get("seal"):
        return
    req = _SEAL.get("request")
    if req is None:
        res["seal"] = {"why": "no facts were read in this session"}
        return
    extra = []
    if p.get("state_files"):
        root = os.path.realpath(expand(p["state_dir"]))
        extra = [os.path.join(root, state_rel(sf.get("name"))) for sf in p["state_files"]]
    got = _SEAL.get("paths")
    held = (state_paths(p["state_dir"])[2],)
    if got is not None and res.get("deploy_id") is not None:
        # the deploy added its record: the paths as they are now, from the session's facts (their
        # import-system part as the facts hook found it), so that one reading of the facts is
        # bracketed, not two; where the re-read names other paths (dropped bytecode, a new .pth),
        # the loop below brackets again with those
        got = seal_paths(req, _SEAL["facts"], _SEAL.get("head"))[0] or got
    if got is not None and not extra and res.get("deploy_id") is None and _SEAL.get("quiet") \
            and snapshot(got[0], (), held) == _SEAL.get("snap"):
        res["seal"] = {"paths": got[0], "files": got[1], "stat": _SEAL["snap"]["stat"],
                       "sha": sha_text(_SEAL["facts"], got[1]), "facts": _SEAL["facts"], "env": env_digest(_drop(p))}
        return
    for _ in range(3):
        if got is None:
            break
        paths, files = got[0] + extra, got[1] + extra
        before = snapshot(paths, extra, held)
        facts = action_facts(req)
        lock = (facts.get("state") or {}).get("lock")
        if isinstance(lock, dict) and lock.get("pid") == os.getpid():
            facts["state"]["lock"] = None  # ours, released right after: the state the check must find
        got, why = seal_paths(req, facts)
        if got is None:
            res["seal"] = {"why": why}
            return
        if got[0] + extra == paths and got[1] + extra == files:
            after = snapshot(paths, extra, held)
            if after == before:
                REREAD[0] = (req, facts)  # what the host is now: the request's then_facts may take it
                res["seal"] = {"paths": paths, "files": files, "stat": after["stat"],
                               "sha": sha_text(facts, got[1]) + after["sha"], "facts": facts,
                               "env": env_digest(_drop(p))}
                return
    res["seal"] = {"why": "the host changed while it was read" if got else _SEAL.get("why") or "not sealable"}


FACTS_HOOKS.append(_facts_hook)
DEPLOY_HOOKS.append(_deploy_hook)
