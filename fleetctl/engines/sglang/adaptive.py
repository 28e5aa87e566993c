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
from typing import Any


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


OPEN_ERROR = "FileNotFoundError: cannot open --speculative-adaptive-config"


class LoaderError(ValueError):
    """The release's own loader raises: the text is its exception, as the server's start-up shows it."""


def loader_candidates(version: str, data: bytes) -> list[int]:
    """The candidate steps `version`'s start-up reads from an adaptive config file's bytes, step for
    step as its loader does (0.5.13+: `_load_adaptive_config` and `resolve_candidate_steps_from_config`
    in srt/speculative/adaptive_spec_params.py: every integer-string key's candidate_steps, positive
    ints on 0.5.13, non-negative from 0.5.14; their union, sorted). LoaderError: what it raises."""
    fmt = config_format(version)
    if fmt not in ("per_bs_positive", "per_bs"):
        raise LoaderError(f"SGLang {version} reads no per-batch-size adaptive config at start-up")
    try:
        cfg = json.loads(data[:MAX_CONFIG].decode("utf-8"))
    except UnicodeDecodeError as e:
        raise LoaderError(f"UnicodeDecodeError: {e}") from None
    except json.JSONDecodeError as e:
        raise LoaderError(f"json.decoder.JSONDecodeError: {e}") from None
    if not isinstance(cfg, dict):
        raise LoaderError(f"AttributeError: '{type(cfg).__name__}' object has no attribute 'items'")
    low = 1 if fmt == "per_bs_positive" else 0
    kind = "positive" if fmt == "per_bs_positive" else "non-negative"
    entries: dict[int, list[int]] = {}
    for key, entry in cfg.items():
        if not key.isdigit():
            continue
        if not isinstance(entry, dict):
            raise LoaderError(f"AttributeError: '{type(entry).__name__}' object has no attribute 'get'")
        steps = entry.get("candidate_steps")
        if not isinstance(steps, list) or not steps or not all(isinstance(s, int) and s >= low for s in steps):
            raise LoaderError(f"ValueError: BS {key}: candidate_steps must be a list of {kind} ints, got {steps!r}")
        try:
            entries[int(key)] = steps
        except ValueError as e:  # (a non-ASCII digit str.isdigit() accepts)
            raise LoaderError(f"ValueError: {e}") from None
    if not entries:
        raise LoaderError("ValueError: speculative_adaptive_config must contain at least one integer-string BS key, "
                          f"e.g. {{\"1\": {{\"candidate_steps\": [1,3,7]}}}}. Got keys: {list(cfg.keys())}")
    return sorted({s for steps in entries.values() for s in steps})


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


# ----------------------------------------------------------------------------- a playbook's launch


ZERO_STEPS_SINCE = "0.5.14"


def _truthy(value: object) -> bool:
    return value is True or (isinstance(value, str) and value.lower() in ("true", "1", "yes"))


def adaptive_configs(pb: Any) -> list[tuple[str, dict[str, Any]]]:
    """(state file name, parsed JSON object) of each state file an adaptive launch of `pb` names with
    --speculative-adaptive-config; empty when the launch does not use --speculative-adaptive."""
    from fleetctl.engines.base import refs

    flags = dict(pb.launch.flags)
    if not _truthy(flags.get("--speculative-adaptive")):
        return []
    names = refs(flags.get("--speculative-adaptive-config"))
    out = []
    for f in pb.state_files:
        if f.name in names:
            try:
                cfg = json.loads(f.data[:MAX_CONFIG].decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                continue
            if isinstance(cfg, dict):
                out.append((f.name, cfg))
    return out


def named_files(flags: dict[str, Any]) -> list[str]:
    """The host files a launch's flags name that start-up reads: the adaptive config of an adaptive
    launch (a playbook state file, `{file:NAME}`, is judged from the playbook's own bytes instead)."""
    path = flags.get("--speculative-adaptive-config")
    if not _truthy(flags.get("--speculative-adaptive")) or not isinstance(path, str) or not path or "{file:" in path:
        return []
    return [path]


def read_note(version: str, flags: dict[str, Any], files: dict[str, bytes | str] | None) -> str | None:
    """What explain says of the adaptive config an adaptive launch names, as read (None: nothing read)."""
    path = flags.get("--speculative-adaptive-config")
    if not _truthy(flags.get("--speculative-adaptive")) or not isinstance(path, str) or files is None:
        return None
    got = files.get(path)
    if got is None or isinstance(got, str):
        return None if got is None else f"adaptive config {path}: not readable on the host: {got}"
    if config_format(version) in ("per_bs_positive", "per_bs"):
        try:
            cands = loader_candidates(version, got)
        except LoaderError as e:
            return f"adaptive config {path}: SGLang {version}'s loader refuses it: {e}"
        zero = [k for k in zero_step_slots(json.loads(got.decode("utf-8")))]
        return (f"adaptive config {path} (read, {len(got)} bytes): SGLang {version}'s loader takes it: candidate steps "
                f"{cands}" + (f"; steps=0 from batch size {zero[0]}" if zero else ""))
    return f"adaptive config {path} (read, {len(got)} bytes): SGLang {version} reads it in the worker, not at start-up"


def zero_step_slots(cfg: dict[str, Any]) -> list[int]:
    """The batch-size keys of the slots whose candidate_steps include 0."""
    return sorted(int(k) for k, e in cfg.items() if k.isdigit() and isinstance(e, dict)
                  and isinstance(e.get("candidate_steps"), list) and 0 in e["candidate_steps"])


def release_refusal(pb: Any, version: str) -> str | None:
    """Why an adaptive playbook cannot run on `version` (None: not adaptive, or the release can), one line."""
    cfgs = adaptive_configs(pb)
    if not cfgs:
        return None
    zero = any(zero_step_slots(cfg) for _, cfg in cfgs)
    fmt = config_format(version)
    if zero and fmt != "per_bs":
        why = {None: "has no --speculative-adaptive", "flat": "takes no per-batch-size slots",
               "per_bs_positive": "refuses candidate_steps 0"}[fmt]
        return f"{pb.name} needs SGLang {ZERO_STEPS_SINCE}+ (steps=0 slots): SGLang {version} {why}"
    if fmt is None:
        return f"{pb.name} needs --speculative-adaptive, which SGLang {version} does not have (0.5.11+)"
    return None


def idle_slot_warnings(pb: Any, flags: dict[str, Any]) -> list[str]:
    """A steps=0 slot whose batch-size key is at or above the launch's --max-running-requests can never
    act (no batch is that large): one line per such slot. Nothing when the launch sets no limit."""
    raw = flags.get("--max-running-requests")
    try:
        limit = int(str(raw)) if raw is not None and not isinstance(raw, bool) else None
    except ValueError:
        limit = None
    if limit is None:
        return []
    return [f"{pb.name}: {name}: the steps=0 slot \"{key}\" (batches of {key}+ requests) "
            f"{'never acts' if key > limit else 'acts only on a full batch'}: --max-running-requests {limit} "
            f"caps every batch at {limit} requests; set the key below {limit} or raise --max-running-requests"
            for name, cfg in adaptive_configs(pb) for key in zero_step_slots(cfg) if key >= limit]


def config_check(version: str, data: bytes, initial_steps: int) -> tuple[bool, str]:
    """What `version`'s own loader makes of an adaptive config (patch check): ok, and one line."""
    try:
        start = parse_config(version, data, initial_steps)
    except (ValueError, UnicodeDecodeError) as e:
        return False, f"SGLang {version} refuses it: {e}"
    cfg = json.loads(data[:MAX_CONFIG].decode("utf-8"))
    slots = ", ".join(f"{k}: {cfg[k].get('candidate_steps')}" for k in sorted(
        (k for k in cfg if k.isdigit()), key=int)) if config_format(version) != "flat" else "flat"
    zero = zero_step_slots(cfg)
    tail = f"; steps=0 from batch size {zero[0]}" if zero else "; no steps=0 slot"
    return True, f"SGLang {version} loads it: slots {slots}; runtime states {start.candidates}{tail}"
