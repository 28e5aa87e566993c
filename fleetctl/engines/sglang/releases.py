"""What fleetctl knows about each SGLang release: one data table, no logic.

Every fact here was read off the release's own wheel and is re-checked against it by
tests/test_sglang_rules.py and tests/test_sglang_logs.py. Supporting a new release means
adding one `Release(...)` row to `RELEASES` (reusing or adding a rules/log constant), its entry in
cli_options.json (the failing test prints it) and its version in tests/data/sglang/pypi_versions.txt;
the tests then fetch and check its wheel. routing.py and logs.py only read this table.

Paths are relative to the `sglang` package directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

SPEC_DIR = "srt/speculative"

# --- worker classes and the files that define them -------------------------------------------

EAGLE_V1 = ("EAGLEWorker", f"{SPEC_DIR}/eagle_worker.py")
EAGLE_V2 = ("EAGLEWorkerV2", f"{SPEC_DIR}/eagle_worker_v2.py")
MULTI_V1 = ("MultiLayerEagleWorker", f"{SPEC_DIR}/multi_layer_eagle_worker.py")
MULTI_V2 = ("MultiLayerEagleWorkerV2", f"{SPEC_DIR}/multi_layer_eagle_worker_v2.py")
STANDALONE_V1 = ("StandaloneWorker", f"{SPEC_DIR}/standalone_worker.py")
STANDALONE_V2 = ("StandaloneWorkerV2", f"{SPEC_DIR}/standalone_worker_v2.py")

# Worker families. A route maps a family to (class when overlap is on, class when it is off).
EAGLE = "eagle"  # EAGLE, EAGLE3 (and NEXTN, an alias of EAGLE)
MULTI_LAYER = "multi_layer"  # an EAGLE-family algorithm with enable_multi_layer_eagle
STANDALONE = "standalone"

# The SGLANG_ENABLE_SPEC_V2 env var (an EnvBool in srt/environ.py while it exists).
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"
ENV_TRUE = ("true", "1", "yes", "y")  # compared after str.lower(), no stripping
ENV_FALSE = ("false", "0", "no", "n")
ENV_INVALID_WARNING = 'Invalid value for {name}: "{value}" is not a valid boolean value, using default "{default}"'

# --- startup messages ----------------------------------------------------------------------

MAX_RUNNING_WARNING = (
    "Max running requests is reset to 48 for speculative decoding. "
    "You can override this by explicitly setting --max-running-requests."
)
DRAFT_TOKENS_WARNING = (
    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when speculative_eagle_topk == 1"
)
PP_WARNING = "Pipeline parallelism is incompatible with overlap schedule."
ADAPTIVE_DISABLED_WARNING = "speculative_adaptive disabled: {reason}. Falling back to static speculative params."
MULTI_LAYER_FORCES_ENV_WARNING = "Spec v2 is enabled for multi-layer EAGLE speculative decoding."
STEPS_ASSERTION = (
    "AssertionError: --speculative-eagle-topk / --speculative-num-draft-tokens were given without "
    "--speculative-num-steps (set all three or none)"
)
TOPK_UNSET_ERROR = (
    "TypeError: '>' not supported between instances of 'NoneType' and 'int' "
    "(--speculative-num-steps given without --speculative-eagle-topk)"
)


# --- how disable_overlap_schedule and the worker are derived, per era ------------------------

@dataclass(frozen=True)
class SpecRules:
    """One era of speculative routing. `policy` names the algorithm in routing.py:

    env_gates_v1   env on + algorithm in v2_algorithms -> overlap forced on; env off -> forced off;
                   otherwise the user's --disable-overlap-schedule stands, silently.
    env_forces_v2  env on + algorithm in v2_algorithms -> overlap forced on (even over the flag),
                   an explicit topk > 1 is a startup ValueError; otherwise forced off.
    v2_default     explicit topk > 1, or env off, turns overlap off (v1) with a reason; the user's
                   flag is respected.
    v2_only_env    v2 workers only; env off turns overlap off (synchronous v2).
    v2_only        v2 workers only; the env var is gone (setting it just warns).
    """

    name: str
    policy: str
    decider: str  # where the worker class is chosen (file::function)
    handler: str  # where disable_overlap_schedule is derived (file::function)
    spec_v2_default: bool | None  # None: env var removed
    v2_algorithms: tuple[str, ...]  # algorithms the env switch applies to
    routes: MappingProxyType  # family -> (class when overlap on, class when overlap off)
    messages: MappingProxyType  # message key -> exact text SGLang prints


def _frozen(d: dict[str, Any]) -> MappingProxyType:
    return MappingProxyType(dict(d))


_V1_ROUTES_OLD = _frozen({
    EAGLE: ("EAGLEWorkerV2", "EAGLEWorker"),
    STANDALONE: ("StandaloneWorker", "StandaloneWorker"),
})
_V1_ROUTES_057 = _frozen({**_V1_ROUTES_OLD, MULTI_LAYER: ("MultiLayerEagleWorkerV2", "MultiLayerEagleWorker")})
_V1_ROUTES = _frozen({
    EAGLE: ("EAGLEWorkerV2", "EAGLEWorker"),
    MULTI_LAYER: ("MultiLayerEagleWorkerV2", "MultiLayerEagleWorker"),
    STANDALONE: ("StandaloneWorkerV2", "StandaloneWorker"),
})
_V2_ONLY_ROUTES = _frozen({
    EAGLE: ("EAGLEWorkerV2", "EAGLEWorkerV2"),
    MULTI_LAYER: ("MultiLayerEagleWorkerV2", "MultiLayerEagleWorkerV2"),
    STANDALONE: ("StandaloneWorkerV2", "StandaloneWorkerV2"),
})

_SA = "srt/server_args.py::ServerArgs._handle_speculative_decoding"
_HOOK = "srt/arg_groups/speculative_hook.py::_handle_eagle_family"
_CREATE_OLD = "srt/speculative/spec_info.py::_create_eagle_worker"
_CREATE = "srt/speculative/spec_info.py::SpeculativeAlgorithm.create_worker"

RULES_BETA = SpecRules(  # 0.5.4.post3 - 0.5.6.post2
    name="beta-spec", policy="env_gates_v1", decider=_CREATE_OLD, handler=_SA,
    spec_v2_default=False, v2_algorithms=("EAGLE",), routes=_V1_ROUTES_OLD,
    messages=_frozen({
        "overlap_on": "Beta spec is enabled for eagle speculative decoding and overlap schedule is turned on.",
        "overlap_off": "Overlap scheduler is disabled because of using eagle3 or standalone speculative decoding.",
    }),
)
_FORCES_V2_MESSAGES = {
    "overlap_on": "Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is turned on.",
    # note the trailing space: SGLang prints it
    "overlap_off": "Overlap scheduler is disabled when spec v2 is off or using unsupported speculative "
    "algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental overlap scheduler. ",
    "topk_error": "Spec v2 currently only supports topk = 1 for speculative decoding.",
}
RULES_FORCES_V2_057 = SpecRules(  # 0.5.7: new messages, STANDALONE not in the v2 branch, v1 factory
    name="spec-v2-opt-in (0.5.7)", policy="env_forces_v2", decider=_CREATE_OLD, handler=_SA,
    spec_v2_default=False, v2_algorithms=("EAGLE", "EAGLE3"), routes=_V1_ROUTES_057,
    messages=_frozen(_FORCES_V2_MESSAGES),
)
RULES_FORCES_V2 = SpecRules(  # 0.5.8 - 0.5.10.post1
    name="spec-v2-opt-in", policy="env_forces_v2", decider=_CREATE, handler=_SA,
    spec_v2_default=False, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), routes=_V1_ROUTES,
    messages=_frozen(_FORCES_V2_MESSAGES),
)
RULES_V2_DEFAULT = SpecRules(  # 0.5.11 - 0.5.12.post1
    name="spec-v2-default", policy="v2_default", decider=_CREATE, handler=_SA,
    spec_v2_default=True, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), routes=_V1_ROUTES,
    messages=_frozen({
        "overlap_on": "Spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.",
        "overlap_off": "Spec v1 is used for eagle/eagle3/standalone speculative decoding because {reason}.",
        "reason_topk": "spec v2 currently only supports topk = 1",
        "reason_env": "SGLANG_ENABLE_SPEC_V2=False",
        "reason_flag": "overlap schedule is disabled",
    }),
)
_NON_OVERLAP_V2 = "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
RULES_V2_ONLY_ENV = SpecRules(  # 0.5.13, 0.5.13.post1: v1 workers deleted
    name="spec-v2-only (env still read)", policy="v2_only_env", decider=_CREATE, handler=_HOOK,
    spec_v2_default=True, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), routes=_V2_ONLY_ROUTES,
    messages=_frozen({
        "overlap_on": "Overlap spec v2 is enabled by default for eagle/eagle3/standalone speculative decoding.",
        "overlap_off": _NON_OVERLAP_V2,
    }),
)
RULES_V2_ONLY = SpecRules(  # 0.5.14: env var removed
    name="spec-v2-only", policy="v2_only", decider=_CREATE, handler=_HOOK,
    spec_v2_default=None, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), routes=_V2_ONLY_ROUTES,
    messages=_frozen({
        "overlap_off": _NON_OVERLAP_V2,
        "env_removed": "SGLANG_ENABLE_SPEC_V2 has been removed: speculative decoding always runs the V2 "
        "worker. Use --disable-overlap-schedule to select the non-overlap (synchronous) path.",
    }),
)
RULES_V2_ONLY_SILENT = SpecRules(  # 0.5.21+: the removal warning is gone, the env var is silently ignored
    name="spec-v2-only (env silently ignored)", policy="v2_only", decider=_CREATE, handler=_HOOK,
    spec_v2_default=None, v2_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), routes=_V2_ONLY_ROUTES,
    messages=_frozen({"overlap_off": _NON_OVERLAP_V2}),
)


# --- --speculative-adaptive ------------------------------------------------------------------

# reasons adaptive_unsupported_reason() gives, in the order it checks them
ADAPTIVE_REASONS = MappingProxyType({
    "algorithm": "speculative_algorithm={algorithm} (only EAGLE/EAGLE3 are supported)",
    "topk": "speculative_eagle_topk={topk} (only topk=1 is supported)",
    "dp_attention": "enable_dp_attention=True is not supported "
    "(adaptive tier decisions are not synchronized across DP ranks)",
    "overlap": "the overlap scheduler (spec v2) is enabled (adaptive is only implemented for EAGLEWorker v1)",
    "multi_layer": "enable_multi_layer_eagle=True is not supported ({worker} does not implement adaptive)",
})
_DP_ATTENTION_REASON_0522 = ("attention DP is not supported "
                             "(adaptive tier decisions are not synchronized across DP ranks)")


@dataclass(frozen=True)
class AdaptiveRules:
    stage: str  # "after_handler": checked once params are final; "before_handler": checked on raw flags
    requires_overlap_off: bool  # 0.5.11: adaptive only runs on EAGLEWorker v1
    multi_layer_class: str  # named in the "not supported" reason
    default_candidates: tuple[int, ...]  # union of the default config's candidate steps
    validates_initial_steps: bool  # --speculative-num-steps must be a candidate (default config)
    initializes_params: bool  # 0.5.14: topk 1, steps = middle candidate, draft tokens = steps + 1
    # what adaptive_unsupported_reason() says, in check order
    reasons: MappingProxyType = field(default_factory=lambda: ADAPTIVE_REASONS)


ADAPTIVE_0511 = AdaptiveRules("after_handler", True, "MultiLayerEagleWorker", (1, 3, 7), False, False)
ADAPTIVE_0512 = AdaptiveRules("after_handler", False, "MultiLayerEagleWorker", (1, 3, 7), False, False)
ADAPTIVE_0513 = AdaptiveRules("after_handler", False, "MultiLayerEagleWorkerV2", (1, 3, 7), True, False)
ADAPTIVE_0514 = AdaptiveRules("before_handler", False, "MultiLayerEagleWorkerV2", (0, 1, 3, 7), True, True)
ADAPTIVE_0520 = AdaptiveRules("before_handler", False, "MultiLayerEagleWorkerV2", (0, 1, 3, 5, 7), True, True)
ADAPTIVE_0522 = AdaptiveRules("before_handler", False, "MultiLayerEagleWorkerV2", (0, 1, 3, 5, 7), True, True,
                              _frozen({**ADAPTIVE_REASONS, "dp_attention": _DP_ATTENTION_REASON_0522}))


# --- auto-chosen (num_steps, topk, num_draft_tokens) when --speculative-num-steps is unset -----

@dataclass(frozen=True)
class AutoParams:
    default: tuple[int, int, int]  # for architectures not listed
    by_arch: MappingProxyType  # architecture -> params, only where they differ from `default`
    standalone: tuple[int, int, int] = (3, 1, 4)


_NOT_548_OLD = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
                "GptOssForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM")
AUTO_0543 = AutoParams((5, 4, 8), _frozen(dict.fromkeys(_NOT_548_OLD, (3, 1, 4))))
AUTO_0561 = AutoParams((5, 4, 8), _frozen(dict.fromkeys(
    (*_NOT_548_OLD, "Glm4MoeForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration"),
    (3, 1, 4))))
AUTO_057 = AutoParams((5, 4, 8), _frozen(dict.fromkeys(
    (*AUTO_0561.by_arch, "MiMoV2FlashForCausalLM"), (3, 1, 4))))
AUTO = AutoParams((3, 1, 4), _frozen(dict.fromkeys(
    ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"), (5, 4, 8))))


# --- CLI flags --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Flag:
    options: tuple[str, ...]  # every exact spelling argparse accepts; the first is canonical
    dest: str  # the ServerArgs field
    default: Any
    type: str = "str"  # "int" | "float" | "str" | "bool" (store_true) | "list" (nargs="+" ints)
    since: str = "0.5.4.post3"
    until: str | None = None  # last release that has it


def _f(options: str, dest: str, default: Any = None, type: str = "str", **kw: Any) -> Flag:
    return Flag(tuple(options.split()), dest, default, type, **kw)


FLAGS: tuple[Flag, ...] = (
    _f("--model-path --model", "model_path"),
    _f("--tp-size --tensor-parallel-size", "tp_size", 1, "int"),
    _f("--dp-size --data-parallel-size", "dp_size", 1, "int"),
    _f("--pp-size --pipeline-parallel-size", "pp_size", 1, "int"),
    _f("--ep-size --expert-parallel-size --ep", "ep_size", 1, "int"),
    _f("--attn-cp-size --attention-context-parallel-size", "attn_cp_size", 1, "int", since="0.5.9"),
    _f("--moe-dp-size --moe-data-parallel-size", "moe_dp_size", 1, "int", since="0.5.9"),
    _f("--enable-dp-attention", "enable_dp_attention", False, "bool"),
    # 0.5.22+: the attention-DP width; `--dp-size N --enable-dp-attention` is resolved into
    # attn_dp_size=N, dp_size=1 (dp_size counts replicas again), see routing._resolve_dp_layout
    _f("--attn-dp-size", "attn_dp_size", 1, "int", since="0.5.22"),
    _f("--max-running-requests", "max_running_requests", None, "int"),
    _f("--page-size", "page_size", None, "int"),
    _f("--device", "device"),
    _f("--disable-overlap-schedule", "disable_overlap_schedule", False, "bool"),
    _f("--enable-multi-layer-eagle", "enable_multi_layer_eagle", False, "bool", since="0.5.7"),
    _f("--speculative-algorithm", "speculative_algorithm"),
    _f("--speculative-draft-model-path --speculative-draft-model", "speculative_draft_model_path"),
    _f("--speculative-draft-model-revision", "speculative_draft_model_revision"),
    _f("--speculative-draft-load-format", "speculative_draft_load_format"),
    _f("--speculative-num-steps", "speculative_num_steps", None, "int"),
    _f("--speculative-eagle-topk", "speculative_eagle_topk", None, "int"),
    _f("--speculative-num-draft-tokens", "speculative_num_draft_tokens", None, "int"),
    _f("--speculative-accept-threshold-single", "speculative_accept_threshold_single", 1.0, "float"),
    _f("--speculative-accept-threshold-acc", "speculative_accept_threshold_acc", 1.0, "float"),
    _f("--speculative-token-map", "speculative_token_map"),
    _f("--speculative-attention-mode", "speculative_attention_mode", "prefill"),
    _f("--speculative-moe-runner-backend", "speculative_moe_runner_backend"),
    _f("--speculative-moe-a2a-backend", "speculative_moe_a2a_backend", since="0.5.6.post1"),
    _f("--speculative-draft-attention-backend", "speculative_draft_attention_backend", since="0.5.7"),
    _f("--speculative-draft-model-quantization", "speculative_draft_model_quantization", since="0.5.7"),
    _f("--speculative-ngram-min-match-window-size", "speculative_ngram_min_match_window_size", 1, "int",
       until="0.5.9"),
    _f("--speculative-ngram-max-match-window-size", "speculative_ngram_max_match_window_size", 12, "int",
       until="0.5.9"),
    _f("--speculative-ngram-branch-length", "speculative_ngram_branch_length", 18, "int", until="0.5.9"),
    _f("--speculative-ngram-min-bfs-breadth", "speculative_ngram_min_bfs_breadth", 1, "int"),
    _f("--speculative-ngram-max-bfs-breadth", "speculative_ngram_max_bfs_breadth", 10, "int"),
    _f("--speculative-ngram-match-type", "speculative_ngram_match_type", "BFS"),
    _f("--speculative-ngram-capacity", "speculative_ngram_capacity", 10_000_000, "int"),
    _f("--speculative-ngram-max-trie-depth", "speculative_ngram_max_trie_depth", 18, "int", since="0.5.10"),
    _f("--speculative-adaptive", "speculative_adaptive", False, "bool", since="0.5.11"),
    _f("--speculative-adaptive-config", "speculative_adaptive_config", since="0.5.11"),
    _f("--speculative-dflash-block-size", "speculative_dflash_block_size", None, "int", since="0.5.11"),
    _f("--speculative-dflash-draft-window-size", "speculative_dflash_draft_window_size", None, "int",
       since="0.5.11", until="0.5.11"),
    # 0.5.12 renames the field; the old spelling stays as an alias (deprecated from 0.5.13, gone in 0.5.20)
    _f("--speculative-draft-window-size --speculative-dflash-draft-window-size",
       "speculative_draft_window_size", None, "int", since="0.5.12", until="0.5.19"),
    _f("--speculative-draft-window-size", "speculative_draft_window_size", None, "int", since="0.5.20"),
    _f("--speculative-ngram-external-corpus-path", "speculative_ngram_external_corpus_path", since="0.5.11"),
    _f("--speculative-ngram-external-sam-budget", "speculative_ngram_external_sam_budget", 0, "int",
       since="0.5.11"),
    _f("--speculative-ngram-external-corpus-max-tokens", "speculative_ngram_external_corpus_max_tokens",
       10_000_000, "int", since="0.5.11"),
    _f("--speculative-skip-dp-mlp-sync", "speculative_skip_dp_mlp_sync", False, "bool", since="0.5.11",
       until="0.5.22"),
    _f("--speculative-use-rejection-sampling", "speculative_use_rejection_sampling", False, "bool",
       since="0.5.14"),
    _f("--speculative-dspark-block-size", "speculative_dspark_block_size", None, "int", since="0.5.16"),
    _f("--speculative-dspark-sps-table-path", "speculative_dspark_sps_table_path", since="0.5.16"),
    _f("--speculative-dspark-confidence-sts-path", "speculative_dspark_confidence_sts_path", since="0.5.16"),
    _f("--speculative-dspark-align-verify-tokens-to-graph-tier",
       "speculative_dspark_align_verify_tokens_to_graph_tier", False, "bool", since="0.5.16"),
    _f("--speculative-draft-kv-cache-dtype", "speculative_draft_kv_cache_dtype", since="0.5.18"),
    _f("--speculative-dsa-topk-backend", "speculative_dsa_topk_backend", "sgl-kernel", since="0.5.19"),
    _f("--speculative-domino-candidate-pool-size", "speculative_domino_candidate_pool_size", 2048, "int",
       since="0.5.20"),
    _f("--speculative-draft-sink-size", "speculative_draft_sink_size", since="0.5.21"),
    _f("--speculative-enable-w4a4-mxfp4-megamoe", "speculative_enable_w4a4_mxfp4_megamoe", False, "bool",
       since="0.5.22"),
    _f("--speculative-use-block-verification", "speculative_use_block_verification", False, "bool",
       since="0.5.22"),
    # CUDA graph batch sizes: split into decode/prefill in 0.5.14, where the old spellings stay as
    # aliases of the decode ones; removed in 0.5.20, where argparse then finds them ambiguous prefixes
    _f("--cuda-graph-max-bs", "cuda_graph_max_bs", None, "int", until="0.5.13.post1"),
    _f("--cuda-graph-bs", "cuda_graph_bs", None, "list", until="0.5.13.post1"),
    _f("--cuda-graph-max-bs-decode --cuda-graph-max-bs", "cuda_graph_max_bs_decode", None, "int",
       since="0.5.14", until="0.5.19"),
    _f("--cuda-graph-bs-decode --cuda-graph-bs", "cuda_graph_bs_decode", None, "list", since="0.5.14",
       until="0.5.19"),
    _f("--cuda-graph-max-bs-decode", "cuda_graph_max_bs_decode", None, "int", since="0.5.20"),
    _f("--cuda-graph-bs-decode", "cuda_graph_bs_decode", None, "list", since="0.5.20"),
    _f("--cuda-graph-max-bs-prefill", "cuda_graph_max_bs_prefill", None, "int", since="0.5.14"),
    _f("--cuda-graph-bs-prefill", "cuda_graph_bs_prefill", None, "list", since="0.5.14"),
)

# argparse prefix abbreviations (allow_abbrev is on): a unique prefix maps to its option, a prefix
# shared by several options is rejected as ambiguous. Values: option, or the tuple it is ambiguous
# between. Checked per release against the full option list of the real parser.
_ABBREV_BASE = {
    "--tp": "--tp-size",
    "--dp": "--dp-size",
    "--speculative-algo": "--speculative-algorithm",
}
ABBREV_0543 = _frozen({**_ABBREV_BASE, "--pp": ("--pp-size", "--pp-max-micro-batch-size")})
ABBREV_057 = _frozen({**_ABBREV_BASE,
                      "--pp": ("--pp-size", "--pp-max-micro-batch-size", "--pp-async-batch-depth")})
# 0.5.20 drops --cuda-graph-max-bs / --cuda-graph-bs (the docs' EAGLE-3 example uses the first): each is
# now a prefix of its -decode and -prefill options, so argparse refuses it as ambiguous
ABBREV_0520 = _frozen({**ABBREV_057,
                       "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"),
                       "--cuda-graph-bs": ("--cuda-graph-bs-decode", "--cuda-graph-bs-prefill")})

_TP = next(f for f in FLAGS if f.dest == "tp_size")
TP_FLAG = _TP.options[0]
# every spelling of the tensor-parallel size a launch may use: its options and argparse's abbreviations
TP_SPELLINGS = frozenset(_TP.options) | frozenset(
    k for table in (ABBREV_0543, ABBREV_057) for k, v in table.items() if v == TP_FLAG)

ALGORITHMS_OLD = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
ALGORITHMS_0511 = ("DFLASH", *ALGORITHMS_OLD)
# from 0.5.12 argparse has no choices: the name is upper-cased and looked up in the enum
ALGORITHMS_0512 = ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NEXTN")
ALGORITHMS_0516 = ("DSPARK", *ALGORITHMS_0512)
ALGORITHMS_0520 = ("UNO", *ALGORITHMS_0516)


# --- log format -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogRules:
    prefix_order: tuple[str, ...]  # scheduler rank components, in the order they are printed
    ms_supported: bool  # SGLANG_LOG_MS adds .mmm to the timestamp
    prelog_timestamped: bool  # ServerArgs warnings get "[date time] " (else they print bare)
    dump_form: str  # "repr": server_args=ServerArgs(...); "dict": server_args={...}
    dump_fields: tuple[str, ...]  # ServerArgs field order of the fields fleetctl emits


_DUMP_OLD = ("model_path", "max_running_requests", "tp_size", "pp_size", "dp_size",
             "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
             "speculative_eagle_topk", "speculative_num_draft_tokens", "ep_size",
             "disable_overlap_schedule", "enable_dp_attention")
_SPEC = _DUMP_OLD[5:10]
_DUMP_057 = (*_DUMP_OLD[:10], "enable_multi_layer_eagle", *_DUMP_OLD[10:])
_DUMP_059 = (*_DUMP_OLD[:5], "attn_cp_size", "moe_dp_size", *_DUMP_057[5:])
_DUMP_0511 = (*_DUMP_059[:12], "speculative_adaptive", *_DUMP_059[12:])
_DUMP_0513 = (*_DUMP_059[:13], "speculative_adaptive", *_DUMP_059[13:])
_DUMP_0514 = ("model_path", "max_running_requests", "disable_overlap_schedule", "tp_size", "pp_size",
              "dp_size", "attn_cp_size", "moe_dp_size", "enable_dp_attention", *_SPEC,
              "enable_multi_layer_eagle", "speculative_adaptive", "ep_size")

LOG_0543 = LogRules(("DP", "TP", "EP", "PP"), False, False, "repr", _DUMP_OLD)
LOG_0551 = LogRules(("DP", "PP", "TP", "EP"), False, False, "repr", _DUMP_OLD)
LOG_056 = LogRules(("DP", "PP", "TP", "EP"), True, False, "repr", _DUMP_OLD)
LOG_057 = LogRules(("DP", "PP", "TP", "EP"), True, False, "repr", _DUMP_057)
LOG_059 = LogRules(("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP"), True, False, "repr", _DUMP_059)
LOG_0511 = LogRules(LOG_059.prefix_order, True, True, "repr", _DUMP_0511)
LOG_0513 = LogRules(LOG_059.prefix_order, True, True, "repr", _DUMP_0513)
LOG_0514 = LogRules(LOG_059.prefix_order, True, True, "repr", _DUMP_0514)
LOG_0519 = LogRules(LOG_059.prefix_order, True, True, "dict", _DUMP_0514)
# 0.5.22: the attention-DP width is its own field (dp_size counts replicas): the DP ranks in the log
# prefixes follow from it, so the dump must carry it
_DUMP_0522 = (*_DUMP_0514[:6], "attn_dp_size", *_DUMP_0514[6:])
LOG_0522 = LogRules(LOG_059.prefix_order, True, True, "dict", _DUMP_0522)

READY_LINE = "The server is fired up and ready to roll!"
# Every startup dump line starts with this (ServerArgs repr through 0.5.18, a dict from 0.5.19).
DUMP_ANCHOR = "server_args="
# launch_server's HTTP port flag (all releases), which fleetctl sets per server instance.
PORT_FLAG = "--port"


# --- pipeline parallelism with speculative decoding (check_server_args) ------------------------

PP_SPEC_ENV = "SGLANG_ENABLE_PP_SPEC"  # 0.5.21+: an EnvBool, default off
PP_SPEC_ERROR_OLD = ("AssertionError: Pipeline parallelism is not compatible with overlap schedule, "
                     "speculative decoding, mixed chunked prefill.")
PP_SPEC_ERROR = "AssertionError: Pipeline parallelism is not compatible with overlap schedule, speculative decoding"
PP_SPEC_ONLY_EAGLE = ("AssertionError: Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
                      "speculative decoding")
PP_SPEC_ENV_ADAPTIVE = "AssertionError: SGLANG_ENABLE_PP_SPEC is not compatible with --speculative-adaptive"
PP_SPEC_ENV_DP = "AssertionError: SGLANG_ENABLE_PP_SPEC is not compatible with attention DP (--attn-dp-size)"
PP_SPEC_ENV_DP_0521 = "AssertionError: SGLANG_ENABLE_PP_SPEC is not compatible with --enable-dp-attention"
PP_SPEC_PREFILL_ONLY = ("AssertionError: PP + speculative decoding (MTP) is only supported on prefill nodes "
                        "(disaggregation-mode=prefill)")


# --- model-specific overrides that touch speculative decoding (0.5.17+) ----------------------

# The checks a ModelOverride can refuse on, evaluated by routing._override_refusal on the launch's
# flags as the override sees them (before the speculative handler; the algorithm string raw).
@dataclass(frozen=True)
class ModelOverride:
    """A registered per-architecture override of ServerArgs that touches the speculative worker.

    `refuses`: (check, SGLang's own error) in the order the override tests them; the server does not
    start. `exact`: the refusals are the override's whole effect on the worker (its forced fields are
    attention backends only); otherwise what it does depends on things fleetctl does not know (GPU
    generation, the checkpoint's quantization, installed kernels) and explain says "not certain".
    """

    name: str
    archs: tuple[str, ...]  # exact architectures it is registered for (`_register_for`)
    where: str  # file::function in the wheel
    since: str
    until: str | None = None
    refuses: tuple[tuple[str, str], ...] = ()
    exact: bool = True
    forces: str = ""  # what it sets, in words (none of it changes the worker class)
    not_modelled: str = ""  # why an answer for this architecture is not certain (exact=False)
    arch_since: MappingProxyType = field(default_factory=lambda: _frozen({}))  # archs registered later
    # "override": a registered model-override pass, run before the speculative handler (sees the raw
    # algorithm); "handler": an architecture branch inside the EAGLE-family speculative handler
    stage: str = "override"

    def archs_in(self, version: str) -> tuple[str, ...]:
        """The architectures this override is registered for in `version` (none outside its range)."""
        order = KNOWN_VERSIONS.index(version)
        if order < KNOWN_VERSIONS.index(self.since) or (
                self.until is not None and order > KNOWN_VERSIONS.index(self.until)):
            return ()
        return tuple(a for a in self.archs if KNOWN_VERSIONS.index(self.arch_since.get(a, self.since)) <= order)

    def applies(self, version: str, arch: str | None) -> bool:
        return arch is not None and arch in self.archs_in(version)


_OVR = "srt/arg_groups/model_overrides"
IQUEST_Q1_REFUSALS = (
    ("attention_backend_not_fa3", "ValueError: IQuestQ1 applies its attention sink from the softmax LSE and "
                                  "requires FA3 attention for both prefill and decode."),
    ("algorithm_not_eagle_nextn", "ValueError: IQuest Q1 MTP requires serial EAGLE or NEXTN drafting."),
    ("draft_backend_not_fa3", "ValueError: IQuestQ1 requires FA3 attention for the MTP draft."),
    ("context_parallel", "ValueError: IQuestQ1 does not support context parallelism."),
    ("topk_gt_1", "ValueError: IQuestQ1 speculative decoding requires --speculative-eagle-topk 1."),
    ("multi_layer", "ValueError: IQuest Q1 MTP drafting does not support multi-layer EAGLE."),
    ("dp_attention", "ValueError: IQuest Q1 does not support DP attention."),
    ("pp", "ValueError: IQuest Q1 does not support pipeline parallelism."),
)
MODEL_OVERRIDES: tuple[ModelOverride, ...] = (
    ModelOverride("IQuestQ1", ("IQuestQ1ForCausalLM", "IQuestQ1MTP"), f"{_OVR}/iquest_q1.py::_iquest_q1_overrides",
                  "0.5.21", refuses=IQUEST_Q1_REFUSALS, forces="attention backends unset -> fa3"),
    ModelOverride("IQuestQ1 MTP draft", ("IQuestQ1ForCausalLM",),
                  "srt/arg_groups/speculative_hook.py::_handle_iquest_q1_mtp_draft", "0.5.21", stage="handler",
                  refuses=(("draft_path_not_independent",
                            "ValueError: IQuest Q1 requires an independent draft model path."),),
                  exact=False, forces="num_steps from the draft's num_draft_slots when unset; topk 1; "
                  "draft tokens = steps + 1",
                  not_modelled="the draft checkpoint's own config.json decides the rest (it must be an "
                  "IQuestQ1MTPConfig matching the target's sizes; its num_draft_slots sets num_steps), and "
                  "fleetctl reads only the target's config"),
    ModelOverride("KimiK3", ("KimiK3ForConditionalGeneration",), "_kimi_k3_overrides (srt/arg_groups/overrides.py, "
                  f"{_OVR}/kimi_k3.py from 0.5.19)", "0.5.17", exact=False,
                  forces="speculative_attention_mode=decode for DSPARK (under DCP, or on SM100/SM103)",
                  not_modelled="its DSPARK/DCP handling depends on the GPU generation, installed FlashInfer "
                  "and SGLANG_RAGGED_VERIFY_MODE"),
    ModelOverride("MiniMaxM3", ("MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration"),
                  f"{_OVR}/minimax_m3.py::_minimax_m3_overrides", "0.5.23", exact=False,
                  forces="speculative draft KV dtype / draft attention backend for DSPARK, DFLASH",
                  not_modelled="an NVFP4 checkpoint (its quantization_config) refuses every algorithm but "
                  "DSPARK/DFLASH ('M3.1 NVFP4 only supports DSPARK or DFLASH speculation'), and fleetctl "
                  "does not read the checkpoint's quantization"),
    ModelOverride("Nemotron-H", ("NemotronHForCausalLM", "NemotronHPuzzleForCausalLM", "NemotronH_Omni_Reasoning_V3"),
                  f"{_OVR}/nemotron_h.py::_nemotron_h_overrides", "0.5.19", exact=False,
                  arch_since=_frozen({"NemotronH_Omni_Reasoning_V3": "0.5.20"}),
                  forces="attention_backend and speculative_draft_attention_backend (trtllm_mha, or triton/"
                  "flashinfer when topk > 1) on Blackwell",
                  not_modelled="it sets the target and draft attention backends by GPU generation (Blackwell), "
                  "which fleetctl's table does not know"),
)


# --- the releases -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Release:
    version: str
    rules: SpecRules
    workers: tuple[tuple[str, str], ...]  # EAGLE-family (class, file) present in the wheel
    log: LogRules
    auto: AutoParams
    algorithms: tuple[str, ...]
    algorithm_choices: bool  # argparse restricts --speculative-algorithm to `algorithms` (case-sensitive)
    abbreviations: MappingProxyType
    adaptive: AdaptiveRules | None = None
    multi_layer_algorithms: tuple[str, ...] = ("EAGLE", "EAGLE3")  # which go to the multi-layer route
    # target architectures whose model override turns on multi-layer EAGLE for `--speculative-algorithm
    # EAGLE` (exact, pre-normalisation string); and whether that override also forces the env var on
    multi_layer_archs: tuple[str, ...] = ()
    # of those, the ones tested as a substring (`"X" in model_arch`, or a predicate-registered pass), so
    # any architecture containing the name matches too; the others are compared exactly
    multi_layer_arch_substrings: tuple[str, ...] = ()
    multi_layer_arch_forces_env: bool = False
    # pp_size > 1 with any speculative algorithm: check_server_args refuses it with this error, or
    # None: 0.5.21+ allow EAGLE (not multi-layer) under SGLANG_ENABLE_PP_SPEC (PP_SPEC_* errors otherwise)
    pp_spec_error: str | None = PP_SPEC_ERROR
    pp_spec_dp_error: str = PP_SPEC_ENV_DP  # (0.5.21+) SGLANG_ENABLE_PP_SPEC with DP attention
    # the non-overlap multi-layer worker's module fails at import (on CPython <= 3.13) with this error
    multi_layer_v1_import_error: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def worker_files(self) -> dict[str, str]:
        return dict(self.workers)

    def forces_multi_layer(self, arch: str | None) -> bool:
        """Does this release's model override turn on multi-layer EAGLE for the target `arch`?"""
        if arch is None:
            return False
        return arch in self.multi_layer_archs or any(s in arch for s in self.multi_layer_arch_substrings)


_W_OLD = (EAGLE_V1, EAGLE_V2, STANDALONE_V1)
_W_057 = (EAGLE_V1, EAGLE_V2, MULTI_V1, MULTI_V2, STANDALONE_V1)
_W_058 = (EAGLE_V1, EAGLE_V2, MULTI_V1, MULTI_V2, STANDALONE_V1, STANDALONE_V2)
_W_V2 = (EAGLE_V2, MULTI_V2, STANDALONE_V2)
_MIMO = ("MiMoV2FlashForCausalLM",)
_MIMO_STEP = ("MiMoV2FlashForCausalLM", "Step3p5ForCausalLM")
_MIMO2_STEP = ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM")
_MIMO2_STEP37 = (*_MIMO2_STEP, "Step3p7ForConditionalGeneration")
_MIMO2_STEP37_GIGA = (*_MIMO2_STEP37, "GigaChat35ForCausalLM", "GigaChat35ForCausalLMNextN")


def _beta(v: str, log: LogRules, auto: AutoParams = AUTO_0543) -> Release:
    return Release(v, RULES_BETA, _W_OLD, log, auto, ALGORITHMS_OLD, True, ABBREV_0543,
                   pp_spec_error=PP_SPEC_ERROR_OLD)


# 0.5.9 - 0.5.12.post1: MultiLayerEagleWorker.mtp_model_runner is annotated `-> ModelRunner`, a name imported
# only under TYPE_CHECKING, and the module has no `from __future__ import annotations`
MULTI_V1_NAME_ERROR = "NameError: name 'ModelRunner' is not defined"


def _opt_in(v: str, auto: AutoParams = AUTO, log: LogRules = LOG_059,
            archs: tuple[str, ...] = _MIMO_STEP) -> Release:
    return Release(v, RULES_FORCES_V2, _W_058, log, auto, ALGORITHMS_OLD, True, ABBREV_057,
                   multi_layer_archs=archs, multi_layer_arch_substrings=archs, multi_layer_arch_forces_env=True,
                   pp_spec_error=PP_SPEC_ERROR_OLD,
                   multi_layer_v1_import_error=None if v.startswith("0.5.8") else MULTI_V1_NAME_ERROR)


def _v2(v: str, rules: SpecRules, workers: tuple, log: LogRules, adaptive: AdaptiveRules,
        archs: tuple[str, ...], algorithms: tuple[str, ...] = ALGORITHMS_0512, choices: bool = False,
        abbreviations: MappingProxyType = ABBREV_057) -> Release:
    # the Step models are tested as substrings of the architecture (`"Step3p5ForCausalLM" in arch`: a
    # ServerArgs branch through 0.5.14, a predicate-registered pass from 0.5.15); MiMo etc. exactly
    substrings = tuple(a for a in archs if a.startswith("Step"))
    return Release(v, rules, workers, log, AUTO, algorithms, choices, abbreviations,
                   adaptive=adaptive, multi_layer_archs=archs, multi_layer_arch_substrings=substrings,
                   multi_layer_v1_import_error=MULTI_V1_NAME_ERROR if MULTI_V1 in workers else None)


def _v2_new(v: str, rules: SpecRules, log: LogRules, adaptive: AdaptiveRules, algorithms: tuple[str, ...],
            abbreviations: MappingProxyType = ABBREV_057, archs: tuple[str, ...] = _MIMO2_STEP37) -> Release:
    rel = _v2(v, rules, _W_V2, log, adaptive, archs, algorithms, abbreviations=abbreviations)
    if rules is RULES_V2_ONLY_SILENT:  # 0.5.21+: PP + EAGLE allowed under SGLANG_ENABLE_PP_SPEC
        rel = replace(rel, pp_spec_error=None)
    return rel


RELEASES: dict[str, Release] = {r.version: r for r in (
    _beta("0.5.4.post3", LOG_0543),
    _beta("0.5.5", LOG_0543),
    _beta("0.5.5.post1", LOG_0551),
    _beta("0.5.5.post2", LOG_0551),
    _beta("0.5.5.post3", LOG_0551),
    _beta("0.5.6", LOG_056),
    _beta("0.5.6.post1", LOG_056, AUTO_0561),
    _beta("0.5.6.post2", LOG_056, AUTO_0561),
    Release("0.5.7", RULES_FORCES_V2_057, _W_057, LOG_057, AUTO_057, ALGORITHMS_OLD, True, ABBREV_057,
            multi_layer_algorithms=("EAGLE", "EAGLE3", "STANDALONE"), multi_layer_archs=_MIMO,
            multi_layer_arch_substrings=_MIMO,
            multi_layer_arch_forces_env=True, pp_spec_error=PP_SPEC_ERROR_OLD,
            notes=("multi-layer workers are chosen in the scheduler, before the algorithm's factory",)),
    _opt_in("0.5.8", log=LOG_057, archs=_MIMO),
    _opt_in("0.5.8.post1", log=LOG_057, archs=_MIMO),
    _opt_in("0.5.9"),
    _opt_in("0.5.10"),
    _opt_in("0.5.10.post1"),
    _v2("0.5.11", RULES_V2_DEFAULT, _W_058, LOG_0511, ADAPTIVE_0511, _MIMO2_STEP, ALGORITHMS_0511, True),
    _v2("0.5.12", RULES_V2_DEFAULT, _W_058, LOG_0511, ADAPTIVE_0512, _MIMO2_STEP),
    _v2("0.5.12.post1", RULES_V2_DEFAULT, _W_058, LOG_0511, ADAPTIVE_0512, _MIMO2_STEP),
    _v2("0.5.13", RULES_V2_ONLY_ENV, _W_V2, LOG_0513, ADAPTIVE_0513, _MIMO2_STEP37),
    _v2("0.5.13.post1", RULES_V2_ONLY_ENV, _W_V2, LOG_0513, ADAPTIVE_0513, _MIMO2_STEP37),
    _v2("0.5.14", RULES_V2_ONLY, _W_V2, LOG_0514, ADAPTIVE_0514, _MIMO2_STEP37),
    _v2_new("0.5.15", RULES_V2_ONLY, LOG_0514, ADAPTIVE_0514, ALGORITHMS_0512),
    _v2_new("0.5.15.post1", RULES_V2_ONLY, LOG_0514, ADAPTIVE_0514, ALGORITHMS_0512),
    _v2_new("0.5.16", RULES_V2_ONLY, LOG_0514, ADAPTIVE_0514, ALGORITHMS_0516),
    _v2_new("0.5.17", RULES_V2_ONLY, LOG_0514, ADAPTIVE_0514, ALGORITHMS_0516),
    _v2_new("0.5.18", RULES_V2_ONLY, LOG_0514, ADAPTIVE_0514, ALGORITHMS_0516),
    _v2_new("0.5.19", RULES_V2_ONLY, LOG_0519, ADAPTIVE_0514, ALGORITHMS_0516),
    _v2_new("0.5.20", RULES_V2_ONLY, LOG_0519, ADAPTIVE_0520, ALGORITHMS_0520, ABBREV_0520),
    replace(_v2_new("0.5.21", RULES_V2_ONLY_SILENT, LOG_0519, ADAPTIVE_0520, ALGORITHMS_0520, ABBREV_0520,
                    _MIMO2_STEP37_GIGA), pp_spec_dp_error=PP_SPEC_ENV_DP_0521),
    _v2_new("0.5.22", RULES_V2_ONLY_SILENT, LOG_0522, ADAPTIVE_0522, ALGORITHMS_0520, ABBREV_0520, _MIMO2_STEP37_GIGA),
    _v2_new("0.5.23", RULES_V2_ONLY_SILENT, LOG_0522, ADAPTIVE_0522, ALGORITHMS_0520, ABBREV_0520, _MIMO2_STEP37_GIGA),
)}

KNOWN_VERSIONS: tuple[str, ...] = tuple(RELEASES)
PACKAGE = "sglang"  # the import name and the wheel distribution
DISPLAY_NAME = "SGLang"


_CLI_OPTIONS = Path(__file__).with_name("cli_options.json")


@cache
def cli_options(version: str) -> frozenset[str]:
    """Every option string `version`'s own argument parser registers (`--help` and `--no-X` included).

    Stored in cli_options.json as the options each release adds and removes relative to the previous
    release; tests/test_sglang_rules.py holds each entry to the release's own parser.
    """
    data = json.loads(_CLI_OPTIONS.read_text(encoding="utf-8"))
    options: set[str] = set()
    for v in KNOWN_VERSIONS:
        entry = data.get(v, {})
        options = (options | set(entry.get("added", ()))) - set(entry.get("removed", ()))
        if v == version:
            return frozenset(options)
    raise KeyError(f"unknown SGLang version {version!r}")


def flags_for(version: str) -> tuple[Flag, ...]:
    """The flags of FLAGS that release `version` accepts."""
    order = KNOWN_VERSIONS.index(version)
    return tuple(
        f for f in FLAGS
        if KNOWN_VERSIONS.index(f.since) <= order
        and (f.until is None or order <= KNOWN_VERSIONS.index(f.until))
    )


def model_overrides(version: str, arch: str | None = None) -> tuple[ModelOverride, ...]:
    """The speculative-relevant model overrides of `version` (for `arch`, or for any architecture)."""
    return tuple(o for o in MODEL_OVERRIDES if (o.applies(version, arch) if arch is not None else o.archs_in(version)))


ADAPTIVE_STEPS_ERROR = (
    "ValueError: --speculative-num-steps={steps} is not in the adaptive config candidate_steps {candidates}. "
    "Pass one of those values."
)
STANDALONE_DP_ERROR = "ValueError: Currently standalone speculative decoding does not support dp attention."
