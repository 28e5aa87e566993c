"""Upstream --speculative-adaptive: its config file format and start-up log lines per release.

Read from the real wheels (srt/speculative/adaptive_spec_params.py, eagle_worker_v2.py):
  0.5.11-0.5.12  flat config: top-level "candidate_steps" (and the hysteresis knobs), no per-batch
                 slots; the initial --speculative-num-steps is added to the candidates
  0.5.13         per-batch-size slots: integer-string keys ("1", "8", ...) each with
                 "candidate_steps", a list of POSITIVE ints (steps=0 is refused)
  0.5.14-0.5.23  the same slots, candidate_steps NON-NEGATIVE: steps=0 means "no drafting" for the
                 batch sizes that slot covers (a batch uses the slot with the largest key <= its size)
Start-up lines (logged on TP rank 0 only):
  "AdaptiveSpeculativeParams initialized: steps=<n>, candidate_steps=<list>"  (smallest slot from 0.5.13)
  "Built adaptive runtime state steps=<n>: elapsed=<s>s, mem=<GB>GB"  (EAGLEWorkerV2, 0.5.12+, one per
  candidate step other than the initial one, whose state the worker already holds)
"""

from __future__ import annotations

import json
from dataclasses import dataclass


def release_key(v: str) -> tuple[int, ...]:
    """A release's order key, 0.5.15.post1 -> (0, 5, 15, 1) (the host side has no `packaging`)."""
    return tuple(int(x) for x in v.replace("post", "").split(".") if x.isdigit())

INIT_LINE = "AdaptiveSpeculativeParams initialized: steps={steps}, candidate_steps={candidates}"
BUILT_LINE = "Built adaptive runtime state steps={steps}: elapsed={elapsed:.2f}s, mem={mem:.2f}GB"
BUILT_PREFIX = "Built adaptive runtime state steps="
BUILT_SINCE = "0.5.12"  # EAGLEWorkerV2 builds one runtime state per candidate step
MAX_CONFIG = 1 << 20


def config_format(version: str) -> str | None:
    """flat | per_bs_positive | per_bs (steps=0 allowed) | None (no --speculative-adaptive)."""
    v = release_key(version)
    if v < release_key("0.5.11"):
        return None
    if v < release_key("0.5.13"):
        return "flat"
    if v < release_key("0.5.14"):
        return "per_bs_positive"
    return "per_bs"


def allows_zero_steps(version: str) -> bool:
    return config_format(version) == "per_bs"


@dataclass(frozen=True)
class AdaptiveStart:
    initial_steps: int
    first_slot: list[int]  # candidate steps of the smallest batch-size slot (the one logged)
    candidates: list[int]  # union of every slot's candidates: one runtime state each


def _slot(initial: int, steps: list[int]) -> tuple[int, list[int]]:
    cands = sorted(set(steps))
    return (initial if initial in cands else cands[len(cands) // 2]), cands


def parse_config(version: str, data: bytes, initial_steps: int) -> AdaptiveStart:
    """What the release's loader makes of the config bytes; ValueError with its message if it refuses."""
    fmt = config_format(version)
    if fmt is None:
        raise ValueError(f"SGLang {version} has no --speculative-adaptive")
    cfg = json.loads(data[:MAX_CONFIG].decode("utf-8"))
    if not isinstance(cfg, dict):
        raise ValueError(f"speculative_adaptive_config must be a JSON object, got {type(cfg).__name__}")
    if fmt == "flat":
        cands = sorted(set(cfg.get("candidate_steps", [1, 3, 7])) | {initial_steps})
        return AdaptiveStart(initial_steps, cands, cands)
    slots: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        low = 0 if fmt == "per_bs" else 1
        if not isinstance(steps, list) or not steps or not all(
                isinstance(s, int) and not isinstance(s, bool) and s >= low for s in steps):
            kind = "non-negative" if fmt == "per_bs" else "positive"
            raise ValueError(f"BS {key}: candidate_steps must be a list of {kind} ints, got {steps!r}")
        slots[int(key)] = steps
    if not slots:
        raise ValueError("speculative_adaptive_config must contain at least one integer-string BS key, "
                         f"e.g. {{\"1\": {{\"candidate_steps\": [1,3,7]}}}}. Got keys: {list(cfg)}")
    first_steps, first = _slot(initial_steps, slots[min(slots)])
    union = sorted({s for steps in slots.values() for s in steps})
    return AdaptiveStart(first_steps, first, union)


def startup_lines(version: str, worker_class: str | None, start: AdaptiveStart) -> list[str]:
    """The release's adaptive start-up messages (without the log prefix), in order."""
    out = [INIT_LINE.format(steps=start.initial_steps, candidates=start.first_slot)]
    if worker_class == "EAGLEWorkerV2" and release_key(version) >= release_key(BUILT_SINCE):
        out += [BUILT_LINE.format(steps=s, elapsed=0.0, mem=0.0)
                for s in start.candidates if s != start.initial_steps]
    return out


def large_batch_config(threshold: int, small: tuple[int, ...] = (1, 3, 7)) -> dict[str, object]:
    """A per-batch-size config (0.5.14+) whose batches ABOVE `threshold` requests use steps=0."""
    if threshold < 1:
        raise ValueError("threshold must be >= 1")
    return {"1": {"candidate_steps": list(small)}, str(threshold + 1): {"candidate_steps": [0]}}
