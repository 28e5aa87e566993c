"""The facts request's nvidia-smi queries (agent: hostfacts.gpu_start / gpu_queries, core.spawn_piped /
finish_bounded): started together when the request begins, read at its end, never outliving it.

nvidia-smi does not run on this machine: the `nvidia-smi` here is a shell script on PATH that answers
like the real one (the real H200 captures' CSV) and signals, through files, which query started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetctl.remote import core as rcore
from fleetctl.remote import hostfacts as rfacts

CAP = Path(__file__).parent.parent / "fleetctl" / "sandbox" / "captures" / "h200-1gpu"


def _stand_in(bin_dir: Path, gpus_body: str, apps_body: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    exe.write_text("#!/bin/sh\n"
                   "case \"$1\" in\n"
                   f"  --query-gpu=*) {gpus_body} ;;\n"
                   f"  --query-compute-apps=*) {apps_body} ;;\n"
                   "  *) exit 9 ;;\n"
                   "esac\n")
    exe.chmod(0o755)
    return exe


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a child not reaped would be one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def test_both_queries_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU query waits until the apps query has started: one after the other, it would wait for
    ever (the stand-in gives up after ~60 s of polling and exits 7, which the answer would show)."""
    marker = tmp_path / "apps-started"
    gpus_csv, apps_csv = CAP / "query-gpu.csv", CAP / "query-apps-idle.csv"
    _stand_in(tmp_path / "bin",
              f"i=0; while [ ! -e {marker} ]; do i=$((i+1)); [ $i -gt 6000 ] && exit 7; sleep 0.01; done; "
              f"cat {gpus_csv}",
              f": > {marker}; cat {apps_csv}")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    got = rfacts.action_facts({"gpus": True})["gpus"]
    assert got.get("reason") is None and got["available"] is True
    assert got["gpus"] == gpus_csv.read_text() and got["apps"] == apps_csv.read_text()
    assert got["path"] == str(tmp_path / "bin" / "nvidia-smi")


def test_a_failed_query_is_reported_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path / "bin", "echo 'NVIDIA-SMI has failed' >&2; exit 6", "echo no >&2; exit 5")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    got = rfacts.gpu_queries()
    assert got["available"] is False and got["reason"] == "nvidia-smi exit 6: NVIDIA-SMI has failed"
    _stand_in(tmp_path / "bin", f"cat {CAP / 'query-gpu.csv'}", "echo no >&2; exit 5")
    got = rfacts.gpu_queries()
    assert got["reason"] == "nvidia-smi exit 5: no" and got["gpus"] == (CAP / "query-gpu.csv").read_text()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert rfacts.gpu_queries() == {"available": False, "reason": "nvidia-smi not found on PATH"}


def test_a_hung_query_is_bounded_killed_and_reaped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(tmp_path / "bin", f"echo $$ > {tmp_path / 'gpus.pid'}; exec sleep 600",
              f"echo $$ > {tmp_path / 'apps.pid'}; exec sleep 600")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    got = rfacts.gpu_queries(timeout=0.5)  # only the bound ends this: both would sleep 10 minutes
    assert got["available"] is False and got["reason"] == "nvidia-smi failed: no answer within 0.5s"
    for name in ("gpus.pid", "apps.pid"):
        pid = int((tmp_path / name).read_text())
        assert not _alive(pid)


def _children() -> list[int]:
    """Pids of this process' children, live or not yet reaped (/proc: their parent pid)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2:].split()[1]) == os.getpid():
                out.append(int(entry.name))
    return out


def test_queries_never_outlive_a_request_that_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A facts request that raises before it reads nvidia-smi's answers still kills and reaps both
    (they are this process' children from the moment they are spawned)."""
    _stand_in(tmp_path / "bin", "exec sleep 600", "exec sleep 600")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    before = _children()
    pending = rfacts.gpu_start()
    spawned = [c["pid"] for _, c in pending["started"]]
    assert len(spawned) == 2 and set(spawned) <= set(_children())
    rcore.abandon([c for _, c in pending["started"]])
    assert _children() == before
    with pytest.raises(AttributeError):  # the request's own failure: a model that is not a mapping
        rfacts.action_facts({"gpus": True, "model": 5})
    assert _children() == before


def test_spawned_children_are_read_together_and_capped(tmp_path: Path) -> None:
    sh = rcore.which("sh")
    assert sh
    a = rcore.spawn_piped([sh, "-c", "head -c 200000 /dev/zero; printf e >&2; exit 2"])
    b = rcore.spawn_piped([sh, "-c", "printf b"])
    assert rcore.finish_bounded([a, b], 30, limit=1000) == [(2, b"\0" * 1000, b"e"), (0, b"b", b"")]
    assert a["fds"] == [] and b["fds"] == [] and a["pid"] is None
    with pytest.raises(OSError):
        rcore.spawn_piped([str(tmp_path / "no-such-exe")])
