"""How a server ended, in one line (pure: the lines come from real shapes of Python tracebacks)."""

from __future__ import annotations

from fleetctl.ops.exits import exited_line, last_exception, status_text


def test_status_text() -> None:
    assert status_text(1) == "status 1"
    assert status_text(0) == "status 0"
    assert status_text(-9) == "killed by SIGKILL"
    assert status_text(-15) == "killed by SIGTERM"
    assert status_text(-200) == "killed by signal 200"


def test_last_exception_of_a_traceback_with_log_prefixes_and_chained_causes() -> None:
    tail = [
        "[2026-11-30 10:00:00 TP0] Load weight begin.",
        "Traceback (most recent call last):",
        '  File "x.py", line 3, in <module>',
        "KeyError: 'a'",
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "/srt/managers/scheduler.py", line 9, in run_scheduler_process',
        "    raise ValueError(msg)",
        "[2026-11-30 10:00:01 TP1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "[2026-11-30 10:00:01] Received sigquit from a child process. It usually means the child failed.",
    ]
    assert last_exception(tail) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert last_exception(["starting", "done"]) is None
    assert last_exception(["Traceback (most recent call last):", '  File "a", line 1', "oops: it broke"]) \
        == "oops: it broke"
    long = "RuntimeError: " + "x" * 1000
    assert len(last_exception(["Traceback (most recent call last):", long]) or "") < 310


def test_exited_line() -> None:
    tail = ["Traceback (most recent call last):", '  File "a", line 1', "RuntimeError: boom"]
    assert exited_line({"returncode": 1}, ready=False, tail=tail) == \
        "the server exited (status 1) before ready: RuntimeError: boom"
    assert exited_line({"returncode": -9}, ready=True, tail=[]) == "the server exited (killed by SIGKILL) after ready"
    assert exited_line(None, ready=False, tail=[]) == "the server exited before ready"
