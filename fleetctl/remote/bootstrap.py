"""The bootstrap: what the host's python runs first (`PYTHON -c BOOTSTRAP CACHE_DIR PYTHON KEY MAGIC
CODEKEY PARTKEY...`, transport/session.py agent_argv). `bootstrap` below is that code as a function (stdlib
only, Python >= 3.8): linted and unit-tested here as code; `command_text()` turns it into the `-c`
string (its source without docstring and comments, local names shortened, then a call of it).

What it does, in order:
  argv: CACHE_DIR PYTHON KEY [MAGIC CODEKEY]: KEY the hash of what the controller ships (its source),
  CODEKEY the hash of that source compiled by an interpreter of bytecode MAGIC (marshal format 2 of
  (agent code, probe code, probe source)). The host's cache dir keeps one of the two, and it runs
  only if its bytes hash to the key (a regular 0600 file of ours, in a dir of ours nobody else can
  write): anything else, the code is sent again.
  argv after CODEKEY: the source keys of the agent's on-demand parts (fleetctl/remote ON_DEMAND, in
  its order, at most 8).
  The hello (session.py HELLO_SIZE bytes): b"FLAGENT", then "C" (the code is cached here) or which
  compression this python reads ("N" lzma, "Z" zlib only), then this interpreter's bytecode magic,
  then two hex digits: bit i set when the i-th part is in the cache (`part-KEY.TAG` compiled, or
  `part-KEY.src`; a regular 0600 file of ours), so the controller sends only the parts it lacks.
  Only said, not trusted: the part's bytes are hashed when it is loaded (core.py load_part), and one
  that does not match is asked for ("need_part").
  Unless cached, the code block follows on stdin: b"L"/b"Z" + 10-digit length + the compressed
  source (the agent's code, NUL, the launch probe's), compiled and kept in the cache.
  Then an optional secret-env block (b"E" + 10-digit length + marshalled dict): set in the agent's own
  environment, so secret values never appear on a command line (ps, /proc/*/cmdline, audit logs).
  Then b"S": a session, framed requests answered one by one until stdin ends (core.py serve), so one
  process serves every step of a command on this host; else one request up to EOF (serve_once).
  The sha256 is the interpreter's builtin one (hashlib.py adds ~1 ms to load). After a session every
  answer is flushed and every file the agent wrote is closed (with-blocks, fsync'd), so the
  interpreter's teardown of the code and its modules is skipped (os._exit: ~2 ms per host).
"""


def bootstrap():
    import marshal
    import os
    import sys

    stdin = sys.stdin.buffer
    argv = sys.argv + [""] * 5
    space = {"__name__": "fleetctl_agent"}
    for module in ("_sha256", "_sha2", "hashlib"):
        try:
            sha256 = __import__(module).sha256
            break
        except (ImportError, AttributeError):
            pass

    def digest(data):
        return sha256(data).hexdigest()[:32]

    def hex32(text):
        return len(text) == 32 and not text.strip("0123456789abcdef")

    def mine(path):
        st = os.lstat(path) if os.path.lexists(path) else None
        return st and st.st_uid == uid and not st.st_mode & 0o077 and st.st_mode & 0o170000 == 0o100000

    magic = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
    magic = magic.hex() if len(magic) == 4 else "00000000"
    tag = sys.implementation.cache_tag
    src_key = argv[3] * hex32(argv[3])
    code_key = argv[5] * (argv[4] == magic and hex32(argv[5]) and bool(tag))
    code = cache = shipped = None
    uid = os.getuid()
    try:
        root = os.path.expanduser(argv[1])
        if argv[1] and src_key:
            os.makedirs(root, 0o700, exist_ok=True)
            st = os.stat(root)
            if st.st_uid == uid and not st.st_mode & 0o022:
                cache = root
                for name in [code_key + "." + tag] * bool(code_key) + [src_key + ".src"]:
                    path = os.path.join(root, "agent-" + name)
                    if mine(path):
                        with open(path, "rb") as fh:
                            data = fh.read()
                        if digest(data) == name[:32]:
                            code = data if name[33:] == "src" else marshal.loads(data)
                            break
    except Exception:
        code = None
    hello = "C"
    if code is None:
        hello = "N"
        try:
            import lzma
        except ImportError:
            hello = "Z"
    try:
        bits = sum(1 << i for i, part in enumerate(sys.argv[6:14]) if cache and hex32(part) and tag and any(
            mine(os.path.join(cache, "part-%s.%s" % (part, end))) for end in (tag, "src")))
    except Exception:
        bits = 0
    sys.stdout.buffer.write(("FLAGENT" + hello + magic + "%02x" % bits).encode())
    sys.stdout.buffer.flush()
    if code is None:
        kind = stdin.read(1)
        shipped = stdin.read(int(stdin.read(10)))
        if kind == b"L":
            shipped = lzma.decompress(shipped)
        elif kind == b"Z":
            shipped = __import__("zlib").decompress(shipped)
        code = shipped
    if type(code) is bytes:
        agent, _, probe = code.partition(b"\0")
        probe = probe.decode()
        code = (compile(agent, "fleetctl-agent", "exec"), compile(probe, "fleetctl-probe", "exec"), probe)
        if shipped and cache and digest(shipped) == src_key:
            try:
                name, data = src_key + ".src", shipped
                compiled = marshal.dumps(code, 2)
                if code_key and digest(compiled) == code_key:
                    name, data = code_key + "." + tag, compiled
                tmp = os.path.join(cache, "agent-%s.%d" % (name, os.getpid()))
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                os.write(fd, data)
                os.close(fd)
                os.replace(tmp, os.path.join(cache, "agent-" + name))
            except Exception:
                pass
    code, space["PROBE_CODE"], space["PROBE_SOURCE"] = code
    exec(code, space)
    kind = stdin.read(1)
    if kind == b"E":
        os.environ.update(marshal.loads(stdin.read(int(stdin.read(10)))))
        kind = stdin.read(1)
    if kind == b"S":
        rc = space["serve"](stdin)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(space["serve_once"](kind + stdin.read()))


def command_text():
    """The `-c` string: `bootstrap`'s source without its docstring and comments, its local names
    shortened (single letters), one space per indent level, then `bootstrap()` called: the same
    code, a third of the bytes on every agent start's command line. (Controller side.)"""
    import ast
    import string

    with open(__file__, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "bootstrap")
    mine = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            mine.add(node.id)
        elif isinstance(node, ast.arg):
            mine.add(node.arg)
        elif isinstance(node, ast.FunctionDef) and node is not fn:
            mine.add(node.name)
    keep = {"marshal", "os", "sys", "lzma", "sha256"}  # imported names stay as they are
    short = iter(c for c in string.ascii_letters if c not in keep)
    names = {n: next(short) for n in sorted(mine - keep)}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in names:
            node.id = names[node.id]
        elif isinstance(node, ast.arg) and node.arg in names:
            node.arg = names[node.arg]
        elif isinstance(node, ast.FunctionDef) and node.name in names:
            node.name = names[node.name]
    lines = []
    for line in ast.unparse(fn).split("\n"):
        body = line.lstrip(" ")
        lines.append(" " * ((len(line) - len(body)) // 4) + body)
    return "\n".join(lines) + "\nbootstrap()\n"
