"""Issue 17: the host agent's own CPU per command. Requests reach the agent as marshal data, the
agent writes JSON with its own writer (jdumps) and reads its state files with jloads, hashes with
the builtin sha256, and checks names without `re`: each must say exactly what the code it replaced
said (json, hashlib, the old regexes), on every Python the agent supports."""

from __future__ import annotations

import enum
import hashlib
import json
import marshal
import math
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from agentpipe import boot

from fleetctl.remote import agent_key, agent_source, serverfacts
from fleetctl.remote import core as rcore
from fleetctl.remote import files as rfiles
from fleetctl.remote import hostfacts as rfacts
from fleetctl.remote import locate as rlocate
from fleetctl.remote import records as rrecords
from fleetctl.remote import transaction as rtx
from fleetctl.transport.session import BOOTSTRAP, HELLO, agent_command, encode_request

JSON_CASES = [
    None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, 1e-310, 0.1, float("nan"), float("inf"), float("-inf"),
    "", "plain/path.py", 'quote " and \\ backslash', "ctl \x00\x01\x1f\x7f \n\r\t\b\f", "é ü 中文 \U0001F600",
    "surrogate \udcff from a path", "\ud800 lone high", "/", "</script>", [], {}, [1, [2, [3, {}]]], (1, "a"),
    {"k": {"nested": [None, True, 1.25, "x"]}, 3: "int key", 2.5: "float key", True: "bool key", None: "null"},
    {"b": [], "a": {}, "c": [{}], "d": [1, {"z": 1, "y": [2, 3]}]},
]


def _same(got: object, want: object) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return got == want and type(got) is type(want)


@pytest.mark.parametrize("obj", JSON_CASES, ids=range(len(JSON_CASES)))
def test_jdumps_writes_what_json_dumps_writes(obj: object) -> None:
    for kw in ({}, {"indent": 1, "sort_keys": True}, {"indent": 2}):
        if kw.get("sort_keys") and isinstance(obj, dict) and len({type(k) for k in obj}) > 1:
            continue  # json cannot sort mixed keys either
        text = rcore.jdumps(obj, **kw)
        assert text == json.dumps(obj, **kw), kw
        assert rcore.jdumps(obj, native=False, **kw) == text  # the pure-Python writer (no _json)
        assert text.isascii()
        assert _same(json.loads(text), json.loads(json.dumps(obj)))


def test_jdumps_refuses_what_json_refuses() -> None:
    for bad in ({"x": object()}, {(1, 2): "tuple key"}, b"bytes", {1, 2}):
        with pytest.raises(TypeError):
            rcore.jdumps(bad)
        with pytest.raises(TypeError):
            rcore.jdumps(bad, native=False)
        with pytest.raises(TypeError):
            json.dumps(bad)


def test_an_unserialisable_result_is_an_error_answer_not_a_dead_agent() -> None:
    rcore.ACTIONS["_bad_for_test"] = lambda p: {"x": b"bytes"}
    try:
        doc = json.loads(rcore.handle_request(marshal.dumps({"action": "_bad_for_test"}, 4)))
    finally:
        del rcore.ACTIONS["_bad_for_test"]
    assert doc["ok"] is False and doc["kind"] == "internal" and "serialisable" in doc["error"]


GOOD_JSON = ['{"a": [1, 2.5, -3e5, true, false, null], "b": "\\u00e9\\ud83d\\ude00\\udcff"}', "  [ ]\n", "0",
             '"x"', "NaN", "[Infinity, -Infinity]", '{"k": {"k": {"k": []}}}', "\t\r\n{}\t\r\n", "1e400",
             '{"dup": 1, "dup": 2}', '"\\"\\\\\\/\\b\\f\\n\\r\\t"']
BAD_JSON = ["", " ", "[1,", "{} x", "'a'", "[1] [2]", "{'a': 1}", "[01]", '"\x01"', "nan", "[1,]", '{"a" 1}',
            "\ufeff{}", "tru", "{\"a\": 1}}"]


@pytest.mark.parametrize("text", GOOD_JSON)
def test_jloads_reads_what_json_loads_reads(text: str) -> None:
    want = json.loads(text)
    for data in (text, text.encode(), b"\xef\xbb\xbf" + text.encode()):
        got = rcore.jloads(data)
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
        assert _same(got, want) or isinstance(want, (list, dict))


@pytest.mark.parametrize("text", BAD_JSON)
def test_jloads_refuses_what_json_loads_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        json.loads(text)
    with pytest.raises(ValueError):
        rcore.jloads(text)


def test_state_files_read_back_through_jloads(tmp_path: Path) -> None:
    m = {"id": "d1", "files": [{"path": "srt/\udcffa.py", "sha_before": "0" * 64}], "created": 1.5, "n": None}
    p = tmp_path / "manifest.json"
    p.write_bytes(rcore.jdumps(m, indent=1, sort_keys=True).encode())
    assert rcore.read_json_file(str(p)) == m == json.loads(p.read_bytes())


class Color(enum.StrEnum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def test_requests_are_marshal_of_plain_data_as_json_saw_them() -> None:
    req = {"files": ("a", "b"), "state": Color.RED, "n": Level.HIGH, "keys": {2: "x", True: "y", None: "z"},
           "f": 1.5, "ok": False, "none": None, "s": "\udcff", "big": 2**80, "deep": [({"t": (1,)},)]}
    body = encode_request("facts", req)
    got = marshal.loads(body)
    assert got == {"action": "facts", **json.loads(json.dumps(req))}
    assert type(got["state"]) is str and type(got["n"]) is int and type(got["files"]) is list
    # bytes stay bytes (a file's content travels raw); anything else that is not plain is refused
    assert marshal.loads(encode_request("deploy", {"x": b"\x00\xff"}))["x"] == b"\x00\xff"
    with pytest.raises(TypeError):
        encode_request("facts", {"x": bytearray(b"bytes")})
    with pytest.raises(TypeError):
        encode_request("facts", {"x": {1, 2}})
    # and the agent answers it
    doc = json.loads(rcore.handle_request(encode_request("ping")))
    assert doc["ok"] and doc["result"]["pong"]


def test_secret_env_block_is_marshal(tmp_path: Path) -> None:
    from fleetctl.config.inventory import load_inventory

    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  h1:\n    address: 127.0.0.1\n    python: python3\n"
                   "    env: {HF_TOKEN: {value: 's3cret'}, PUBLIC: 'p'}\n")
    host = load_inventory(inv).hosts[0]
    argv, rest = agent_command(host)
    assert "s3cret" not in " ".join(argv) and "PUBLIC=p" in argv
    assert rest[:1] == b"E"
    m = int(rest[1:11])
    assert marshal.loads(rest[11:11 + m]) == {"HF_TOKEN": "s3cret"} and rest[11 + m:] == b"S"


def test_builtin_sha256_is_sha256_and_openssl_takes_over_for_big_inputs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rcore, "_SHA256_BYTES", [0])
    small = os.urandom(1000)
    h = rcore.sha256_new(small)
    assert h.hexdigest() == hashlib.sha256(small).hexdigest()
    assert type(h).__module__ in ("_sha256", "_sha2")  # not OpenSSL's _hashlib
    big = os.urandom(rcore.BUILTIN_SHA256_BYTES + 1)  # past the budget: OpenSSL is cheaper than the import
    h = rcore.sha256_new(big)
    assert h.hexdigest() == hashlib.sha256(big).hexdigest() and type(h).__module__ == "_hashlib"
    f = tmp_path / "f"
    f.write_bytes(big)
    assert rcore.sha256_file(str(f), chunk=1 << 16) == hashlib.sha256(big).hexdigest()
    assert rcore._SHA256_BYTES == [1000]


def test_a_request_hashes_a_file_once_while_it_is_unchanged(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "f.py"
    f.write_bytes(b"A = 1\n")
    reads = []
    real = rcore.sha256_new
    monkeypatch.setattr(rcore, "sha256_new", lambda *a, **k: reads.append(1) or real(*a, **k))
    monkeypatch.setattr(rcore, "_SHA_MEMO", [{}])  # what handle_request sets for the time of a request
    assert rcore.sha256_file(str(f)) == rcore.sha256_file(str(f)) == hashlib.sha256(b"A = 1\n").hexdigest()
    assert len(reads) == 1
    tmp = tmp_path / "new"
    tmp.write_bytes(b"A = 3\n")
    os.replace(tmp, f)  # what replace_file does: a new inode, hashed afresh
    assert rcore.sha256_file(str(f)) == hashlib.sha256(b"A = 3\n").hexdigest()
    f.write_bytes(b"A = 40\n")  # rewritten in place, another size
    assert rcore.sha256_file(str(f)) == hashlib.sha256(b"A = 40\n").hexdigest()
    assert len(reads) == 3
    rcore.handle_request(marshal.dumps({"action": "ping"}, 4))
    assert rcore._SHA_MEMO == [None]  # kept for one request only


# ------------------------------------------------------------------ string checks == the old regexes


def _strings(alphabet: str, n: int = 3000, longest: int = 12, seed: int = 17) -> list[str]:
    rnd = random.Random(seed)
    return [''.join(rnd.choice(alphabet) for _ in range(rnd.randint(0, longest))) for _ in range(n)]


def test_name_checks_match_the_regexes_they_replace() -> None:
    cases = [
        (r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}(/[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}){0,3}$", rrecords._state_name_ok,
         "aZ9_.-/ é\n", 14),
        (r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", serverfacts.instance_name_ok, "aZ9_.-/ é\n", 10),
        (r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$", rfacts._hub_id_ok, "aZ9_.-/ é", 10),
        (r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$", rfacts._revision_ok, "aZ9_.-/ é", 10),
        (r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", rfacts._ident_ok, "aZ9_.- é", 8),
        (r"^torch\s*($|[=<>!~;\[(])", rlocate._is_torch_requirement, "torch =<>!~;[(x\t", 9),
    ]
    for pattern, fn, alphabet, longest in cases:
        rx = re.compile(pattern)
        pool = [*_strings(alphabet, longest=longest), "torch", "torch>=2", "torchvision", "a" * 64, "a" * 65,
                "a" * 100, "a" * 101, "/".join(["a"] * 4), "/".join(["a"] * 5)]
        for s in pool:
            if s.endswith("\n"):
                continue  # `$` also matches before a final newline: the string checks refuse it (stricter)
            assert fn(s) == bool(rx.match(s)), (pattern, s)
    long_commit = "0123456789abcdef" * 2 + "01234567"
    for s in (long_commit, long_commit.upper(), long_commit[:-1], long_commit + "0", "g" * 40):
        assert rfacts._commit_ok(s) == bool(re.match(r"^[0-9a-f]{40}$", s))


def test_temp_and_pyc_names_match_the_regexes_they_replace() -> None:
    temp_rx = re.compile(r"^\.(?P<base>.+)\.fleetctl(?:-restore)?\.(?P<pid>\d+)\.tmp$")
    names = [".a.py.fleetctl.12.tmp", ".a.py.fleetctl-restore.7.tmp", ".a.fleetctl.fleetctl.1.tmp", ".fleetctl.1.tmp",
             "..fleetctl.1.tmp", ".a.py.fleetctl..tmp", ".a.py.fleetctl.x.tmp", "a.py.fleetctl.1.tmp",
             ".a.py.fleetctl.1.tmpx", ".a.py.fleetctl-restor.1.tmp", ".a.fleetctl-restore.fleetctl.3.tmp"]
    names += ["." + s + ".tmp" for s in _strings("a.fleti-rso0", longest=24)]
    for n in names:
        m = temp_rx.match(n)
        assert rtx._temp_name(n) == ((m.group("base"), int(m.group("pid"))) if m else None), n
    stem = "server_args"
    pyc_rx = re.compile("^" + re.escape(stem) + r"\.[A-Za-z0-9_-]+(?:\.opt-[0-9]+)?\.pyc$")
    tails = ["cpython-311.pyc", "cpython-311.opt-1.pyc", "cpython-311.opt-.pyc", "cpython-311.opt-1.2.pyc", ".pyc",
             "a.b.pyc", "cpython-311.pyc.bak", "pypy38.opt-12.pyc", "x.opt-a.pyc"]
    tails += _strings("cpyton-31.oa2", longest=16) + [s + ".pyc" for s in _strings("cpyton-31.opt2", longest=16)]
    for t in tails:
        n = stem + "." + t
        assert (n.startswith(stem + ".") and rfiles._pyc_tail(n[len(stem) + 1:])) == bool(pyc_rx.match(n)), n


def test_plain_version_lines_read_without_re() -> None:
    old = re.compile(r"""^((?:[A-Za-z_]\w*[ \t]*(?::[ \t]*str[ \t]*)?=[ \t]*)+)(['"])([^'"\\\n]*)\2[ \t]*(?:#.*)?$""")
    lines = ["__version__ = '0.5.9'", '__version__ = version = "0.5.9"', "version: str = '1.2'", "v = '1' # c",
             "v = '1' x", "  v = '1'", "v == '1'", "v = '1", "v = 'a\"b'", "v = 'a\\b'", "v = ''", "v:int = '1'",
             "v\t=\t'1'\t", "a.b = '1'", "1a = '1'", "v = \"1\"#", "v = '1'; w = 2", "__version_tuple__ = (0, 5)"]
    for line in lines:
        m = old.match(line)
        want = ([t.split(":")[0].strip() for t in m.group(1).split("=") if t.strip()], m.group(3)) if m else None
        got = rlocate._assign_line(line)
        assert (list(got[0]), got[1]) == want if got else want is None, line
    src = "# generated\n__version_tuple__ = version_tuple = (0, 5, 9)\n__version__ = version = '0.5.9'\n"
    assert rlocate.const_assign(src, ("__version__", "version")) == "0.5.9"


# ------------------------------------------------------------------ run_bounded (nvidia-smi without subprocess)


def test_run_bounded_exit_codes_output_caps_and_timeout(tmp_path: Path) -> None:
    sh = shutil.which("sh")
    assert sh
    rc, out, err = rcore.run_bounded([sh, "-c", "printf out; printf err >&2; exit 3"], 30)
    assert (rc, out, err) == (3, b"out", b"err")
    rc, out, _ = rcore.run_bounded([sh, "-c", "head -c 200000 /dev/zero"], 30, limit=1000)
    assert rc == 0 and out == b"\0" * 1000
    rc, _, _ = rcore.run_bounded([sh, "-c", "kill -9 $$"], 30)
    assert rc == -9
    pidfile = tmp_path / "pid"
    with pytest.raises(TimeoutError):  # only the bound ends this: the child would sleep 10 minutes
        rcore.run_bounded([sh, "-c", f"echo $$ > {pidfile}; exec sleep 600"], 0.5)
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists()  # killed and reaped (no clock: a child left to run is still there)
    with pytest.raises(OSError):
        rcore.run_bounded([str(tmp_path / "no-such-exe")], 5)
    assert rcore.which("sh") == sh or os.path.samefile(rcore.which("sh"), sh)


# ------------------------------------------------------------------ the shipped agent on every Python it supports


def _pythons() -> list[str]:
    """This interpreter and every other Python >= 3.8 found (PATH, pyenv), one per version."""
    from tests.pythons import pythons

    return pythons()


CHECK = r"""
import json, marshal, sys
from fleetctl_agent_check import jdumps, jloads
with open("cases.bin", "rb") as fh:
    cases = marshal.load(fh)
for obj in cases:
    text = jdumps(obj)
    assert text == json.dumps(obj) == jdumps(obj, native=False), (obj, text)
    back = jloads(text.encode())
    want = json.loads(text)
    assert json.dumps(back) == json.dumps(want)
print("ok", sys.version_info[:2])
"""


@pytest.mark.parametrize("python", _pythons())
def test_the_agent_session_on_each_python(python: str, tmp_path: Path) -> None:
    """The bootstrap, the marshal requests written here and the JSON answers written there, the
    cache key (builtin sha256 = hashlib's), on 3.8 (the oldest supported) up to the newest here."""
    src = agent_source()
    reqs = [encode_request("ping"), encode_request("facts", {"gpus": False, "with": ["state"],
                                                             "state_dir": str(tmp_path / "state")})]
    data = b"S" + b"".join(b"%010d" % len(r) + r for r in reqs)
    cache = tmp_path / "cache"
    key = agent_key()
    # the controller's answer to the hello: its compiled code where the magic is its own, else the source
    hello, out, err, rc = boot([python, "-c", BOOTSTRAP, str(cache), python, key], data)
    assert rc == 0, err[-2000:]
    # (then two hex digits: no on-demand part keys were given, so none is cached)
    assert hello[len(HELLO):] == b"N" + subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.MAGIC_NUMBER.hex())"], capture_output=True,
        text=True, check=True).stdout.strip().encode() + b"00"
    answers = []
    while out:
        n = int(out[:10])
        answers.append(json.loads(out[10:10 + n]))
        out = out[10 + n:]
    assert [a["ok"] for a in answers] == [True, True], answers
    assert answers[1]["result"]["state"]["deploys"] == []
    (f,) = cache.iterdir()
    assert f.name.startswith("agent-" + hashlib.sha256(src).hexdigest()[:32] + ".")
    # the controller's key (argv[3]) names the file: the next start asks for no code; a malformed
    # key means no cache (the code is asked for, nothing is written)
    for given, kind in ((key, b"C"), ("zz", b"N"), (key[:-1] + "G", b"N")):
        hello, out, err, rc = boot([python, "-c", BOOTSTRAP, str(cache), python, given], data)
        assert rc == 0 and out.count(b'"ok": true') == 2, err[-2000:]
        assert hello[len(HELLO):len(HELLO) + 1] == kind
        assert [x.name for x in cache.iterdir()] == [f.name]
    # the JSON writer and reader there say what that Python's json says
    (tmp_path / "fleetctl_agent_check.py").write_text(Path(rcore.__file__).read_text())
    (tmp_path / "cases.bin").write_bytes(marshal.dumps([c for c in JSON_CASES if c == c], 4))  # NaN != NaN
    p = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert p.returncode == 0 and p.stdout.startswith("ok"), p.stderr[-2000:]
