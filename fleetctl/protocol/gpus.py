"""Parsing nvidia-smi's CSV query output (--query-gpu / --query-compute-apps, --format=csv)."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class GpuProcess:
    pid: int | None
    name: str
    used_mib: int | None
    gpu_uuid: str


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_mib: int | None
    memory_used_mib: int | None
    memory_free_mib: int | None
    utilization_pct: int | None = None
    processes: list[GpuProcess] = field(default_factory=list)

    def busy(self, used_threshold_mib: int = 1024) -> bool:
        """In use by someone: a compute process, or memory in use beyond a small threshold."""
        return bool(self.processes) or (self.memory_used_mib or 0) > used_threshold_mib

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: str) -> int | None:
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value or "")
    if not m:
        return None  # "[N/A]", "[Not Supported]", ""
    return int(float(m.group(1)))


def _rows(text: str) -> list[dict[str, str]]:
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    rows = list(reader)
    header = [re.sub(r"\s*\[.*\]$", "", h.strip()) for h in rows[0]]
    return [dict(zip(header, (c.strip() for c in r), strict=False)) for r in rows[1:] if r]


def parse_query_gpu(text: str) -> list[Gpu]:
    gpus = []
    for r in _rows(text):
        idx = _num(r.get("index", ""))
        if idx is None:
            continue
        gpus.append(Gpu(
            index=idx,
            uuid=r.get("uuid", ""),
            name=r.get("name", ""),
            memory_total_mib=_num(r.get("memory.total", "")),
            memory_used_mib=_num(r.get("memory.used", "")),
            memory_free_mib=_num(r.get("memory.free", "")),
            utilization_pct=_num(r.get("utilization.gpu", "")),
        ))
    return gpus


def parse_query_apps(text: str) -> list[GpuProcess]:
    procs = []
    for r in _rows(text):
        procs.append(GpuProcess(
            pid=_num(r.get("pid", "")),
            name=r.get("process_name", ""),
            used_mib=_num(r.get("used_gpu_memory", "")),
            gpu_uuid=r.get("gpu_uuid", ""),
        ))
    return procs


def combine(gpu_csv: str, apps_csv: str) -> list[Gpu]:
    gpus = parse_query_gpu(gpu_csv)
    by_uuid = {g.uuid: g for g in gpus}
    for p in parse_query_apps(apps_csv):
        g = by_uuid.get(p.gpu_uuid)
        if g is not None:
            g.processes.append(p)
    return gpus
