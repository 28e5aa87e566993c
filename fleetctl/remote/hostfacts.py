"""Agent part: host facts. The `facts` action (OS, user, python, the located package and the hashes
of its planned files, torch, GPUs, the model config the launch would read, files the launch's flags
name) and the hooks other parts add to it (EXTRA_FACTS by a request's "with", FACTS_HOOKS).
"""

import os
import stat
import sys
import time

if __name__ != "fleetctl_agent":  # imported locally; on the host the parts share one namespace
    from fleetctl.remote.core import (
        ACTIONS,
        AGENT_PROTOCOL,
        abandon,
        finish_bounded,
        jloads,
        sha256_file,
        spawn_piped,
        which,
    )
    from fleetctl.remote.files import unwritable
    from fleetctl.remote.locate import launch_cwd, launch_environment, locate_package, read_metadata



def file_info(pkg_dir, rel):
    """Hash and metadata of pkg_dir/rel, flagging symlinks and paths that leave pkg_dir."""
    path = os.path.join(pkg_dir, rel)
    info = {"path": rel, "exists": False}
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return info
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
        return info
    info["exists"] = True
    real = os.path.realpath(path)
    pkg_real = os.path.realpath(pkg_dir)
    info["escapes"] = not (real == pkg_real or real.startswith(pkg_real + os.sep))
    if stat.S_ISLNK(st.st_mode):
        info["symlink"] = os.readlink(path)
    if info["escapes"]:
        return info
    try:
        st = os.stat(path)
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
        return info
    if not stat.S_ISREG(st.st_mode):
        info["error"] = "not a regular file"
        return info
    info.update(mode=stat.S_IMODE(st.st_mode), uid=st.st_uid, gid=st.st_gid, size=st.st_size,
                mtime=st.st_mtime)
    why = unwritable(os.path.dirname(path))
    if why:
        info["unwritable"] = why
    try:
        info["sha256"] = sha256_file(path)
    except OSError as e:
        info["error"] = "%s: %s" % (e.__class__.__name__, e.strerror)
    return info


def read_os():
    u = os.uname()
    out = {"system": u.sysname, "release": u.release, "machine": u.machine}
    try:
        with open("/etc/os-release") as fh:
            kv = dict(
                line.rstrip("\n").split("=", 1) for line in fh if "=" in line and not line.startswith("#")
            )
        out["pretty"] = kv.get("PRETTY_NAME", "").strip('"')
    except OSError:
        out["pretty"] = "%s %s" % (out["system"], out["release"])
    return out


# ----------------------------------------------------------------------------- model config.json

MODEL_CONFIG_MAX = 4 << 20  # bytes; a larger config.json is not read
_ALNUM = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
_HUB_CHARS = _ALNUM | frozenset("._-")
_HEX = frozenset("0123456789abcdef")


def _word(s, rest, longest, first=_ALNUM):
    """s is 1..longest characters, the first from `first`, the others from `rest` (no re)."""
    return 0 < len(s) <= longest and s[0] in first and rest.issuperset(s)


def _hub_id_ok(s):
    """`name` or `org/name`, each part 1-96 of letters, digits, . _ - starting with a letter or digit."""
    parts = s.split("/")
    return len(parts) <= 2 and all(_word(x, _HUB_CHARS, 96) for x in parts)


def _revision_ok(s):
    return _word(s, _HUB_CHARS | frozenset("/"), 128)


def _commit_ok(s):
    return len(s) == 40 and _HEX.issuperset(s)


def _ident_ok(s):
    return len(s) <= 128 and s.isascii() and s.isidentifier()


def home_of(env):
    """What os.path.expanduser('~') gives the launch's python: its HOME, else the passwd entry."""
    if env.get("HOME"):
        return env["HOME"]
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_dir
    except Exception:
        return "/"


def hub_cache_dir(env, home):
    """The HF hub cache the launch's environment selects (huggingface_hub's precedence; mirrors
    fleetctl/engines/sglang/model_config.py, held to it by tests)."""
    def exp(p):
        return home + p[1:] if p == "~" or p.startswith("~/") else p
    if env.get("HF_HUB_CACHE"):
        return exp(env["HF_HUB_CACHE"])
    if env.get("HUGGINGFACE_HUB_CACHE"):
        return exp(env["HUGGINGFACE_HUB_CACHE"])
    if env.get("HF_HOME"):
        return os.path.join(exp(env["HF_HOME"]), "hub")
    return os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "huggingface", "hub")


def _read_bounded(path, limit):
    """The bytes of a regular file (symlinks followed, as the loader does), at most `limit`; never
    blocks on a FIFO or device."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > limit:
        raise ValueError("larger than %d bytes" % limit)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        chunks, n = [], 0
        while n <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
    finally:
        os.close(fd)
    if n > limit:
        raise ValueError("larger than %d bytes" % limit)
    return b"".join(chunks)


def model_config_path(model_path, revision, env, home, cwd):
    """Which config.json the launch's SGLang would load for `model_path`: (path, None) or
    (None, why not). A local directory wins; otherwise a hub id is looked up in the HF cache."""
    if not model_path or "\x00" in model_path:
        return None, "no model path"
    local = model_path if os.path.isabs(model_path) else os.path.join(cwd, model_path)
    if os.path.isdir(local):
        return os.path.join(os.path.normpath(local), "config.json"), None
    rev = revision or "main"
    if not _hub_id_ok(model_path) or ".." in model_path or not _revision_ok(rev) or ".." in rev:
        return None, "%s is neither a directory nor a hub model id" % local
    repo = os.path.join(hub_cache_dir(env, home), "models--" + model_path.replace("/", "--"))
    ref = os.path.join(repo, "refs", rev)
    commit = None
    try:
        commit = _read_bounded(ref, 256).decode("ascii", "replace").strip()
    except (OSError, ValueError):
        if _commit_ok(rev):
            commit = rev
    if commit is None:
        return None, "%s is not a directory and the HF cache has no %s" % (local, ref)
    if not _commit_ok(commit):
        return None, "%s does not hold a commit hash" % ref
    return os.path.join(repo, "snapshots", commit, "config.json"), None


def read_model_config(model, launch):
    """The target model's config.json, read on this host exactly as the launch would find it (its
    environment: HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME; its working directory). Returns the
    fields routing needs (`architectures`, `model_type`) or {"error": why}; bounded and validated."""
    env = launch_environment(launch or {})
    cwd = launch_cwd((launch or {}).get("cwd"), env)
    path, why = model_config_path(model.get("path"), model.get("revision"), env, home_of(env), cwd)
    if path is None:
        return {"error": why}
    try:
        data = _read_bounded(path, MODEL_CONFIG_MAX)
    except OSError as e:
        return {"error": "%s: %s" % (path, e.strerror or e.__class__.__name__), "path": path}
    except ValueError as e:
        return {"error": "%s: %s" % (path, e), "path": path}
    try:
        doc = jloads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return {"error": "%s: not JSON" % path, "path": path}
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if not isinstance(archs, list) or not archs or not all(isinstance(a, str) and _ident_ok(a)
                                                           for a in archs[:8]):
        return {"error": "%s: no valid `architectures` list" % path, "path": path}
    mt = doc.get("model_type")
    return {"path": path, "architectures": archs[:8],
            "model_type": mt if isinstance(mt, str) and _ident_ok(mt) else None}


LAUNCH_FILE_MAX = 1 << 20  # bytes; a larger file named by a launch flag is not read


def read_launch_files(paths, launch):
    """Files the launch's flags name (an adaptive config), read as the launched server would open
    them: a relative path from the launch's working directory. {path: {"data": base64} or {"error"}}."""
    import base64

    env = launch_environment(launch or {})
    cwd = launch_cwd((launch or {}).get("cwd"), env)
    out = {}
    for path in list(paths or [])[:8]:
        if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
            continue
        full = path if os.path.isabs(path) else os.path.join(cwd, path)
        try:
            out[path] = {"data": base64.b64encode(_read_bounded(full, LAUNCH_FILE_MAX)).decode("ascii")}
        except OSError as e:
            out[path] = {"error": "%s: %s" % (full, e.strerror or e.__class__.__name__)}
        except ValueError as e:
            out[path] = {"error": "%s: %s" % (full, e)}
    return out


def torch_version():
    """The version of the torch distribution this interpreter would see first on sys.path (what
    importlib.metadata.version('torch') answers, without importing importlib.metadata: ~15 ms)."""
    for d in sys.path:
        try:
            entries = os.listdir(d or ".")
        except OSError:
            continue
        for e in sorted(entries):
            base, dot, ext = e.rpartition(".")
            if ext not in ("dist-info", "egg-info") or not dot:
                continue
            name, _, version = base.partition("-")
            if name.lower().replace("-", "_") != "torch" or not version:
                continue
            fields, _ = read_metadata(os.path.join(d or ".", e)) if ext == "dist-info" else ({}, [])
            return fields.get("Version") or version.split("-")[0]
    return None


def spec_files(pkg_dir, dirs, extra):
    """Relative paths to hash: every file under `dirs` (recursively) plus `extra`."""
    rels = []
    for d in dirs:
        base = os.path.join(pkg_dir, d)
        for root, subdirs, files in os.walk(base):
            subdirs[:] = sorted(s for s in subdirs if s != "__pycache__")
            for f in sorted(files):
                rels.append(os.path.relpath(os.path.join(root, f), pkg_dir))
    for r in extra:
        if r not in rels:
            rels.append(r)
    return rels


def flag_registered(server_args_text, flag):
    """Does this server_args.py source register `flag`? Either the option string is spelled out, or
    ServerArgs has a field of that name (newer releases derive options from annotated fields)."""
    if ('"%s"' % flag) in server_args_text or ("'%s'" % flag) in server_args_text:
        return True
    dest = flag.lstrip("-").replace("-", "_")
    import re

    if re.search(r"^[ \t]+%s[ \t]*:" % re.escape(dest), server_args_text, re.M) is not None:
        return True
    # argparse also takes an unambiguous prefix of an option (allow_abbrev, on in SGLang's parser):
    # registered if it starts exactly one option string the file spells out
    if flag.startswith("--") and len(flag) > 3:
        options = set(re.findall(r"""["'](--[A-Za-z0-9][A-Za-z0-9_-]*)["']""", server_args_text))
        return len([o for o in options if o.startswith(flag)]) == 1
    return False


def registered_flags(pkg_dir, flags, args_file):
    """Which of `flags` the installed `args_file` (package-relative, the engine's) registers."""
    try:
        with open(os.path.join(pkg_dir, *args_file.split("/")), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return {}
    return dict((f, flag_registered(text, f)) for f in flags)


GPU_QUERIES = (
    ("gpus", ["--query-gpu=index,uuid,name,memory.total,memory.used,memory.free,utilization.gpu", "--format=csv"]),
    ("apps", ["--query-compute-apps=pid,process_name,used_gpu_memory,gpu_uuid", "--format=csv"]),
)


def gpu_start():
    """Start nvidia-smi's queries, all at once, when a facts request begins; gpu_queries reads them
    at its end (on an H200 each takes ~50 ms: they run while the package is located and hashed)."""
    exe = which("nvidia-smi")
    if not exe:
        return {"available": False, "reason": "nvidia-smi not found on PATH"}
    started = []
    try:
        for key, args in GPU_QUERIES:
            started.append((key, spawn_piped([exe, *args])))
    except OSError as e:
        abandon([c for _, c in started])
        return {"available": False, "path": exe, "reason": "nvidia-smi failed: %s" % e}
    return {"available": True, "path": exe, "started": started}


def gpu_queries(pending=None, timeout=20):
    """The GPU facts: nvidia-smi's answers to GPU_QUERIES (started by gpu_start, else now)."""
    pending = gpu_start() if pending is None else pending
    if "started" not in pending:
        return pending
    started = pending.pop("started")
    out = pending
    try:
        answers = finish_bounded([c for _, c in started], timeout)
    except (OSError, TimeoutError) as e:
        out["available"] = False
        out["reason"] = "nvidia-smi failed: %s" % e
        return out
    for (key, _), (rc, stdout, stderr) in zip(started, answers):
        if rc != 0:
            out["available"] = False
            out["reason"] = "nvidia-smi exit %d: %s" % (rc, stderr.decode(errors="replace").strip()[:200])
            return out
        out[key] = stdout.decode(errors="replace")
    return out


# ----------------------------------------------------------------------------- actions


def action_facts(p, reread=None):
    """reread: (request, answer) of facts read earlier in this same request, after everything the
    request changed (a deploy's re-read for its seal, under the host lock: seal.py). Where `p`
    locates the package exactly as that request did, its package (bytecode of `p`'s files only),
    torch, OS and user are taken from that answer instead of asking the launch's python again.
    nvidia-smi (when the request asks GPUs) runs meanwhile; it never outlives the request."""
    gpus = gpu_start() if p.get("gpus", True) else None
    try:
        return _facts(p, reread, gpus)
    finally:
        if gpus is not None:
            abandon([c for _, c in gpus.get("started", ())])


def _facts(p, reread, gpus):
    started = time.time()
    prior = reread[1] if reread is not None and _locates_alike(p, reread[0]) else None
    res = {
        "protocol": AGENT_PROTOCOL,
        "os": prior["os"] if prior is not None else read_os(),
        "python": {"executable": sys.executable, "version": sys.version.split()[0]},
        "user": prior["user"] if prior is not None else _user(),
    }
    if prior is not None:
        files = set(p.get("bytecode_files") or [])
        sg = dict(prior["package"])
        if isinstance(sg.get("bytecode"), dict):
            sg["bytecode"] = dict((k, v) for k, v in sg["bytecode"].items() if k in files)
    elif p.get("engine"):
        sg = locate_package(p["engine"], p.get("package_dir"), p.get("launch"), p.get("bytecode_files") or [],
                            p.get("strict_package_dir", True))
    else:  # the controller always sends its engine; a bare request gets host facts only
        sg = {"found": False, "error": "the request names no engine"}
    res["package"] = sg
    res["torch"] = prior["torch"] if prior is not None else torch_version()
    files = {}
    if sg.get("found"):
        for rel in spec_files(sg["dir"], p.get("hash_dirs", []), p.get("hash_files", [])):
            files[rel] = file_info(sg["dir"], rel)
    res["files"] = files
    if p.get("check_flags") and sg.get("found"):
        res["registered_flags"] = registered_flags(sg["dir"], p["check_flags"], p["engine"]["args_file"])
    if p.get("model"):
        res["model"] = read_model_config(p["model"], p.get("launch"))
    if p.get("draft_model"):  # the speculative draft model's config.json, read the same way
        res["draft_model"] = read_model_config(p["draft_model"], p.get("launch"))
    if p.get("launch_files"):
        res["launch_files"] = read_launch_files(p["launch_files"], p.get("launch"))
    if gpus is not None:
        res["gpus"] = gpu_queries(gpus)
    hooks = p.get("with", [])
    for name in hooks:
        fn = EXTRA_FACTS.get(name)
        if fn is not None:
            res[name] = fn(p, sg)
    res["elapsed"] = round(time.time() - started, 4)
    for hook in FACTS_HOOKS:  # (seal.py: the seal of this answer, kept for the deploy)
        hook(p, res)
    return res


def _locates_alike(p, q):
    """Whether facts request `p` locates the package as `q` did: the same engine, launch and package
    dir, `p`'s bytecode files among `q`'s, and `q` at least as strict (a strict location that
    succeeded is what a lenient one finds)."""
    return (bool(p.get("engine")) and p.get("engine") == q.get("engine") and p.get("launch") == q.get("launch")
            and p.get("launch") is not None and p.get("package_dir") == q.get("package_dir")
            and set(p.get("bytecode_files") or []) <= set(q.get("bytecode_files") or [])
            and (q.get("strict_package_dir", True) or not p.get("strict_package_dir", True)))


def _user():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except Exception:
        return str(os.getuid())
ACTIONS.update({"facts": action_facts})
EXTRA_FACTS = {}
FACTS_HOOKS = []  # fn(request, answer) run after every facts answer is complete
