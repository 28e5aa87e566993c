"""`explain --probe`: ask each host's own SGLang which worker a launch selects, and hold fleetctl's
table (fleetctl.engines.sglang.resolve_worker) to that answer.

The host runs fleetctl/engines/sglang/host_probe.py under the launch's interpreter, options, environment
and cwd (agent action `engine_probe`, which is sent the script), with no GPU visible; SGLang's hardware queries are answered
from the host's nvidia-smi facts, which this module turns into the probe's `hardware` request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from fleetctl.engines.sglang.routing import Resolution
from fleetctl.errors import ProbeInputError
from fleetctl.protocol import names
from fleetctl.protocol.answers import EngineProbeAnswer
from fleetctl.protocol.gpus import Gpu

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
    return resources.files("fleetctl.engines.sglang").joinpath("host_probe.py").read_text(encoding="utf-8")


def run_probe(conn: Any, launch: dict[str, Any], argv: list[str], hw: dict[str, Any],
              timeout: float = PROBE_TIMEOUT, overlay: dict[str, bytes] | None = None) -> EngineProbeAnswer:
    """`overlay`: package files (rel -> bytes) the host's SGLang imports instead of its own (the
    playbook's files as deploy would write them)."""
    import base64

    req: dict[str, Any] = {"script": host_probe_source(), "launch": launch, "argv": argv, "hardware": hw,
                           "timeout": timeout}
    if overlay:
        req["overlay"] = {rel: base64.b64encode(data).decode("ascii") for rel, data in overlay.items()}
    ans: EngineProbeAnswer = conn.agent(names.ENGINE_PROBE, req, timeout=timeout + 30)
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


COULD_NOT_ASK = "the host's SGLang could not be asked"
_MODEL_ERRORS = ("config.json", "huggingface.co", "HF_HUB_OFFLINE", "offline mode", "not a valid model identifier",
                 "LocalEntryNotFoundError", "RepositoryNotFoundError", "OfflineModeIsEnabled", "Can't load the configuration",
                 "We couldn't connect")
_MODEL_WHERE = ("/transformers/", "/huggingface_hub/", "hf_transformers_utils", "model_config")


def could_not_ask(table: Resolution, p: EngineProbeAnswer) -> str | None:
    """Why the probe's answer is not SGLang's answer about this launch but a reason it could not be
    asked here (None: it is an answer to compare): the model config not readable (missing, the hub
    offline), a flag the installed release does not know yet (the playbook's patch adds it and is not
    deployed), a package the probe's interpreter lacks (numpy on a bare sandbox host)."""
    err = p.error or ""
    if p.stage in ("import_failed", "probe_failed", "no_worker"):
        missing = re.search(r"No module named '([\w.]+)'", err)
        if missing and missing.group(1).split(".")[0] in ("numpy", "torch"):
            return (f"{COULD_NOT_ASK}: {err} (a host without SGLang's runtime requirements; on the sandbox, "
                    "`fleetctl sandbox up --cpu-sglang` makes hosts the probe can ask)")
        return f"{COULD_NOT_ASK}: {err or p.stage}"
    if p.stage != "refused":
        return None
    unknown = re.match(r"argparse: unrecognized arguments: (.*)$", err)
    if unknown:
        named = [w.split("=", 1)[0] for w in unknown.group(1).split() if w.startswith("--")]
        new = [f for f in named if f in table.unknown_flags]
        if new and len(new) == len(named):
            return (f"{COULD_NOT_ASK}: SGLang {p.package_version or table.version} as installed does not know "
                    f"{', '.join(new)} yet (a flag the playbook's patch adds: deploy it, then probe again)")
    where = p.error_where or ""
    if re.match(r"(ModuleNotFoundError|ImportError)\b", err):
        # the probe replays start-up without a GPU context (stand-ins for the device queries), so an
        # import it fails is no verdict on the real start-up: on the H200, 0.5.12's probe stopped at
        # "No module named 'cuda.tile'" while the same launch started and served
        return (f"{COULD_NOT_ASK}: its start-up replay stopped at an import ({err}"
                f"{', in ' + where if where else ''}); the real server may not make that import: "
                "`fleetctl launch` shows what it does")
    if any(s in err for s in _MODEL_ERRORS) or (err.startswith("OSError") and any(s in where for s in _MODEL_WHERE)):
        return (f"{COULD_NOT_ASK}: the launch's model config is not readable on the host ({err}); the host's "
                "SGLang reads it before it chooses a worker")
    return None


def compare(table: Resolution, p: EngineProbeAnswer) -> Verdict:
    """Does the table's answer for this launch agree with what the host's SGLang did? A probe that
    could not be asked (`could_not_ask`) is never a disagreement (agrees None)."""
    version = p.package_version or table.version
    why = could_not_ask(table, p)
    if why is not None:
        return Verdict(None, why)
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
