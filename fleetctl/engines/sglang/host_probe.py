"""Run ON the host, under the LAUNCH's interpreter, options, environment and cwd: ask the installed
SGLang itself which speculative worker this launch's argv selects. (stdlib only, Python >= 3.8
grammar; no `from __future__`; shipped as a string with the agent, run as `-c`.)

The agent (remote/engine_probe.py) starts it with CUDA_VISIBLE_DEVICES="" (no GPU is visible: nothing here
can touch one), PYTHONDONTWRITEBYTECODE=1 and a private TMPDIR it removes afterwards, in its own
process group that is killed when it answers or times out. It reads one JSON request on stdin:

    {"argv": [server flags...], "path0": dir or null,
     "overlay": {"srt/server_args.py": base64 of the file's bytes, ...} or absent,
     "hardware": {"count": N, "name": "NVIDIA H200", "capability": [9, 0], "memory_mib": 143771,
                  "cuda": "12.8" or null}}

and answers one JSON document on the stdout it was given (everything SGLang prints goes to stderr):

    {"stage": "selected" | "no_speculation" | "refused" | "import_failed",
     "package_version", "package_dir", "python", "algorithm", "disable_overlap_schedule",
     "worker_class", "worker_module", "worker_file" (relative to the sglang dir),
     "error": "ExcType: message" (SGLang's own exception or argparse's error), "error_where": file:line,
     "warnings": [...], "answered": [hardware queries answered from the facts], "standin": label or null}

`overlay`: package files to import from the given bytes instead of the installed ones (the playbook's
files as deploy would write them: asked before a deploy, a flag the patch adds is known); served by
an import finder in this process only, never written anywhere, no bytecode read or written for them.

What runs is SGLang's own code: `prepare_server_args(argv)` (argparse with its own parser, the
ServerArgs dataclass and its __post_init__), `resolve_once()` where the release has it (as its launcher does), `check_server_args()`, then the scheduler's own worker
selection (`SpeculativeAlgorithm.from_string(...).create_worker(server_args)`, or in older releases
`create_draft_worker(enable_overlap=...)`, whose worker class is caught when it is about to be
constructed: no worker is ever constructed and no model is loaded). Hardware queries (torch.cuda
device count, capability, properties, memory; nvidia-smi's memory total) are answered from the
host's nvidia-smi facts the controller sends.
"""

import io
import json
import logging
import os
import sys
import time

MAX_REQUEST = 16 << 20  # (an overlay of patched files included)
MAX_TEXT = 2000
MAX_WARNINGS = 60


class _Selected(BaseException):
    """Raised instead of constructing a worker: carries the class SGLang chose."""

    def __init__(self, cls):
        BaseException.__init__(self, cls.__name__)
        self.cls = cls


def _clip(s):
    s = str(s)
    return s if len(s) <= MAX_TEXT else s[:MAX_TEXT - 3] + "..."


class _Capture(logging.Handler):
    def __init__(self):
        logging.Handler.__init__(self, logging.WARNING)
        self.lines = []

    def emit(self, record):
        if len(self.lines) < MAX_WARNINGS:
            try:
                self.lines.append(_clip(record.getMessage()))
            except Exception:
                pass


def install_hardware(hw, answered):
    """Make torch.cuda answer from the host's nvidia-smi facts (no device is visible to the real one)."""
    import types

    try:
        import torch
    except ImportError as e:  # SGLang's own import then says what is missing
        answered.append("nothing: torch does not import (%s)" % e)
        return

    count = int(hw.get("count") or 0)
    cap = tuple(int(x) for x in (hw.get("capability") or (0, 0)))[:2]
    total = int(hw.get("memory_mib") or 0) * 1024 * 1024
    name = str(hw.get("name") or "")
    props = types.SimpleNamespace(name=name, major=cap[0], minor=cap[1], total_memory=total,
                                  multi_processor_count=int(hw.get("sm_count") or 132), is_integrated=False,
                                  gcnArchName="", uuid="", L2_cache_size=0, warp_size=32)
    cuda = torch.cuda

    def _noop():  # a distinct function per attribute (torch.compile keys its rules by function)
        return lambda *a, **k: None

    fakes = {
        "is_available": lambda: count > 0,
        "device_count": lambda: count,
        "get_device_capability": lambda device=None: cap,
        "get_device_properties": lambda device=None: props,
        "get_device_name": lambda device=None: name,
        "mem_get_info": lambda device=None: (total, total),
        "current_device": lambda: 0,
        "is_initialized": lambda: True,
        "_lazy_init": _noop(),
        "init": _noop(),
        "set_device": _noop(),
        "synchronize": _noop(),
        "empty_cache": _noop(),
        "is_bf16_supported": lambda *a, **k: cap >= (8, 0),
    }
    for attr, fn in fakes.items():
        setattr(cuda, attr, fn)
    answered.append("torch.cuda: %d x %s, capability %d.%d, %d MiB (from nvidia-smi facts)"
                    % (count, name, cap[0], cap[1], total >> 20))
    if getattr(torch.version, "cuda", None) is None and count:
        torch.version.cuda = str(hw.get("cuda") or "12.8")
        answered.append("torch.version.cuda=%s (this torch is a CPU build)" % torch.version.cuda)


def answer_memory_queries(hw, answered):
    """SGLang's own nvidia-smi memory query, answered from the facts (no subprocess)."""
    mib = float(hw.get("memory_mib") or 0)
    for name, mod in list(sys.modules.items()):
        if name.startswith("sglang.") and mod is not None and hasattr(mod, "get_nvgpu_memory_capacity"):
            try:
                mod.get_nvgpu_memory_capacity = lambda: mib
            except Exception:
                pass
    answered.append("nvidia-smi memory.total: %d MiB (from nvidia-smi facts)" % mib)


def _block_construction(module):
    for value in list(vars(module).values()):
        if isinstance(value, type) and getattr(value, "__module__", None) == module.__name__ \
                and "Worker" in value.__name__:
            def _refuse(self, *a, **k):
                raise _Selected(type(self))
            value.__init__ = _refuse


class _NoConstruct(object):
    """A meta path finder: speculative modules imported from now on get their worker classes'
    __init__ replaced by one that raises _Selected (the scheduler would construct it next)."""

    PREFIX = "sglang.srt.speculative."

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(self.PREFIX):
            return None
        import importlib.machinery

        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        real = spec.loader.exec_module

        def exec_module(module):
            real(module)
            _block_construction(module)
        spec.loader.exec_module = exec_module
        return spec


def _where(tb, pkg_dir):
    last = None
    while tb is not None:
        f = tb.tb_frame.f_code.co_filename
        if pkg_dir and f.startswith(pkg_dir):
            last = "%s:%d" % (os.path.relpath(f, os.path.dirname(pkg_dir)), tb.tb_lineno)
        tb = tb.tb_next
    return last


def select_worker(server_args, res):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    raw = getattr(server_args, "speculative_algorithm", None)
    algo = SpeculativeAlgorithm.from_string(raw)
    res["algorithm"] = getattr(algo, "name", None) if raw is not None else None
    is_none = algo.is_none() if hasattr(algo, "is_none") else raw is None
    if is_none:
        res["stage"] = "no_speculation"
        return
    sys.meta_path.insert(0, _NoConstruct())
    for name, mod in list(sys.modules.items()):
        if name.startswith(_NoConstruct.PREFIX) and mod is not None:
            _block_construction(mod)
    cls = None
    try:
        if hasattr(algo, "create_worker"):
            cls = algo.create_worker(server_args)
        else:  # older releases: the scheduler passes enable_overlap to the EAGLE/EAGLE3 factories
            kwargs = {}
            if algo.name in ("EAGLE", "EAGLE3"):
                kwargs["enable_overlap"] = not server_args.disable_overlap_schedule
            algo.create_draft_worker(**kwargs)
    except _Selected as sel:
        cls = sel.cls
    if cls is None:
        res["stage"] = "no_worker"
        return
    if not isinstance(cls, type):
        cls = type(cls)
    res["stage"] = "selected"
    res["worker_class"] = cls.__name__
    res["worker_module"] = cls.__module__
    mod = sys.modules.get(cls.__module__)
    f = getattr(mod, "__file__", None)
    if f and res.get("package_dir"):
        res["worker_file"] = os.path.relpath(f, res["package_dir"])


def run(req, res):
    argv = [str(a) for a in req.get("argv") or []]
    hw = req.get("hardware") or {}
    answered = res["answered"]
    capture = _Capture()
    logging.getLogger().addHandler(capture)
    logging.captureWarnings(True)
    res["warnings"] = capture.lines
    pkg_dir = None
    try:
        install_hardware(hw, answered)
        import sglang

        pkg_dir = os.path.dirname(os.path.abspath(sglang.__file__))
        res["package_dir"] = pkg_dir
        res["package_version"] = getattr(sglang, "__version__", None)
        from sglang.srt import server_args as sa
    except BaseException as e:
        res["stage"] = "import_failed"
        res["error"] = _clip("%s: %s" % (type(e).__name__, e))
        res["error_where"] = _where(sys.exc_info()[2], pkg_dir)
        return
    standin = sys.modules.get("fleetctl_gpu_standin")
    res["standin"] = getattr(standin, "LABEL", None) if standin is not None else None
    answer_memory_queries(hw, answered)
    err = io.StringIO()
    real_err = sys.stderr
    try:
        sys.stderr = err
        try:
            server_args = sa.prepare_server_args(argv)
        finally:
            sys.stderr = real_err
        if hasattr(server_args, "resolve_once"):  # 0.5.19+: the launcher applies declared resolutions first
            server_args.resolve_once()
        res["disable_overlap_schedule"] = getattr(server_args, "disable_overlap_schedule", None)
        server_args.check_server_args()
        res["disable_overlap_schedule"] = getattr(server_args, "disable_overlap_schedule", None)
        select_worker(server_args, res)
    except SystemExit as e:  # argparse: usage + "error: ..." on stderr
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        msg = lines[-1] if lines else "exit %s" % (e.code,)
        if ": error: " in msg:
            msg = msg.split(": error: ", 1)[1]
        res["stage"] = "refused"
        res["error"] = _clip("argparse: " + msg)
    except _Selected as sel:  # a worker constructed somewhere unexpected: still no construction
        res["stage"] = "selected"
        res["worker_class"] = sel.cls.__name__
        res["worker_module"] = sel.cls.__module__
    except BaseException as e:
        if os.environ.get("FLEETCTL_PROBE_TRACEBACK"):
            import traceback
            traceback.print_exc()
        res["stage"] = "refused"
        res["error"] = _clip("%s: %s" % (type(e).__name__, e))
        res["error_where"] = _where(sys.exc_info()[2], pkg_dir)


def install_overlay(overlay, package):
    """Import the package files of `overlay` (rel -> base64 bytes) from those bytes, each at the
    installed file's path (its __file__ and tracebacks name it), in this process only."""
    import base64
    import importlib.abc
    import importlib.machinery
    import importlib.util

    files = {}
    for rel, b64 in (overlay or {}).items():
        if isinstance(rel, str) and rel.endswith(".py") and not rel.endswith("__init__.py") and isinstance(b64, str):
            files[rel] = base64.b64decode(b64)
    if not files:
        return []

    class _Loader(importlib.abc.SourceLoader):
        def __init__(self, path, data):
            self.path, self.data = path, data

        def get_filename(self, fullname):
            return self.path

        def get_data(self, path):  # (no path_stats: no bytecode is read or written for these)
            if path == self.path:
                return self.data
            with open(path, "rb") as fh:
                return fh.read()

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if not fullname.startswith(package + "."):
                return None
            data = files.get("/".join(fullname.split(".")[1:]) + ".py")
            if data is None:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                return None
            return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_Loader(spec.origin, data))

    sys.meta_path.insert(0, _Finder())
    return sorted(files)


def main():
    started = time.time()
    out_fd = os.dup(1)
    os.dup2(2, 1)  # whatever SGLang prints goes to stderr; the answer alone goes to the real stdout
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    try:
        req = json.loads(sys.stdin.buffer.read(MAX_REQUEST).decode("utf-8"))
    except ValueError:
        req = {}
    if req.get("path0") is not None:
        sys.path[0] = req["path0"]
    res = {"stage": "import_failed", "python": sys.version.split()[0], "answered": [], "warnings": []}
    install_overlay(req.get("overlay"), "sglang")
    run(req, res)
    res["elapsed"] = round(time.time() - started, 3)
    data = json.dumps(res, default=str).encode("utf-8")
    while data:
        data = data[os.write(out_fd, data):]
    os.close(out_fd)
    sys.stdout.flush()
    os._exit(0)  # no atexit hooks or threads SGLang may have started


main()
