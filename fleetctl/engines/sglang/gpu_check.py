"""SGLang's part of `fleetctl gpu-check`: how the tiny model's throwaway servers are launched (the
playbook's flags and env with the tiny model substituted, in three modes), the host scripts that
make the model and drive the server, and which of the playbook's flags is its threshold.

The command (fleetctl/ops/gpu_check.py) names no SGLang flag, env name or log line: it asks this
module through `engine().gpu_check()`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from fleetctl.engines.sglang import releases as R

_HERE = Path(__file__).parent
MODEL_SCRIPT = "tiny_models.py"
BENCH_SCRIPT = "gpu_bench.py"

MODEL_FLAG = "--model-path"
DRAFT_FLAG = "--speculative-draft-model-path"
SPEC_PREFIX = "--speculative-"
# the tiny draft is an EAGLE-3 draft; 3 steps, topk 1, 4 draft tokens: what was measured on an H200
TINY_SPEC: dict[str, Any] = {"--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
                             "--speculative-eagle-topk": 1, "--speculative-num-draft-tokens": 4}
# flags of the real launch that name the real model or spread it over GPUs/nodes: left out (one
# GPU, a local tiny model; a context length above the tiny model's 4096 would be refused)
DROPPED = frozenset({
    "--tokenizer-path", "--tokenizer-mode", "--revision", "--speculative-draft-model-revision",
    "--quantization", "--load-format", "--json-model-override-args", "--context-length",
    "--served-model-name", "--chat-template", "--trust-remote-code", "--host", "--port",
    "--dp", "--dp-size", "--ep", "--ep-size", "--pp", "--pp-size", "--nnodes", "--node-rank",
    "--dist-init-addr", "--enable-dp-attention", "--speculative-token-map", "--model-loader-extra-config",
    "--kv-cache-dtype", "--dtype", "--lora-paths", "--enable-lora",
})
# no download attempts for the local model
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
PHASES = ("spec-on", "spec-off", "dynamic")
PHASE_HELP = {
    "spec-on": "stock speculation on (the playbook's flags without the patch's own)",
    "spec-off": "speculation off (no speculative flag)",
    "dynamic": "the patch's dynamic mode (the playbook's flags, its threshold included)",
}


@dataclass
class Phase:
    """One throwaway server of the check: its name, the flags it starts with and what was changed."""

    name: str
    flags: dict[str, Any]
    env: dict[str, str]
    notes: list[str] = field(default_factory=list)


@cache
def script(name: str) -> str:
    """A host script's source (run by the agent as `-c` under the launch's python)."""
    return (_HERE / name).read_text(encoding="utf-8")


# Ports SGLang opens beside --port, as offsets from it: a few internal ports just above it, and on
# 0.5.12-0.5.14 (at least) a gRPC port at --port + 10000 that server_args refuses above 65535. The
# throwaway servers' port is picked so that every one of these is free and in range.
PORT_OFFSETS = (0, 1, 2, 3, 10000)


def model_script() -> str:
    return script(MODEL_SCRIPT)


def bench_script() -> str:
    return script(BENCH_SCRIPT)


def _tp(flag: str) -> bool:
    return flag in R.TP_SPELLINGS


def phases(flags: dict[str, Any], env: dict[str, str], patch_flags: set[str], models: dict[str, str],
           port: int, gpu: int | None) -> list[Phase]:
    """The three servers, in the order they run: spec-on, spec-off, dynamic. `flags`: the launch's
    flags as the playbook and inventory give them; `patch_flags`: those the stock release does not
    register (the patch's own); `models`: {"target": dir, "draft": dir} on the host."""
    dropped = sorted(k for k in flags if (k in DROPPED or _tp(k)) and k != R.PORT_FLAG)
    base = {k: v for k, v in flags.items() if k not in DROPPED and not _tp(k) and k not in (MODEL_FLAG, DRAFT_FLAG)}
    base.update({MODEL_FLAG: models["target"], R.PORT_FLAG: port, "--host": "127.0.0.1"})
    penv = {**env, **ENV}
    if gpu is not None:
        penv["CUDA_VISIBLE_DEVICES"] = str(gpu)
    changed = sorted(k for k in TINY_SPEC if k in flags and str(flags[k]) != str(TINY_SPEC[k]))
    notes = []
    if dropped:
        notes.append(f"left out for the tiny model: {', '.join(dropped)}")
    if changed:
        notes.append(f"set for the tiny EAGLE-3 draft: {', '.join(f'{k} {TINY_SPEC[k]}' for k in changed)}")
    spec = {**TINY_SPEC, DRAFT_FLAG: models["draft"]}
    on = {k: v for k, v in base.items() if k not in patch_flags}
    on.update(spec)
    off = {k: v for k, v in base.items() if k not in patch_flags and not k.startswith(SPEC_PREFIX)}
    dyn = dict(base)
    dyn.update(spec)
    return [Phase("spec-on", on, dict(penv), list(notes)), Phase("spec-off", off, dict(penv), list(notes)),
            Phase("dynamic", dyn, dict(penv), list(notes))]


def threshold(flags: dict[str, Any], patch_flags: set[str], args: list[str]) -> tuple[str, int] | None:
    """(flag, value) of the playbook's threshold: the argument its verify.never_fires_when names,
    else the one patch flag with an integer value. None: the playbook names none."""
    named = ["--" + a.replace("_", "-") for a in args]
    cands = [f for f in named if f in flags] or [f for f in sorted(patch_flags) if f in flags]
    found = []
    for f in cands:
        try:
            found.append((f, int(str(flags[f]))))
        except ValueError:
            continue
    return found[0] if len(found) == 1 or (found and named) else None


def tiny_model_facts() -> dict[str, Any]:
    """What the tiny models are, for the plan's text (no SGLang involved)."""
    return {"target": "LlamaForCausalLM, 8 layers, hidden 256, bigram (next token = perm(current))",
            "draft": "EAGLE-3 draft, 1 layer, first proposal right (accept length ~2)"}
