"""Run a python -c BOOTSTRAP process as the controller does: read its hello, answer it with the code
block the controller would send (session.code_block), then `tail`; return (hello, stdout after the
hello, stderr, exit code). Test helper for tests that drive the bootstrap without SSH."""

from __future__ import annotations

import subprocess

from fleetctl.transport.session import HELLO, HELLO_SIZE, code_block


def boot(argv: list[str], tail: bytes, *, code: bytes | None = None, timeout: float = 120,
         **kw: object) -> tuple[bytes, bytes, bytes, int]:
    """argv: the whole command (python, -c, BOOTSTRAP, args...). code: send this code block
    instead of the controller's answer to the hello (b"" for none)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            **kw)  # type: ignore[call-overload]
    assert proc.stdin is not None and proc.stdout is not None
    hello = proc.stdout.read(HELLO_SIZE)
    assert hello.startswith(HELLO), hello
    try:
        proc.stdin.write((code_block(hello) if code is None else code) + tail)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    proc.stdin = None  # closed: communicate() only reads
    out, err = proc.communicate(timeout=timeout)
    return hello, out, err, proc.returncode


def completed(argv: list[str], tail: bytes, **kw: object) -> subprocess.CompletedProcess[bytes]:
    """boot() as a CompletedProcess whose stdout is what followed the hello."""
    _, out, err, rc = boot(argv, tail, **kw)
    return subprocess.CompletedProcess(argv, rc, out, err)
