"""nvidia-smi CSV parsing on the real H200 captures (shipped with the sandbox stand-in)."""

from __future__ import annotations

from pathlib import Path

from fleetctl.protocol.gpus import combine, parse_query_apps, parse_query_gpu

CAP = Path(__file__).parent.parent / "fleetctl" / "sandbox" / "captures" / "h200-1gpu"


def test_idle_capture() -> None:
    gpus = combine((CAP / "query-gpu.csv").read_text(), (CAP / "query-apps-idle.csv").read_text())
    (g,) = gpus
    assert (g.index, g.name, g.memory_total_mib, g.memory_used_mib, g.memory_free_mib) == (
        0, "NVIDIA H200", 143771, 0, 143156)
    assert g.uuid.startswith("GPU-") and g.utilization_pct == 0
    assert g.processes == [] and not g.busy()


def test_busy_capture() -> None:
    gpus = combine((CAP / "query-gpu-busy.csv").read_text(), (CAP / "query-apps-busy.csv").read_text())
    (g,) = gpus
    assert g.memory_used_mib == 21711 and g.utilization_pct == 100
    (p,) = g.processes
    assert (p.pid, p.name, p.used_mib) == (423, "python3", 21702)
    assert g.busy()


def test_na_values_and_empty_output() -> None:
    text = ("index, uuid, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], utilization.gpu [%]\n"
            "0, GPU-x, NVIDIA H200, [N/A], [N/A], [N/A], [Not Supported]\n")
    (g,) = parse_query_gpu(text)
    assert g.memory_total_mib is None and g.utilization_pct is None and not g.busy()
    assert parse_query_gpu("") == [] and parse_query_apps("") == []
