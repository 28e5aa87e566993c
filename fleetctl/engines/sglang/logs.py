"""SGLang's log lines: parse them, and produce them (for the sandbox simulator), per release.

A line is `[YYYY-MM-DD HH:MM:SS(.mmm)?( DPx)?( PPx)?...( TPx)?( EPx)?] message`; only scheduler
processes carry rank components, each only when that dimension is > 1 (DP whenever a dp rank exists).
Before 0.5.11 ServerArgs warnings print bare (no brackets). Logs go to stderr.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from fleetctl.engines.base import LogLine
from fleetctl.engines.sglang import releases as R

READY_LINE = R.READY_LINE
DUMP_ANCHOR = R.DUMP_ANCHOR
RANK_KEYS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")

_LINE = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d{3})?)((?: [^\]\s]+)*)\] ?(.*)$", re.S)
_RANK = re.compile(r"^(DP|PP|ATTN_CP|MOE_DP|TP|EP)(\d+)$")


def parse_line(line: str) -> LogLine:
    """Split a log line into timestamp, rank components and message (bare lines keep it all)."""
    raw = line.rstrip("\r\n")
    m = _LINE.match(raw)
    if not m:
        return LogLine(raw, None, {}, raw)
    ranks: dict[str, int] = {}
    for token in m.group(2).split():
        r = _RANK.match(token)
        if r:  # other tokens (e.g. the encoder's " encode_server") carry no rank
            ranks[r.group(1)] = int(r.group(2))
    return LogLine(raw, m.group(1), ranks, m.group(3))


def _release(version: str) -> R.Release:
    try:
        return R.RELEASES[version]
    except KeyError:
        raise KeyError(f"unknown SGLang version {version!r}") from None


def _prefix(rel: R.Release, ranks: dict[str, int]) -> str:
    bad = set(ranks) - set(rel.log.prefix_order)
    if bad:
        raise ValueError(f"SGLang {rel.version} has no {', '.join(sorted(bad))} rank in its log prefix")
    return "".join(f" {k}{ranks[k]}" for k in rel.log.prefix_order if k in ranks)


def rank_prefix(version: str, *, dp: int | None, pp: int, tp: int, ep: int, tp_size: int, pp_size: int,
                dp_size: int, ep_size: int, attn_cp: int = 0, moe_dp: int = 0, attn_cp_size: int = 1,
                moe_dp_size: int = 1) -> str:
    """The prefix a scheduler on that rank puts after the timestamp, e.g. " PP1 TP0" (or "").

    `dp` is the scheduler's dp rank, None when it has none (dp_size == 1); `dp_size` is accepted for
    symmetry only: SGLang prints DP whenever a dp rank exists.
    """
    rel = _release(version)
    ranks: dict[str, int] = {}
    if dp is not None:
        ranks["DP"] = dp
    present = {"PP": (pp_size, pp), "TP": (tp_size, tp), "EP": (ep_size, ep)}
    if "ATTN_CP" in rel.log.prefix_order:
        present |= {"ATTN_CP": (attn_cp_size, attn_cp), "MOE_DP": (moe_dp_size, moe_dp)}
    for key, (size, rank) in present.items():
        if size > 1:
            ranks[key] = rank
    return _prefix(rel, ranks)


def expected_ranks(version: str, resolved_args: dict[str, Any]) -> list[dict[str, int]]:
    """The rank components of every scheduler process that logs, e.g. [{"TP": 0}, {"TP": 1}]; [{}] for tp=1.

    Mirrors how the launcher numbers schedulers: dp replicas (or dp-attention groups inside the TP
    group), pp stages, tp ranks; the EP / MOE_DP / ATTN_CP ranks derived from the tp rank.
    """
    rel = _release(version)
    a = {"tp_size": 1, "dp_size": 1, "pp_size": 1, "ep_size": 1, "attn_cp_size": 1, "moe_dp_size": 1}
    a |= {k: int(v) for k, v in resolved_args.items() if k in a and v is not None}
    tp, dp, pp, ep = a["tp_size"], a["dp_size"], a["pp_size"], a["ep_size"]
    has_cp = "ATTN_CP" in rel.log.prefix_order
    cp, moe_dp = (a["attn_cp_size"], a["moe_dp_size"]) if has_cp else (1, 1)
    # the attention-DP width: --attn-dp-size (0.5.22+, also what their dump holds), else the older
    # `--dp-size N --enable-dp-attention`; attention-DP groups live inside the one TP group
    attn_dp = int(resolved_args.get("attn_dp_size") or 1)
    if attn_dp == 1 and dp > 1 and resolved_args.get("enable_dp_attention"):
        attn_dp, dp = dp, 1
    replicas: list[int | None] = [None] if dp == 1 and attn_dp == 1 else list(range(dp))
    pp_ranks, tp_ranks = node_rank_ranges(resolved_args, tp, pp)
    out: list[dict[str, int]] = []
    for replica in replicas:
        for pp_rank in pp_ranks:
            for tp_rank in tp_ranks:
                dp_rank = replica
                if attn_dp > 1:
                    attn_tp = tp // attn_dp // cp
                    dp_rank = tp_rank // (attn_tp * cp)
                ranks: dict[str, int] = {} if dp_rank is None else {"DP": dp_rank}
                if pp > 1:
                    ranks["PP"] = pp_rank
                if has_cp and cp > 1:
                    ranks["ATTN_CP"] = (tp_rank // (tp // attn_dp // cp)) % cp
                if has_cp and moe_dp > 1:
                    ranks["MOE_DP"] = tp_rank // (tp // moe_dp)
                if tp > 1:
                    ranks["TP"] = tp_rank
                if ep > 1:
                    ranks["EP"] = tp_rank % (tp // moe_dp) // (tp // moe_dp // ep)
                out.append({k: ranks[k] for k in rel.log.prefix_order if k in ranks})
    return out


def node_rank_ranges(resolved_args: dict[str, Any], tp: int, pp: int) -> tuple[range, range]:
    """The pp and tp ranks whose schedulers run (and log) on THIS node: with --nnodes N each node
    starts only its share, split as the launcher does (pp stages across nodes first, then the tp
    group across the nodes of one stage)."""
    nnodes = int(resolved_args.get("nnodes") or 1)
    node_rank = int(resolved_args.get("node_rank") or 0)
    if nnodes <= 1:
        return range(pp), range(tp)
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp_rank = max(nnodes // pp, 1)
    tp_per_node = tp // nodes_per_pp_rank
    first_pp = pp_per_node * (node_rank // nodes_per_pp_rank)
    first_tp = tp_per_node * (node_rank % nodes_per_pp_rank)
    return range(first_pp, first_pp + pp_per_node), range(first_tp, first_tp + tp_per_node)


def _stamp(rel: R.Release, when: datetime, ms: bool) -> str:
    if ms and not rel.log.ms_supported:
        raise ValueError(f"SGLang {rel.version} has no SGLANG_LOG_MS (millisecond timestamps)")
    stamp = when.strftime("%Y-%m-%d %H:%M:%S")
    return stamp + (f".{when.microsecond // 1000:03d}" if ms else "")


def format_line(version: str, ranks: dict[str, int], message: str, when: datetime, ms: bool = False) -> str:
    """A log line exactly as `version` prints it (ms: SGLANG_LOG_MS is on)."""
    rel = _release(version)
    return f"[{_stamp(rel, when, ms)}{_prefix(rel, ranks)}] {message}"


def format_startup_warning(version: str, message: str, when: datetime) -> str:
    """A ServerArgs warning (Resolution.warnings): bare before 0.5.11, then `[date time] message`."""
    rel = _release(version)
    if not rel.log.prelog_timestamped:
        return message
    return f"[{_stamp(rel, when, False)}] {message}"


# --- the startup dump of the resolved ServerArgs -------------------------------------------------

def server_args_dump(version: str, resolved_args: dict[str, Any]) -> str:
    """The message of the startup dump line, e.g. "server_args=ServerArgs(model_path='m', tp_size=1, ...)".

    Known fields come in this release's ServerArgs field order; any other keys follow, in the
    order given (e.g. a patch's own speculative_disable_batch_threshold).
    """
    rel = _release(version)
    defaults = {f.dest: f.default for f in R.flags_for(version)}
    known = [k for k in rel.log.dump_fields if k in resolved_args or k in defaults]
    extra = [k for k in resolved_args if k not in rel.log.dump_fields]
    values = {**defaults, **resolved_args}
    if rel.log.dump_form == "dict":
        body = ", ".join(f"{k!r}: {values[k]!r}" for k in known + extra)
        return f"server_args={{{body}}}"
    body = ", ".join(f"{k}={values[k]!r}" for k in known + extra)
    return f"server_args=ServerArgs({body})"


_DUMP_START = re.compile(r"server_args=(ServerArgs\(|\{)")


def _outside_quotes(text: str) -> Iterator[tuple[int, str, int]]:
    """(index, character, bracket depth after it) for each character outside quotes; ([{< open a
    level and )]}> close one."""
    depth, quote, i = 0, "", 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        else:
            if c in "([{<":
                depth += 1
            elif c in ")]}>":
                depth -= 1
            yield i, c, depth
        i += 1


def _split_top(text: str) -> list[str]:
    """Split on commas that are outside quotes and brackets."""
    parts, start = [], 0
    for i, c, depth in _outside_quotes(text):
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def _close(text: str, opener: str) -> int:
    """Index of the bracket closing the one at text[0] (== opener), or -1."""
    pairs = {"(": ")", "{": "}"}
    for i, c, depth in _outside_quotes(text):
        if c in ")]}>" and depth == 0:
            return i if c == pairs[opener] else -1
    return -1


def _parse_exact(opener: str, body: str) -> dict[str, Any] | None:
    """The whole dump through `ast`, when it is valid Python; non-literal values kept as source text."""
    src = f"f({body})" if opener == "(" else f"{{{body}}}"
    try:
        node = ast.parse(src, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if isinstance(node, ast.Call):
        if any(k.arg is None for k in node.keywords) or node.args:
            return None
        return {k.arg: _node_value(k.value) for k in node.keywords if k.arg}
    if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
        return {str(_node_value(k)): _node_value(v) for k, v in zip(node.keys, node.values, strict=True)}
    return None


def _node_value(node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return ast.unparse(node)


def parse_server_args_dump(message: str) -> dict[str, Any] | None:
    """Fields of a `server_args=ServerArgs(...)` or `server_args={...}` dump (a message or whole line).

    Literal values are decoded; anything else (an enum repr, an object repr) is kept as its text.
    None when the text holds no dump.
    """
    m = _DUMP_START.search(message)
    if not m:
        return None
    opener = "(" if m.group(1).endswith("(") else "{"
    start = m.end() - 1
    end = _close(message[start:], opener)
    body = message[start + 1:start + end] if end > 0 else message[start + 1:].rstrip(")} \n")
    exact = _parse_exact(opener, body)
    if exact is not None:
        return exact
    out: dict[str, Any] = {}
    for part in _split_top(body):
        if opener == "(":
            key, sep, val = part.partition("=")
            key = key.strip()
        else:
            k, sep, val = part.partition(":")
            key = str(_value(k.strip()))
        if sep and key:
            out[key] = _value(val.strip())
    return out
