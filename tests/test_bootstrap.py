"""The bootstrap (fleetctl/remote/bootstrap.py) is a real function: the `-c` string the controller
sends is built from it, and it is run here against pipes, as a host runs it: the hello, the code
block, the secret-env block, a session of framed requests, the host's cache of the code."""

from __future__ import annotations

import ast
import json
import marshal
import os
import sys
from pathlib import Path

from agentpipe import boot

from fleetctl.remote import agent_key
from fleetctl.remote.bootstrap import bootstrap, command_text
from fleetctl.transport.session import HELLO, bootstrap_text, encode_request


def frames(out: bytes) -> list[dict]:
    docs = []
    while out:
        n = int(out[:10])
        docs.append(json.loads(out[10:10 + n]))
        out = out[10 + n:]
    return docs


def test_the_command_is_the_function() -> None:
    """The -c text is bootstrap's own code (same statements, shorter names), then its call; it is
    what agent_argv sends and parses as Python 3.8."""
    text = command_text()
    assert text == bootstrap_text() and text.endswith("\nbootstrap()\n")
    tree = ast.parse(text, feature_version=(3, 8))
    fn = tree.body[0]
    src = ast.parse(Path(sys.modules[bootstrap.__module__].__file__ or "").read_text()).body
    orig = next(n for n in src if isinstance(n, ast.FunctionDef) and n.name == "bootstrap")
    assert isinstance(fn, ast.FunctionDef) and len(list(ast.walk(fn))) == len(list(ast.walk(orig)))
    assert [type(n).__name__ for n in ast.walk(fn)] == [type(n).__name__ for n in ast.walk(orig)]
    # (sent on every agent start: 2,635 characters with the hello's cached parts, issue 34.2)
    assert '"""' not in text and "#" not in text and len(text) < 2700


def test_a_session_over_pipes_and_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    argv = [sys.executable, "-c", command_text(), str(cache), sys.executable, agent_key()]
    env = marshal.dumps({"FLEETCTL_TEST_SECRET": "s3cret"}, 4)
    ping = encode_request("ping")
    tail = b"E%010d" % len(env) + env + b"S" + (b"%010d" % len(ping) + ping) * 2
    hello, out, err, rc = boot(argv, tail)
    assert rc == 0, err
    assert hello[len(HELLO):len(HELLO) + 1] in (b"N", b"Z")  # nothing cached: the code is asked for
    docs = frames(out)
    assert len(docs) == 2 and all(d["ok"] and d["result"]["pong"] for d in docs), docs
    assert [f.name for f in cache.iterdir()] == [f"agent-{agent_key()}.src"]
    assert os.stat(cache / f"agent-{agent_key()}.src").st_mode & 0o777 == 0o600
    hello, out, err, rc = boot(argv, b"S" + b"%010d" % len(ping) + ping)
    assert rc == 0 and hello[len(HELLO):len(HELLO) + 1] == b"C" and frames(out)[0]["ok"], err
    (cache / f"agent-{agent_key()}.src").write_bytes(b"raise SystemExit(7)")  # changed: not run
    hello, out, err, rc = boot(argv, b"S" + b"%010d" % len(ping) + ping)
    assert rc == 0 and hello[len(HELLO):len(HELLO) + 1] != b"C" and frames(out)[0]["ok"], err


def test_one_shot_mode_and_the_secret_env(tmp_path: Path) -> None:
    """Without b"S", the rest of stdin (after the secret-env block) is one request."""
    env = marshal.dumps({"FLEETCTL_TEST_SECRET": "s3cret"}, 4)
    req = marshal.dumps({"action": "read_files", "package_dir": str(tmp_path), "paths": []}, 4)
    _, out, err, rc = boot([sys.executable, "-c", command_text()], b"E%010d" % len(env) + env + req)
    assert rc == 0 and json.loads(out) == {"ok": True, "result": {}}, err
