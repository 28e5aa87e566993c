"""SIMULATOR of an SGLang server, for fleetctl's sandbox hosts. It is NOT SGLang: no model, no GPU.

    python -m fleetctl.sandbox.simulator [sglang launch_server flags...]

It exists so that `fleetctl launch`, `stop` and `verify-logs` can be exercised end to end on the
sandbox fleet. Nothing it prints is evidence about GPUs or about SGLang's real behaviour: every
decision it takes comes from fleetctl's own SGLang knowledge module (`fleetctl.engines.sglang`), so what it
can prove is only that fleetctl's tooling reads what that module says SGLang would print.

What it does, in order (all logs on stderr, in the installed release's format):
  1. prints a line saying it is the fleetctl sandbox simulator;
  2. finds the SGLang this interpreter would import (importlib find_spec, no import of sglang) and
     its version (`sglang/_version.py`);
  3. decides the worker with `fleetctl.engines.sglang.resolve_worker(version, flags, os.environ)`; a
     `startup_error` is printed like a Python traceback ending in that error, exit 1 (a command-line
     error of the release's argparse -- unknown flag, ambiguous abbreviation -- as usage + error, exit 2);
  4. prints the startup warnings (bare before 0.5.11), the `server_args=` dump of the resolved args;
  5. binds 127.0.0.1:--port (in use: an "Address already in use" traceback, exit 1);
  6. per scheduler rank (`expected_ranks`): "Load weight" lines and, ONLY when the resolved worker
     module's code AS IMPORT LOADS IT AT START (CPython's import machinery: a cached pyc it would
     use counts, not the source) holds the marker literal inside that class's `__init__`, and
     `--speculative-disable-batch-threshold` is given, the marker line
     `Dynamic speculation disable enabled (worker=<Class>, threshold=<N>)`;
  6b. per scheduler rank, what the constructors the launch runs log unconditionally (a literal or
     f-string message of logger.info/warning/error/critical or print, read from the code as import
     loads it; fleetctl/sandbox/startup_logs.py): the Scheduler, the selected speculative worker, the
     model class the target's (and a named draft's) config.json names, the attention backends the
     flags name. The pristine releases log none there; a playbook's own start-up line (e.g. the
     scheduler-log-line example's marker, or a line `fleetctl patch init` found) is logged when the
     code that holds it runs;
  6c. with --speculative-adaptive on a release that has it, the release's own adaptive start-up lines
     (`fleetctl.engines.sglang.adaptive`) computed from the --speculative-adaptive-config file the launch names
     (read, as the release's loader would; a file it refuses is a traceback, exit 1), TP rank 0 only;
  7. prints the ready line, serves `GET /health` (200; 503 before ready), `GET /get_server_info`
     (JSON of the resolved args) and `POST /generate` (a made-up text that depends only on the
     prompt and max_new_tokens: no model, no token computed) until SIGTERM, then exits 0.

Test knobs (environment):
  FLEETCTL_SIM_START_DELAY=<seconds>    sleep that long while "loading weights"
  FLEETCTL_SIM_CRASH=startup            print a traceback mid start-up and exit 1
  FLEETCTL_SIM_CRASH=after-ready:<s>    become ready, serve <s> seconds (default 3), then the same
  FLEETCTL_SIM_HANDLED_TRACEBACK=1      log a handled traceback before ready and carry on (the shape
                                        of 0.5.12's `Can not initialize OpenAIServingResponses`)
  FLEETCTL_SIM_DROP_MARKER_RANK=<n>     the n-th scheduler rank (0-based, TP rank for plain TP) omits the marker
  FLEETCTL_SIM_MARKER=<text>            the marker literal looked for (default below)
  FLEETCTL_SIM_DIVERGE=1                /generate answers another text when the threshold flag is given
See docs/simulator.md.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import sys
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MARKER = "Dynamic speculation disable enabled"
THRESHOLD_ARG = "speculative_disable_batch_threshold"  # the payload's flag, as a ServerArgs field
USAGE = "usage: launch_server.py [-h] --model-path MODEL_PATH ... (fleetctl simulator)"
# startup errors that come from argparse itself (the command line), not from SGLang's checks
ARGPARSE_ERRORS = ("ambiguous option:", "unrecognized arguments:", "argument ")
BANNER = ("fleetctl sandbox SIMULATOR of an SGLang server (not SGLang: no model, no GPU; "
          "see docs/simulator.md)")


def log(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def parse_argv(argv: list[str]) -> dict[str, Any]:
    """`--a 1 --b --c=x` -> {"--a": "1", "--b": True, "--c": "x"}; unknown flags are kept."""
    flags: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--"):
            i += 1  # a stray positional: tolerated
            continue
        if "=" in tok:
            k, v = tok.split("=", 1)
            flags[k] = typed(v)
            i += 1
            continue
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if nxt is None or (nxt.startswith("--") and len(nxt) > 2):
            flags[tok] = True
            i += 1
        else:
            flags[tok] = typed(nxt)
            i += 2
    return flags


def typed(value: Any) -> Any:
    """An argv string that spells an int or a float becomes one (as argparse `type=` would make it)."""
    if not isinstance(value, str):
        return value
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def find_sglang() -> tuple[Path, str | None]:
    """The directory this interpreter imports SGLang's modules from (no sglang code is run): the
    package's own dir, or, where `sglang` is a namespace package here (a checkout dir in the cwd
    while an editable finder serves the modules), the dir its modules come from."""
    from fleetctl.remote.probe import locate_module, package_root

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("No module named 'sglang'")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    if spec.loader is None:  # a namespace package: where its modules are imported from
        rel = "srt/server_args.py"
        root = package_root({rel: locate_module("sglang.srt.server_args")})
        if root is None:
            raise ModuleNotFoundError("No module named 'sglang.srt.server_args'")
        pkg = Path(root)
    from fleetctl.remote.locate import const_assign

    version = None
    # the releases keep it in _version.py, some (0.5.5.post3) in version.py: as the agent reads it
    for fname, names in (("_version.py", ("__version__", "version")), ("version.py", ("__version__",))):
        try:
            version = const_assign((pkg / fname).read_text(encoding="utf-8"), names)
        except OSError:
            continue
        if version:
            break
    return pkg, version


def worker_code(pkg: Path, rel: str) -> Any:
    """The code object `import sglang.<rel>` would execute, through CPython's own import machinery
    (the path finder's loaders: extension, source with its __pycache__ bytecode, sourceless .pyc),
    without importing the parent packages. A stale hash-based pyc is run here exactly as CPython
    would run it. None if the module cannot be loaded as code (missing, an extension module)."""
    import importlib.machinery

    from fleetctl.remote.probe import locate_module

    name = "sglang." + rel[:-3].replace("/", ".")
    try:
        # the spec the import system hands out (meta-path hooks of the start-up included)
        found, spec = locate_module(name, with_spec=True)
        if spec is None or (found["standard"] and found["file"] != str(pkg / rel)):
            spec = importlib.machinery.PathFinder.find_spec(name, [str((pkg / rel).parent)])
        get_code = getattr(spec.loader, "get_code", None) if spec is not None else None
        return get_code(name) if get_code is not None else None
    except (ImportError, OSError, SyntaxError, ValueError, EOFError):
        return None


def adaptive_lines(version: str, worker_class: str | None, args: dict[str, Any]) -> list[str]:
    """The release's adaptive start-up lines for this launch ([] without --speculative-adaptive);
    raises ValueError/OSError as the release's loader would on a config it cannot use."""
    from fleetctl.engines.sglang import adaptive

    if not args.get("speculative_adaptive") or adaptive.config_format(version) is None:
        return []
    path = args.get("speculative_adaptive_config")
    steps = int(args.get("speculative_num_steps") or 3)
    if path:
        with open(str(path), "rb") as fh:
            data = fh.read(adaptive.MAX_CONFIG + 1)
    else:  # the release's default config: its candidates (fleetctl.engines.sglang) in one slot
        from fleetctl.engines.sglang import releases

        rel = releases.RELEASES.get(version)
        cands = list(rel.adaptive.default_candidates) if rel and rel.adaptive else [1, 3, 7]
        data = json.dumps({"1": {"candidate_steps": cands}} if adaptive.config_format(version) != "flat"
                          else {"candidate_steps": cands}).encode()
    start = adaptive.parse_config(version, data, steps)
    return [ln + ("  [fleetctl simulator: nothing built]" if ln.startswith(adaptive.BUILT_PREFIX) else "")
            for ln in adaptive.startup_lines(version, worker_class, start)]


def traceback_exit(error: str, where: str = "launch_server") -> None:
    if ":" not in error.split(" ", 1)[0]:
        error = f"RuntimeError: {error}"
    log("Traceback (most recent call last):")
    log(f'  File "<fleetctl simulator>", line 1, in <module>  ({where})')
    log(error)
    sys.exit(1)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # bursts of concurrent requests (gpu-check's loads) are queued, not reset
    ready = False
    info: dict[str, Any] = {}  # noqa: RUF012 (set once before serving)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            self._send(200 if self.server.ready else 503, b"")
        elif path in ("/get_server_info", "/server_info"):
            self._send(200, json.dumps(self.server.info, default=str).encode())
        else:
            self._send(404, b'{"detail":"Not Found"}')

    def do_POST(self) -> None:
        """`POST /generate`: a made-up greedy text, a function of the prompt and max_new_tokens only
        (what identical outputs across servers look like; FLEETCTL_SIM_DIVERGE=1 changes it when the
        patch's threshold is given). Not a model: no token is computed."""
        if self.path.split("?", 1)[0] != "/generate" or not self.server.ready:
            self._send(404 if self.server.ready else 503, b'{"detail":"Not Found"}')
            return
        try:
            n = min(int(self.headers.get("Content-Length") or 0), 1 << 20)
            req = json.loads(self.rfile.read(n) or b"{}")
            text = str(req.get("text", ""))
            max_new = max(0, min(int((req.get("sampling_params") or {}).get("max_new_tokens", 16)), 4096))
        except (ValueError, TypeError, AttributeError):
            self._send(400, b'{"error":"bad request"}')
            return
        info = self.server.info
        salt = "diverged" if os.environ.get("FLEETCTL_SIM_DIVERGE") and info.get(THRESHOLD_ARG) else ""
        import hashlib

        words = [hashlib.sha256(f"{salt}{text}:{i}".encode()).hexdigest()[:4] for i in range(max_new)]
        spec = info.get("speculative_algorithm")
        body = {"text": "[simulator] " + " ".join(words),
                "meta_info": {"completion_tokens": max_new, "spec_verify_ct": (max_new + 1) // 2 if spec else 0,
                              "simulator": True}}
        self._send(200, json.dumps(body).encode())

    def log_message(self, format: str, *args: Any) -> None:  # access lines go to stdout, like uvicorn
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        sys.stdout.write(f"[{stamp}] INFO:     {self.client_address[0]}:{self.client_address[1]} - "
                         f"\"{self.requestline}\" {args[1] if len(args) > 1 else ''}\n")
        sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    from fleetctl.engines.sglang import (
        READY_LINE,
        expected_ranks,
        format_line,
        format_startup_warning,
        resolve_worker,
        server_args_dump,
    )
    from fleetctl.remote.probe import code_marker

    argv = list(sys.argv[1:] if argv is None else argv)
    log(BANNER)
    flags = parse_argv(argv)
    try:
        pkg, version = find_sglang()
    except ModuleNotFoundError as e:
        traceback_exit(f"ModuleNotFoundError: {e}", "import sglang")
        return 1
    if version is None:
        traceback_exit(f"RuntimeError: cannot read the SGLang version from {pkg}/_version.py or version.py")
        return 1
    env = dict(os.environ)
    res = resolve_worker(version, flags, env)
    if not res.known:
        traceback_exit(f"RuntimeError: {res.reason}")
        return 1
    if res.startup_error and res.startup_error.startswith(ARGPARSE_ERRORS):  # argparse: usage, exit 2
        log(USAGE)
        log(f"launch_server.py: error: {res.startup_error}")
        return 2
    if res.startup_error:
        for w in res.warnings:
            log(format_startup_warning(version, w, datetime.now()))
        traceback_exit(res.startup_error)
        return 1
    # argparse: a flag neither the release knows nor the server_args.py ON DISK registers is refused
    # (e.g. the payload's flag on a host whose patch was never deployed, or was rolled back)
    try:
        sa_text = (pkg / "srt" / "server_args.py").read_text(encoding="utf-8", errors="replace")
    except OSError:
        sa_text = ""
    from fleetctl.remote.hostfacts import flag_registered

    # (a tree without server_args.py, as in unit tests, is not checked)
    rejected = [f for f in res.unknown_flags if sa_text and not flag_registered(sa_text, f)]
    if rejected:
        parts = []
        for f in rejected:
            v = flags.get(f)
            parts.append(f if v is True or v is None else f"{f} {v}")
        log(USAGE)
        log(f"launch_server.py: error: unrecognized arguments: {' '.join(parts)}")
        return 2
    # the self-contained checks of the server_args.py on disk (a patch's own validation included)
    from fleetctl.sandbox.server_args_checks import run_checks

    refused = run_checks(sa_text, dict(res.resolved_args), pkg) if sa_text else None
    if refused:
        traceback_exit(refused, "check_server_args")
        return 1
    ms = env.get("SGLANG_LOG_MS", "").lower() in ("1", "true", "yes", "y")

    def line(ranks: dict[str, int], msg: str) -> str:
        try:
            return format_line(version, ranks, msg, datetime.now(), ms=ms)
        except ValueError:  # SGLANG_LOG_MS not in this release
            return format_line(version, ranks, msg, datetime.now())

    # --log-level above INFO: the root logger drops INFO records (the dump, "Load weight", the marker,
    # the ready line); warnings and tracebacks still show
    from fleetctl.engines.sglang.processes import QUIET_LEVELS

    quiet = str(res.resolved_args.get("log_level") or "info").lower() in QUIET_LEVELS

    def info(text: str) -> None:
        if not quiet:
            log(text)

    # the worker module's code as import loads it NOW (a later deploy does not change this process)
    worker_has_marker = False
    marker = env.get("FLEETCTL_SIM_MARKER") or MARKER
    if res.worker_file and res.worker_class:
        code = worker_code(pkg, res.worker_file)
        worker_has_marker = code is not None and code_marker(code, res.worker_class, marker)["marker"]
    from fleetctl.sandbox.startup_logs import startup_messages, startup_sites

    # what the constructors the launch runs log (the Scheduler, the worker, the model, the attention
    # backends the flags name), from their code as import loads it; the payload's marker keeps its rule
    sites = startup_sites(pkg, (res.worker_file, res.worker_class) if res.worker_file and res.worker_class else None,
                          dict(res.resolved_args), env, os.getcwd())
    startup_lines = startup_messages(pkg, sites, worker_code, skip=marker)
    try:
        adaptive = adaptive_lines(version, res.worker_class, dict(res.resolved_args))
    except (OSError, ValueError) as e:
        traceback_exit(f"{type(e).__name__}: {e}", "AdaptiveSpeculativeParams")
        return 1
    info(line({}, f"fleetctl simulator: SGLang {version} at {pkg}; worker {res.worker_class} "
                 f"({res.worker_file}); {res.reason}"))
    for w in res.warnings:
        log(format_startup_warning(version, w, datetime.now()))
    args = dict(res.resolved_args)
    info(line({}, server_args_dump(version, args)))

    port = int(flags.get("--port") or args.get("port") or 30000)
    host = str(flags.get("--host") or "127.0.0.1")
    if host not in ("127.0.0.1", "localhost"):
        host = "127.0.0.1"  # the simulator never listens beyond loopback
    srv = _Server((host, port), _Handler, bind_and_activate=False)
    try:
        srv.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.server_bind()
        srv.server_activate()
    except OSError as e:
        srv.server_close()
        traceback_exit(f"OSError: [Errno {e.errno}] error while attempting to bind on address "
                       f"('{host}', {port}): Address already in use" if e.errno == 98 else f"OSError: {e}",
                       "uvicorn.run")
        return 1
    srv.info = {**args, "version": version, "simulator": True, "worker_class": res.worker_class}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()

    ranks = expected_ranks(version, args)
    for r in ranks:
        info(line(r, "Load weight begin. (simulated: nothing is loaded)"))
    if env.get("FLEETCTL_SIM_CRASH") == "startup":
        log(line(ranks[0], "Scheduler hit an exception: (simulated crash, FLEETCTL_SIM_CRASH=startup)"))
        srv.server_close()
        traceback_exit("RuntimeError: simulated crash during start-up (FLEETCTL_SIM_CRASH=startup)",
                       "run_scheduler_process")
        return 1
    delay = float(env.get("FLEETCTL_SIM_START_DELAY") or 0)
    if delay > 0 and stop.wait(delay):
        srv.shutdown()
        return 0
    drop = env.get("FLEETCTL_SIM_DROP_MARKER_RANK")
    threshold = args.get(THRESHOLD_ARG)
    for i, r in enumerate(ranks):
        info(line(r, "Load weight end. type=SimulatedModel (fleetctl simulator), nothing loaded"))
        for level, text in startup_lines:
            if level == "print":  # print(): the bare text, no logger prefix
                log(text)
            elif level == "info":
                info(line(r, text))
            else:
                log(line(r, text))
        if worker_has_marker and threshold not in (None, False) and str(i) != drop:
            info(line(r, f"{marker} (worker={res.worker_class}, threshold={threshold})"))
        if i == 0:  # logged on TP rank 0 only
            for text in adaptive:
                info(line(r, text))
    if env.get("FLEETCTL_SIM_HANDLED_TRACEBACK"):  # logged, survived: the server goes on to serve
        log(line({}, "Can not initialize OpenAIServingResponses, error: Traceback (most recent call last):"))
        log('  File "<fleetctl simulator>", line 1, in lifespan  (FLEETCTL_SIM_HANDLED_TRACEBACK)')
        log("ModuleNotFoundError: No module named 'openai_harmony'")
        log("")
    srv.ready = True
    info(line({}, READY_LINE))
    crash = env.get("FLEETCTL_SIM_CRASH") or ""
    if crash.startswith("after-ready"):  # serve a while (launch sees it healthy), then die
        if not stop.wait(float(crash.partition(":")[2] or 3)):
            srv.shutdown()
            srv.server_close()
            traceback_exit("RuntimeError: simulated crash after ready (FLEETCTL_SIM_CRASH=after-ready)",
                           "event_loop_overlap")
    while not stop.wait(0.2):
        pass
    info(line({}, "fleetctl simulator: SIGTERM received, shutting down"))
    srv.shutdown()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
