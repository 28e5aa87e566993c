"""fleetctl.engines.sglang.logs: log line format per release, held to the real wheels, plus parser units."""

from __future__ import annotations

import ast
import copy
import inspect
import itertools
import types
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from fleetctl.engines import sglang, wheels
from fleetctl.engines.sglang import releases as R

DATA = Path(__file__).parent / "data" / "sglang"
VERSIONS = R.KNOWN_VERSIONS
WHEN = datetime(2026, 3, 1, 12, 34, 56, 789000)


def _cached(version: str) -> bool:
    return (wheels.cache_dir() / "trees" / version / ".complete").exists() or any(
        (wheels.cache_dir() / "wheels").glob(f"sglang-{version}-*.whl"))


def _params() -> list[Any]:
    return [pytest.param(v, id=v, marks=() if _cached(v) else pytest.mark.needs_download) for v in VERSIONS]


@cache
def tree(version: str, rel: str) -> ast.Module:
    return ast.parse((wheels.package_dir(version) / rel).read_text())


def strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def find_function(version: str, rels: list[str], name: str) -> ast.FunctionDef:
    for rel in rels:
        if (wheels.package_dir(version) / rel).exists():
            for n in ast.walk(tree(version, rel)):
                if isinstance(n, ast.FunctionDef) and n.name == name:
                    return n
    raise AssertionError(f"{version}: no {name}() in {rels}")


# --- against the wheels --------------------------------------------------------------------------

SIZE_OF = {"PP": "pp_size", "TP": "tp_size", "EP": "ep_size", "ATTN_CP": "attn_cp_size", "MOE_DP": "moe_dp_size"}


def _scheduler_prefix(version: str) -> list[tuple[str, str]]:
    """(component, condition) in the order the scheduler builds its log prefix."""
    sched = tree(version, "srt/managers/scheduler.py")
    for func in ast.walk(sched):
        if not isinstance(func, ast.FunctionDef) or "configure_logger" not in ast.unparse(func):
            continue
        out = []
        for node in ast.walk(func):
            if isinstance(node, ast.If):
                for stmt in node.body:
                    if isinstance(stmt, ast.AugAssign) and ast.unparse(stmt.target) == "prefix":
                        head = next(iter(strings(stmt.value)), "").strip()
                        out.append((head, ast.unparse(node.test)))
        if out:
            return out
    raise AssertionError(f"{version}: scheduler prefix not found")


@pytest.mark.parametrize("version", _params())
def test_rank_prefix_order_matches_scheduler(version: str) -> None:
    parts = _scheduler_prefix(version)
    assert tuple(p for p, _ in parts) == R.RELEASES[version].log.prefix_order
    for part, cond in parts:
        # 0.5.16+: shown_dp is dp_rank plus ep_join_rank_offset (an elastic-EP join; 0 otherwise)
        # 0.5.18+ read the size from the parallel config bag instead of server_args
        size = SIZE_OF.get(part, "")
        expected = ("dp_rank is not None", "shown_dp is not None") if part == "DP" \
            else (f"server_args.{size} > 1", f"configured_{size}() > 1", f"get_parallel().{size} > 1",
                  f"parallel.{size} > 1")
        assert cond in expected, (part, cond)


@pytest.mark.parametrize("version", _params())
def test_log_format_matches_configure_logger(version: str) -> None:
    rules = R.RELEASES[version].log
    func = find_function(version, ["srt/utils/common.py", "srt/utils.py"], "configure_logger")
    src = ast.unparse(func)
    assert ("SGLANG_LOG_MS" in src) == rules.ms_supported
    assert "'%Y-%m-%d %H:%M:%S'" in src
    assert any(s.startswith("[%(asctime)s") for s in strings(func))
    assert "] %(message)s" in "".join(strings(func))
    if rules.ms_supported:
        assert ".%(msecs)03d" in strings(func)
    prep = ast.unparse(find_function(version, ["srt/server_args.py"], "prepare_server_args"))
    assert ("logging.basicConfig(" in prep and "'[%(asctime)s] %(message)s'" in prep) == rules.prelog_timestamped


@pytest.mark.parametrize("version", _params())
def test_server_args_dump_form(version: str) -> None:
    rules = R.RELEASES[version].log
    engine = tree(version, "srt/entrypoints/engine.py")
    dumps = [n for n in ast.walk(engine) if isinstance(n, ast.JoinedStr) and "server_args=" in strings(n)]
    assert dumps, "no server_args= log line"
    for d in dumps:
        value = next(v for v in d.values if isinstance(v, ast.FormattedValue))
        if rules.dump_form == "repr":  # f"server_args={server_args!r}" or f"{server_args=}" (0.5.18)
            assert ast.unparse(value.value) == "server_args" and value.conversion in (ord("r"), -1)
        else:  # 0.5.19: the resolved dict; 0.5.23 passes it through a redaction helper first
            assert ast.unparse(value.value) in ("server_args.resolved_dict()",
                                                "_server_args_for_logging(server_args)"), ast.unparse(value.value)
            assert value.conversion == -1
            if "_server_args_for_logging" in ast.unparse(value.value):
                helper = find_function(version, ["srt/entrypoints/engine.py"], "_server_args_for_logging")
                assert "server_args.resolved_dict()" in ast.unparse(helper)
    mod = tree(version, "srt/server_args.py")
    cls = next(n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    if rules.dump_form == "repr":  # the dataclass repr is the dump
        assert not any(isinstance(n, ast.FunctionDef) and n.name in ("__repr__", "__str__") for n in cls.body)
    fields = [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    if rules.dump_form == "repr":
        assert any("dataclass" in ast.unparse(d) for d in cls.decorator_list)
    fields_dir = wheels.package_dir(version) / "srt" / "arg_groups" / "fields"
    if fields_dir.is_dir():  # 0.5.20+: fields declared by namespace classes; order not checked here
        for f in sorted(fields_dir.glob("*.py")):
            mod = tree(version, str(f.relative_to(wheels.package_dir(version))))
            fields += [s.target.id for c in mod.body if isinstance(c, ast.ClassDef) for s in c.body
                       if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    assert all(f in fields for f in rules.dump_fields), set(rules.dump_fields) - set(fields)
    if not fields_dir.is_dir():
        assert sorted(rules.dump_fields, key=fields.index) == list(rules.dump_fields)
    omitted = {"enable_multi_layer_eagle", "speculative_adaptive", "attn_cp_size", "moe_dp_size",
               "attn_dp_size"} & set(fields)
    assert omitted <= set(rules.dump_fields)


@pytest.mark.parametrize("version", _params())
def test_ready_line_in_http_server(version: str) -> None:
    assert sglang.READY_LINE in strings(tree(version, "srt/entrypoints/http_server.py"))


def _rank_formulas(version: str) -> list[ast.stmt]:
    """The launcher's assignments deriving attn-cp / moe-dp / moe-ep ranks from a tp rank, in order."""
    names = {"attn_dp_size", "attn_tp_size", "attn_cp_rank", "moe_dp_rank", "moe_ep_rank",
             "tp_size", "attn_cp_size", "moe_dp_size"}  # the last three: locals from 0.5.18 on
    out, seen = [], set()
    # 0.5.21+ lay out the ranks in the data-parallel controller
    files = [f for f in ("srt/entrypoints/engine.py", "srt/managers/data_parallel_controller.py")
             if "moe_ep_rank = " in (wheels.package_dir(version) / f).read_text()]
    for node in ast.walk(tree(version, files[0])):
        if isinstance(node, (ast.FunctionDef, ast.For)):
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name) \
                        and stmt.targets[0].id in names and stmt.targets[0].id not in seen:
                    seen.add(stmt.targets[0].id)
                    out.append(stmt)
    assert "moe_ep_rank" in seen
    return out


def _dp_attention_rank(version: str, **kw: Any) -> int:
    func = find_function(version, ["srt/layers/dp_attention.py"], "compute_dp_attention_world_info")
    # 0.5.19+ delegate the arithmetic to helpers in srt/runtime_context.py
    helpers = [n for n in tree(version, "srt/runtime_context.py").body if isinstance(n, ast.FunctionDef)
               and n.name.startswith("derive_att")] if (wheels.package_dir(version) / "srt/runtime_context.py").exists() \
        else []
    ns: dict[str, Any] = {}
    exec(compile(ast.Module(body=[*helpers, func], type_ignores=[]), "<dp_attention>", "exec"), ns)
    fn = ns["compute_dp_attention_world_info"]
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kw.items() if k in params})[2]


def _dp_layout_0522(version: str) -> Any:
    """0.5.22+: the release's own resolution of the DP layout, replayed on a namespace:
    `handle_deprecated_dp_attention` (parallel_hook.py), then `num_dp_ranks_of` and
    `attn_dp_enabled_of` (runtime_context.py). None for releases before it."""
    hook = wheels.package_dir(version) / "srt/arg_groups/parallel_hook.py"
    if not hook.exists() or "def handle_deprecated_dp_attention" not in hook.read_text():
        return None
    funcs = [copy.deepcopy(f) for f in (
        find_function(version, ["srt/arg_groups/parallel_hook.py"], "handle_deprecated_dp_attention"),
        *(find_function(version, ["srt/runtime_context.py"], n) for n in ("num_dp_ranks_of", "attn_dp_enabled_of")))]
    for f in funcs:  # their function-local imports are answered by the namespace below
        f.body = [st for st in f.body if not isinstance(st, ast.ImportFrom)]
    ns: dict[str, Any] = {"resolving_view": lambda sa: sa, "resolved_view": lambda sa: sa,
                          "ep_scale_joiner_of": lambda cfg: False,
                          "declare_resolution": lambda sa, _who, **kw: sa.__dict__.update(kw)}
    exec(compile(ast.Module(body=funcs, type_ignores=[]), "<dp_layout>", "exec"), ns)

    def resolve(sa: Any) -> tuple[int, bool]:
        ns["handle_deprecated_dp_attention"](sa)
        return ns["num_dp_ranks_of"](sa), ns["attn_dp_enabled_of"](sa)
    return resolve


LAYOUTS = [
    {"tp_size": 1}, {"tp_size": 2}, {"tp_size": 4, "pp_size": 2}, {"tp_size": 2, "dp_size": 2},
    {"tp_size": 8, "ep_size": 8}, {"tp_size": 8, "ep_size": 4, "pp_size": 2},
    {"tp_size": 8, "dp_size": 4, "enable_dp_attention": True},
    {"tp_size": 8, "dp_size": 2, "enable_dp_attention": True, "ep_size": 8},
    {"tp_size": 8, "moe_dp_size": 2, "ep_size": 4}, {"tp_size": 8, "attn_cp_size": 2},
    {"tp_size": 2, "dp_size": 1, "enable_dp_attention": True},
    # 0.5.22+: --attn-dp-size
    {"tp_size": 8, "attn_dp_size": 4}, {"tp_size": 8, "attn_dp_size": 2, "ep_size": 8, "pp_size": 2},
    {"tp_size": 8, "attn_dp_size": 2, "attn_cp_size": 2}, {"tp_size": 4, "attn_dp_size": 2, "dp_size": 1},
]


@pytest.mark.parametrize("version", _params())
def test_expected_ranks_follow_the_launcher(version: str) -> None:
    rules = R.RELEASES[version].log
    formulas = _rank_formulas(version)
    layout_0522 = _dp_layout_0522(version)
    has_attn_dp = "attn_dp_size" in {f.dest for f in R.flags_for(version)}
    assert has_attn_dp == (layout_0522 is not None)
    spawn = None
    rc = wheels.package_dir(version) / "srt/runtime_context.py"
    found = [n for n in ast.walk(tree(version, "srt/runtime_context.py")) if isinstance(n, ast.FunctionDef)
             and n.name == "derive_spawn_ranks"] if rc.exists() else []
    if found:
        spawn_ns: dict[str, Any] = {}
        exec(compile(ast.Module(body=found, type_ignores=[]), "<runtime_context>", "exec"), spawn_ns)
        spawn = spawn_ns["derive_spawn_ranks"]
    checked = 0
    for layout in LAYOUTS:
        if not set(layout) <= {"tp_size", "pp_size", "dp_size", "ep_size", "enable_dp_attention", "attn_dp_size"} \
                and "ATTN_CP" not in rules.prefix_order:
            continue
        if "attn_dp_size" in layout and not has_attn_dp:
            continue
        a = {"tp_size": 1, "pp_size": 1, "dp_size": 1, "ep_size": 1, "attn_cp_size": 1, "moe_dp_size": 1,
             "enable_dp_attention": False, **layout}
        server_args = types.SimpleNamespace(**a)
        if layout_0522 is not None:  # the release resolves the layout itself: replicas or attention-DP groups
            server_args.attn_dp_size = a.get("attn_dp_size", 1)
            num_dp_ranks, attn_dp_on = layout_0522(server_args)
            attn_dp = server_args.attn_dp_size
            replicas: Any = [0] if attn_dp_on else ([None] if num_dp_ranks == 1 else range(num_dp_ranks))
        else:
            attn_dp_on = a["dp_size"] > 1 and a["enable_dp_attention"]
            attn_dp = a["dp_size"] if attn_dp_on else 1
            replicas = [None] if a["dp_size"] == 1 else ([0] if a["enable_dp_attention"] else range(a["dp_size"]))
        want = []
        for replica, pp, tp in itertools.product(replicas, range(a["pp_size"]), range(a["tp_size"])):
            ns: dict[str, Any] = {"server_args": server_args, "tp_rank": tp, "get_parallel": lambda sa=server_args: sa}
            for stmt in formulas:
                exec(compile(ast.Module(body=[stmt], type_ignores=[]), "<engine>", "exec"), ns)
            if spawn is not None:  # 0.5.21+: every rank of a spawned scheduler comes from one function
                ns.update(spawn(world_rank=a["tp_size"] * pp + tp, tp_size=a["tp_size"], ep_join_rank_offset=0,
                                attn_cp_size=a["attn_cp_size"],
                                attn_tp_size=a["tp_size"] // attn_dp // a["attn_cp_size"],
                                moe_dp_size=a["moe_dp_size"], moe_ep_size=a["ep_size"]))
            dp = replica
            if attn_dp_on:
                dp = _dp_attention_rank(version, enable_dp_attention=True, tp_rank=tp, tp_size=a["tp_size"],
                                        dp_size=attn_dp, attn_dp_size=attn_dp, attn_cp_size=a["attn_cp_size"])
            prefix = sglang.rank_prefix(
                version, dp=dp, pp=pp, tp=tp, ep=ns["moe_ep_rank"], tp_size=a["tp_size"], pp_size=a["pp_size"],
                dp_size=a["dp_size"], ep_size=a["ep_size"], attn_cp=ns.get("attn_cp_rank", 0),
                moe_dp=ns.get("moe_dp_rank", 0), attn_cp_size=a["attn_cp_size"], moe_dp_size=a["moe_dp_size"])
            want.append(sglang.parse_line(f"[2026-01-01 00:00:00{prefix}] x").ranks)
        assert sglang.expected_ranks(version, a) == want, layout
        if layout_0522 is not None:  # the resolved form the release dumps (dp_size=1, attn_dp_size=N) too
            dumped = {**vars(server_args), "enable_dp_attention": server_args.attn_dp_size > 1}
            assert sglang.expected_ranks(version, dumped) == want, (layout, dumped)
            # and fleetctl's own resolution of the launch flags gives that same dumped layout
            flags = {f"--{k.replace('_', '-')}": v for k, v in layout.items()}
            res = sglang.resolve_worker(version, flags, {})
            assert {k: res.resolved_args[k] for k in ("dp_size", "attn_dp_size", "enable_dp_attention")} == \
                {k: dumped[k] for k in ("dp_size", "attn_dp_size", "enable_dp_attention")}, layout
        checked += 1
    assert checked >= 9
    controller = ast.unparse(tree(version, "srt/managers/data_parallel_controller.py"))
    loop = "for dp_rank in range(get_parallel().num_dp_ranks)" if layout_0522 else \
        ("for dp_rank in range(server_args.dp_size)", "for dp_rank in range(get_parallel().dp_size)")
    assert (loop in controller) if isinstance(loop, str) else any(x in controller for x in loop)


def _node_range_formulas(version: str) -> list[ast.stmt]:
    """The launcher's (dp_size == 1) assignments that pick the pp and tp ranks a node runs, in source order."""
    names = ["pp_size_per_node", "nnodes_per_pp_rank", "pp_rank_range", "nnodes_per_tp_group", "tp_size_per_node",
             "tp_rank_range"]
    for node in ast.walk(tree(version, "srt/entrypoints/engine.py")):
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        got = [st for st in body if isinstance(st, ast.Assign) and isinstance(st.targets[0], ast.Name)
               and st.targets[0].id in names]
        if {"pp_rank_range", "tp_rank_range"} <= {st.targets[0].id for st in got}:  # (their order varies)
            return got
    raise AssertionError(f"{version}: no per-node rank ranges in srt/entrypoints/engine.py")


@pytest.mark.parametrize("version", _params())
def test_each_node_logs_only_its_own_ranks(version: str) -> None:
    formulas = _node_range_formulas(version)
    for tp, pp, nnodes in [(8, 1, 2), (16, 1, 4), (8, 2, 2), (4, 4, 2), (8, 2, 4), (4, 1, 1)]:
        for node_rank in range(nnodes):
            server_args = types.SimpleNamespace(tp_size=tp, pp_size=pp, nnodes=nnodes, node_rank=node_rank)
            # inline on server_args in some releases, a helper taking the four as parameters in others,
            # a helper reading the parallel config (get_parallel()) from 0.5.21
            ns: dict[str, Any] = {"server_args": server_args, "parallel": server_args, **vars(server_args)}
            for stmt in formulas:
                exec(compile(ast.Module(body=[stmt], type_ignores=[]), "<engine>", "exec"), ns)
            args = {"tp_size": tp, "pp_size": pp, "nnodes": str(nnodes), "node_rank": str(node_rank)}
            got = sglang.expected_ranks(version, args)
            want = [{**({"PP": a} if pp > 1 else {}), **({"TP": b} if tp > 1 else {})}
                    for a in ns["pp_rank_range"] for b in ns["tp_rank_range"]]
            order = R.RELEASES[version].log.prefix_order
            assert got == [{k: w[k] for k in order if k in w} for w in want], (tp, pp, nnodes, node_rank)


# --- units -------------------------------------------------------------------------------------

def test_parse_line_forms() -> None:
    line = sglang.parse_line("[2026-03-01 12:34:56 DP1 PP0 TP3 EP3] Decode batch, #running-req: 4, accept len: 2.17,\n")
    assert line.timestamp == "2026-03-01 12:34:56" and line.ranks == {"DP": 1, "PP": 0, "TP": 3, "EP": 3}
    assert line.message == "Decode batch, #running-req: 4, accept len: 2.17,"
    ms = sglang.parse_line("[2026-03-01 12:34:56.789 ATTN_CP1 MOE_DP0 TP2] hi")
    assert ms.timestamp.endswith(".789") and ms.ranks == {"ATTN_CP": 1, "MOE_DP": 0, "TP": 2}
    plain = sglang.parse_line(f"[2026-03-01 12:34:56] {sglang.READY_LINE}")
    assert plain.ranks == {} and plain.message == sglang.READY_LINE
    bare = sglang.parse_line("Overlap scheduler is disabled because of using eagle3 or standalone speculative decoding.")
    assert bare.timestamp is None and bare.ranks == {} and bare.message.startswith("Overlap scheduler")
    odd = sglang.parse_line("[2026-03-01 12:34:56 encode_server] started")
    assert odd.timestamp and odd.ranks == {} and odd.message == "started"
    assert sglang.parse_line("[not a date] x").timestamp is None
    uvicorn = sglang.parse_line('[2026-03-01 12:34:56] INFO:     127.0.0.1:4 - "GET /health HTTP/1.1" 200 OK')
    assert uvicorn.message.startswith("INFO:")


def test_format_line_per_release() -> None:
    ranks = {"DP": 0, "PP": 1, "TP": 2, "EP": 2}
    assert sglang.format_line("0.5.4.post3", ranks, "m", WHEN) == "[2026-03-01 12:34:56 DP0 TP2 EP2 PP1] m"
    assert sglang.format_line("0.5.5.post1", ranks, "m", WHEN) == "[2026-03-01 12:34:56 DP0 PP1 TP2 EP2] m"
    assert sglang.format_line("0.5.14", {"TP": 1}, "m", WHEN, ms=True) == "[2026-03-01 12:34:56.789 TP1] m"
    assert sglang.format_line("0.5.9", {}, "m", WHEN) == "[2026-03-01 12:34:56] m"
    with pytest.raises(ValueError):
        sglang.format_line("0.5.5", {}, "m", WHEN, ms=True)  # no SGLANG_LOG_MS yet
    with pytest.raises(ValueError):
        sglang.format_line("0.5.8", {"ATTN_CP": 1}, "m", WHEN)
    for version in VERSIONS:
        for ranks in sglang.expected_ranks(version, {"tp_size": 2, "pp_size": 2, "ep_size": 2, "dp_size": 2}):
            assert sglang.parse_line(sglang.format_line(version, ranks, "x", WHEN)).ranks == ranks
    assert sglang.format_startup_warning("0.5.10.post1", "w", WHEN) == "w"
    assert sglang.format_startup_warning("0.5.11", "w", WHEN) == "[2026-03-01 12:34:56] w"


def test_rank_prefix_and_expected_ranks() -> None:
    kw = {"pp_size": 1, "dp_size": 1, "ep_size": 1}
    assert sglang.rank_prefix("0.5.9", dp=None, pp=0, tp=0, ep=0, tp_size=1, **kw) == ""
    assert sglang.rank_prefix("0.5.9", dp=None, pp=0, tp=1, ep=0, tp_size=2, **kw) == " TP1"
    assert sglang.rank_prefix("0.5.4.post3", dp=1, pp=1, tp=1, ep=1, tp_size=2, pp_size=2, dp_size=2,
                              ep_size=2) == " DP1 TP1 EP1 PP1"
    assert sglang.expected_ranks("0.5.9", {"tp_size": 1}) == [{}]
    assert sglang.expected_ranks("0.5.9", {"tp_size": 2}) == [{"TP": 0}, {"TP": 1}]
    assert sglang.expected_ranks("0.5.9", {"tp_size": 2, "dp_size": 2}) == [
        {"DP": 0, "TP": 0}, {"DP": 0, "TP": 1}, {"DP": 1, "TP": 0}, {"DP": 1, "TP": 1}]
    res = sglang.resolve_worker("0.5.12", {"--speculative-algorithm": "EAGLE3", "--tp": 4}, {})
    assert [r["TP"] for r in sglang.expected_ranks("0.5.12", res.resolved_args)] == [0, 1, 2, 3]


def test_server_args_dump_round_trip() -> None:
    res = sglang.resolve_worker("0.5.9", {"--model-path": "meta-llama/Meta-Llama-3.1-8B-Instruct",
                                          "--speculative-algorithm": "EAGLE3", "--speculative-num-steps": 3,
                                          "--speculative-eagle-topk": 4, "--speculative-num-draft-tokens": 16,
                                          "--tp-size": 2, "--speculative-disable-batch-threshold": 32}, {})
    dump = sglang.server_args_dump("0.5.9", res.resolved_args)
    assert dump.startswith("server_args=ServerArgs(model_path='meta-llama/Meta-Llama-3.1-8B-Instruct', ")
    parsed = sglang.parse_server_args_dump(dump)
    assert parsed["disable_overlap_schedule"] is True and parsed["tp_size"] == 2
    assert parsed["speculative_eagle_topk"] == 4 and parsed["speculative_disable_batch_threshold"] == 32
    assert list(parsed)[:3] == ["model_path", "max_running_requests", "tp_size"]
    line = sglang.format_line("0.5.9", {}, dump, WHEN)
    assert sglang.parse_server_args_dump(sglang.parse_line(line).message) == parsed
    assert sglang.parse_server_args_dump(line) == parsed
    minimal = sglang.server_args_dump("0.5.14", {"model_path": "m", "disable_overlap_schedule": False})
    assert list(sglang.parse_server_args_dump(minimal))[:3] == ["model_path", "max_running_requests",
                                                                "disable_overlap_schedule"]


def test_parse_server_args_dump_robust() -> None:
    messy = ("server_args=ServerArgs(model_path='a,b(c)', tp_size=2, load_format=<LoadFormat.AUTO: 'auto'>, "
             "json_model_override_args='{\"x\": [1, 2]}', lora_paths={'a': 'p'}, disable_overlap_schedule=True, "
             "weird=SomeThing(1, k=2), ratio=0.9)")
    p = sglang.parse_server_args_dump(messy)
    assert p["model_path"] == "a,b(c)" and p["tp_size"] == 2 and p["disable_overlap_schedule"] is True
    assert p["load_format"] == "<LoadFormat.AUTO: 'auto'>" and p["weird"] == "SomeThing(1, k=2)"
    assert p["lora_paths"] == {"a": "p"} and p["ratio"] == 0.9
    as_dict = "server_args={'model_path': 'm', 'tp_size': 4, 'disable_overlap_schedule': False, 'x': None}"
    assert sglang.parse_server_args_dump(as_dict) == {"model_path": "m", "tp_size": 4,
                                                     "disable_overlap_schedule": False, "x": None}
    assert sglang.parse_server_args_dump("no dump here") is None
    truncated = sglang.parse_server_args_dump("server_args=ServerArgs(model_path='m', tp_size=2, speculative_alg")
    assert truncated["tp_size"] == 2


def test_sample_log() -> None:
    """A recorded-shape 0.5.9 tp=2 EAGLE3 launch: bare warnings, dump, per-rank lines, readiness."""
    lines = [sglang.parse_line(raw) for raw in (DATA / "launch_0.5.9_tp2_eagle3.log").read_text().splitlines()]
    bare = [ln.message for ln in lines if ln.timestamp is None]
    res = sglang.resolve_worker("0.5.9", {"--speculative-algorithm": "EAGLE3", "--tp": 2,
                                          "--speculative-num-steps": 3, "--speculative-eagle-topk": 4,
                                          "--speculative-num-draft-tokens": 16}, {})
    assert bare == list(res.warnings)
    dump = next(sglang.parse_server_args_dump(ln.message) for ln in lines if "server_args=" in ln.message)
    assert dump["disable_overlap_schedule"] is res.disable_overlap_schedule is True
    ranks = [ln.ranks for ln in lines if ln.ranks]
    assert {tuple(r.items()) for r in ranks} == {tuple(r.items()) for r in sglang.expected_ranks("0.5.9", dump)}
    assert lines[-1].message == sglang.READY_LINE and lines[-1].ranks == {}
