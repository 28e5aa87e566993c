"""`explain --probe`: ask each host's own SGLang which worker a launch selects, and hold fleetctl's
table (fleetctl.sglang.resolve_worker) to that answer.

The host runs fleetctl/sglang/host_probe.py under the launch's interpreter, options, environment
and cwd (agent action `engine_probe`, which is sent the script), with no GPU visible; SGLang's hardware queries are answered
from the host's nvidia-smi facts, which this module turns into the probe's `hardware` request.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from fleetctl.errors import ProbeInputError
from fleetctl.gpus import Gpu
from fleetctl.protocol import names
from fleetctl.protocol.answers import EngineProbeAnswer
from fleetctl.sglang.routing import Resolution

PROBE_TIMEOUT = 240.0
DISAGREE = "fleetctl's table and this host's SGLang disagree"  # (SGLangEngine.probe_disagree)

# CUDA compute capability by GPU model name (nvidia-smi's `name`), most specific first. nvidia-smi's
# facts carry the name, not the capability; a model not listed here is not guessed.
CAPABILITY: tuple[tuple[str, tuple[int, int]], ...] = (
    ("GB300", (10, 3)), ("B300", (10, 3)), ("GB200", (10, 0)), ("B200", (10, 0)), ("B100", (10, 0)),
    ("RTX PRO 6000 Blackwell", (12, 0)), ("RTX 50", (12, 0)),
    ("GH200", (9, 0)), ("H200", (9, 0)), ("H100", (9, 0)), ("H800", (9, 0)), ("H20", (9, 0)),
    ("L40", (8, 9)), ("L4", (8, 9)), ("RTX 6000 Ada", (8, 9)), ("RTX 40", (8, 9)),
    ("A100", (8, 0)), ("A800", (8, 0)), ("A30", (8, 0)), ("A10", (8, 6)), ("A40", (8, 6)), ("RTX A6000", (8, 6)),
    ("RTX 30", (8, 6)), ("T4", (7, 5)), ("V100", (7, 0)),
)


def capability(name: str) -> tuple[int, int] | None:
    for key, cap in CAPABILITY:
        if key in name:
            return cap
    return None


def hardware(gpus: list[Gpu] | None, use: tuple[int, ...]) -> dict[str, Any]:
    """The probe's hardware answers from nvidia-smi facts, for the GPUs the launch uses (all if none
    are named)."""
    if not gpus:
        raise ProbeInputError("no GPUs in the host's nvidia-smi facts: SGLang's hardware queries cannot be "
                              "answered (check nvidia-smi on the host)")
    chosen = [g for g in gpus if g.index in use] if use else list(gpus)
    if not chosen:
        raise ProbeInputError(f"the launch uses GPUs {','.join(map(str, use))}, which nvidia-smi does not list")
    names_ = sorted({g.name for g in chosen})
    cap = capability(names_[0])
    if len(names_) > 1 or cap is None:
        raise ProbeInputError(f"GPU model {', '.join(names_)!r}: compute capability not known to fleetctl "
                              "(the probe answers SGLang's capability queries from it)")
    mem = [g.memory_total_mib for g in chosen if g.memory_total_mib]
    if not mem:
        raise ProbeInputError("nvidia-smi reports no memory.total: SGLang's memory query cannot be answered")
    return {"count": len(chosen), "name": names_[0], "capability": list(cap), "memory_mib": min(mem)}


@cache
def host_probe_source() -> str:
    """The script the host runs under the launch's python (sent in each request: the agent is engine-blind)."""
    return resources.files("fleetctl.sglang").joinpath("host_probe.py").read_text(encoding="utf-8")


def run_probe(conn: Any, launch: dict[str, Any], argv: list[str], hw: dict[str, Any],
              timeout: float = PROBE_TIMEOUT) -> EngineProbeAnswer:
    ans: EngineProbeAnswer = conn.agent(names.ENGINE_PROBE, {"script": host_probe_source(), "launch": launch,
                                                             "argv": argv, "hardware": hw, "timeout": timeout},
                                        timeout=timeout + 30)
    return ans


@dataclass(frozen=True)
class Verdict:
    agrees: bool | None  # None: no comparison (the table does not know the release, or the probe failed)
    line: str  # one sentence for the user


def _probe_says(p: EngineProbeAnswer) -> str:
    if p.stage == "selected":
        return f"{p.worker_class} in {p.worker_file or p.worker_module}"
    if p.stage == "no_speculation":
        return "no speculative worker"
    if p.stage == "refused":
        return f"the server refuses to start: {p.error}"
    return f"no answer ({p.stage}: {p.error})"


def _table_says(r: Resolution) -> str:
    if r.startup_error:
        return f"the server refuses to start: {r.startup_error}"
    if r.worker_class:
        return f"{r.worker_class} in {r.worker_file}"
    if r.algorithm is None:
        return "no speculative worker"
    return f"{r.algorithm}: worker not modelled"


def compare(table: Resolution, p: EngineProbeAnswer) -> Verdict:
    """Does the table's answer for this launch agree with what the host's SGLang did?"""
    version = p.package_version or table.version
    if p.stage in ("import_failed", "probe_failed", "no_worker"):
        return Verdict(None, f"the host's SGLang could not be asked: {p.error or p.stage}")
    said = _probe_says(p)
    if not table.known:
        return Verdict(None, f"SGLang {version} is newer than fleetctl's table: the host's own SGLang is the "
                             f"only answer: {said}")
    if table.version != version:
        return Verdict(False, f"{DISAGREE}: the table was asked about {table.version}, the launch's python "
                              f"imports SGLang {version}")
    refused_t, refused_p = table.startup_error is not None, p.stage == "refused"
    if refused_t != refused_p:
        return Verdict(False, f"{DISAGREE}: table: {_table_says(table)}; SGLang {version}: {said}")
    if refused_p:
        return Verdict(True, f"SGLang {version} agrees: {said}")
    if p.stage == "no_speculation" and table.algorithm is None:
        return Verdict(True, f"SGLang {version} agrees: {said}")
    if table.worker_class is None and table.algorithm not in (None, "EAGLE", "EAGLE3", "STANDALONE"):
        return Verdict(None, f"SGLang {version}: {said} (the table does not model {table.algorithm})")
    if (table.worker_class, table.worker_file) != (p.worker_class, p.worker_file):
        return Verdict(False, f"{DISAGREE}: table: {_table_says(table)}; SGLang {version}: {said}")
    return Verdict(True, f"SGLang {version} agrees: {said}")
