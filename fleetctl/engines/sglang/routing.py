"""Which speculative worker a launch runs, and why: the table in releases.py applied to flags + env.

The steps mirror the order SGLang's ServerArgs post-init runs them in: model overrides, pipeline
parallelism, then the speculative handler (env var, max-running-requests, the overlap decision,
auto-chosen params, adaptive), and finally the worker factory that reads disable_overlap_schedule.

Assumed, not modelled: a CUDA device, and a target whose model-specific handlers leave the overlap
schedule alone (a few Mamba/embedding/NPU paths also flip it); the page-size/attention-backend checks.
Without the target's `architectures` (model_arch=None), an answer a model override could change is
marked `certain=False` and its reason starts with NOT_CERTAIN.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fleetctl.engines.base import Resolution
from fleetctl.engines.sglang import adaptive
from fleetctl.engines.sglang import releases as R

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")


def is_known(version: str) -> bool:
    return version in R.RELEASES


def worker_files(version: str) -> dict[str, str]:
    """EAGLE-family worker class -> file (relative to the package dir) present in `version`."""
    return _release(version).worker_files


def eagle_worker_classes(version: str) -> tuple[str, ...]:
    """Worker classes that run EAGLE/EAGLE3 in `version` (whichever way the overlap decision goes)."""
    routes = _release(version).rules.routes
    return tuple(dict.fromkeys(c for fam in (R.EAGLE, R.MULTI_LAYER) for c in routes.get(fam, ())))


def _release(version: str) -> R.Release:
    try:
        return R.RELEASES[version]
    except KeyError:
        raise KeyError(f"unknown SGLang version {version!r}; known: {', '.join(R.KNOWN_VERSIONS)}") from None


# --- flags ------------------------------------------------------------------------------------

class LaunchError(Exception):
    """The real launcher would exit with this message."""


def _norm(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


_ALL_OPTIONS: frozenset[str] = frozenset(_norm(o) for f in R.FLAGS for o in f.options)


def _convert(flag: R.Flag, option: str, value: Any) -> Any:
    if flag.type == "bool":
        if isinstance(value, str):
            return value.strip().lower() in R.ENV_TRUE
        return bool(value)
    if flag.type == "list":
        return [_convert(R.Flag(flag.options, flag.dest, None, "int"), option, v)
                for v in (value if isinstance(value, list | tuple) else str(value).split())]
    if flag.type in ("int", "float"):
        cast = int if flag.type == "int" else float
        if isinstance(value, bool) or (flag.type == "int" and isinstance(value, float)):
            raise LaunchError(f"argument {option}: invalid {flag.type} value: {value!r}")
        try:
            return cast(value)
        except (TypeError, ValueError):
            raise LaunchError(f"argument {option}: invalid {flag.type} value: {value!r}") from None
    return value if value is None else str(value)


def parse_flags(version: str, flags: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Launch flags -> ({ServerArgs field: value} with this release's defaults, unknown flags).

    Accepts '--x-y', 'x-y' and 'x_y' spellings, every alias, and the argparse abbreviations in the
    table. Raises LaunchError where argparse would reject the command line.
    """
    rel = _release(version)
    accepted = R.flags_for(version)
    args: dict[str, Any] = {f.dest: f.default for f in accepted}
    unknown: list[str] = []
    abbrev = {_norm(k): v for k, v in rel.abbreviations.items()}
    options = {_norm(o): f for f in accepted for o in f.options}
    for name, value in flags.items():
        key = _norm(name)
        option = "--" + key.replace("_", "-")
        if key in abbrev and key not in options:
            target = abbrev[key]
            if isinstance(target, tuple):
                raise LaunchError(f"ambiguous option: {option} could match {', '.join(target)}")
            key, option = _norm(target), target
        flag = options.get(key)
        if flag is None and key in _ALL_OPTIONS:  # an upstream flag of other releases, not this one
            raise LaunchError(f"unrecognized arguments: {option}")
        if flag is None:
            # not a flag fleetctl tracks: the release's own option list says whether argparse takes it
            # (exactly, or as the unique prefix of one option), finds it ambiguous, or does not know it
            # (e.g. a flag a patch adds: passed through, the host's server_args.py decides)
            registered = R.cli_options(version)
            if option not in registered:
                matches = sorted(o for o in registered if o.startswith(option))
                if len(matches) > 1:
                    raise LaunchError(f"ambiguous option: {option} could match {', '.join(matches)}")
                if len(matches) == 1 and _norm(matches[0]) in options:  # a tracked flag, abbreviated
                    key, option, flag = _norm(matches[0]), matches[0], options[_norm(matches[0])]
                elif not matches:
                    unknown.append(option)
            if flag is None:
                if value is not None and value is not False:
                    args[key] = value
                continue
        if value is None:
            continue
        args[flag.dest] = _convert(flag, option, value)
    return args, tuple(unknown)


# --- the env var ------------------------------------------------------------------------------

@dataclass
class _Env:
    rules: R.SpecRules
    raw: str | None
    warnings: list[str]
    forced: bool = False  # a model override set it to True
    _read: bool = False

    def get(self) -> bool:
        """What `envs.SGLANG_ENABLE_SPEC_V2.get()` returns; warns once on an invalid value."""
        default = bool(self.rules.spec_v2_default)
        if self.forced:
            return True
        if self.raw is None:
            return default
        low = self.raw.lower()
        if low in R.ENV_TRUE:
            return True
        if low in R.ENV_FALSE:
            return False
        if not self._read:
            self.warnings.append(R.ENV_INVALID_WARNING.format(name=R.SPEC_V2_ENV, value=low, default=default))
        self._read = True
        return default

    def describe(self) -> str:
        if self.raw is None:
            return "unset"
        if self.rules.spec_v2_default is None:
            return f"set to {self.raw!r} (ignored: removed in this release)"
        low = self.raw.lower()
        if low in R.ENV_TRUE:
            return f"set to {self.raw!r} (on)"
        if low in R.ENV_FALSE:
            return f"set to {self.raw!r} (off)"
        return f"set to {self.raw!r} (invalid -> default {'on' if self.rules.spec_v2_default else 'off'})"


# --- resolution -------------------------------------------------------------------------------

def _unknown(version: str) -> Resolution:
    return Resolution(
        version=version, known=False, algorithm=None, worker_class=None, worker_file=None,
        disable_overlap_schedule=None, spec_v2_env="unknown",
        reason=f"unknown version {version}: fleetctl knows SGLang {R.KNOWN_VERSIONS[0]} .. "
        f"{R.KNOWN_VERSIONS[-1]} only and will not guess",
        startup_error=None, warnings=(), adaptive_available=False,
    )


@dataclass
class _State:
    rel: R.Release
    args: dict[str, Any]
    env: _Env
    warnings: list[str]
    causes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # files the launch's flags name, as read on the host (path as the flag gives it -> bytes, or why
    # not read); None: not asked (offline: a config file's content stays unknown)
    files: Mapping[str, bytes | str] | None = None


def resolve_worker(version: str, flags: dict[str, Any], env: dict[str, str], *,
                   model_arch: str | None = None, files: Mapping[str, bytes | str] | None = None) -> Resolution:
    """Which worker class/file `version` runs for these launch flags and this launch environment.

    `env` is exactly the environment the launch passes (not os.environ). `model_arch` is the target's
    `architectures[0]` from its config.json; without it, auto-chosen speculative params stay None.
    `files`: the files the flags name as read on the host (an adaptive config: judged as this
    release's own loader reads it at start-up).
    """
    if not is_known(version):
        return _unknown(version)
    rel = R.RELEASES[version]
    warnings: list[str] = []
    st = _State(rel, {}, _Env(rel.rules, env.get(R.SPEC_V2_ENV), warnings), warnings, files=files)
    adaptive_available = "speculative_adaptive" in {f.dest for f in R.flags_for(version)}
    algorithm: str | None = None
    raw_algorithm: Any = None
    unknown: tuple[str, ...] = ()
    try:
        st.args, unknown = parse_flags(version, flags)
        _resolve_dp_layout(st.args)
        raw_algorithm = st.args.get("speculative_algorithm")
        algorithm = _normalize_algorithm(rel, st.args.get("speculative_algorithm"))
        error = None
        _run(st, algorithm, model_arch)
        _check_pp_spec(st, algorithm, env)
    except LaunchError as exc:
        error = str(exc)
    args = st.args
    if algorithm is not None:
        args["speculative_algorithm"] = algorithm
    dos = args.get("disable_overlap_schedule")
    worker_class = worker_file = None
    if error is None and algorithm in EAGLE_FAMILY:
        worker_class = _route(rel, algorithm, args)
        worker_file = rel.worker_files[worker_class]
        if worker_class == R.MULTI_V1[0] and rel.multi_layer_v1_import_error:
            error = (f"{rel.multi_layer_v1_import_error} ({worker_file} fails at import on CPython <= 3.13: "
                     f"multi-layer EAGLE needs the overlap schedule in this release)")
            worker_class = worker_file = None
    certain = not _model_dependent(rel, raw_algorithm, st.args, model_arch, error)
    reason = _reason(st, algorithm, worker_class, worker_file, error)
    unmodelled = _unmodelled_override(version, raw_algorithm, model_arch, error)
    if not certain:
        reason = f"{NOT_CERTAIN}: {reason}"
    elif unmodelled is not None:
        certain = False
        reason = (f"{NOT_CERTAIN_OVERRIDE.format(name=unmodelled.name, version=version)} "
                  f"({unmodelled.not_modelled}): {reason}")
    return Resolution(
        version=version, known=True, algorithm=algorithm, worker_class=worker_class,
        worker_file=worker_file, disable_overlap_schedule=dos, spec_v2_env=st.env.describe(),
        reason=reason,
        startup_error=error, warnings=tuple(warnings), adaptive_available=adaptive_available,
        resolved_args=args, unknown_flags=unknown, certain=certain,
    )


def _resolve_dp_layout(args: dict[str, Any]) -> None:
    """0.5.22+ (releases with --attn-dp-size): the deprecated `--dp-size N --enable-dp-attention`
    becomes attn_dp_size=N, dp_size=1 before any handler reads the layout, and `enable_dp_attention`
    then means "attention DP runs" (attn_dp_size > 1), as the release's resolved dump reports it."""
    if "attn_dp_size" not in args:
        return
    if args.get("enable_dp_attention") and args["attn_dp_size"] == 1:
        args["attn_dp_size"], args["dp_size"] = args["dp_size"], 1
    args["enable_dp_attention"] = args["attn_dp_size"] > 1


NOT_CERTAIN = "not certain: model config not readable, model-specific routing not ruled out"


NOT_CERTAIN_OVERRIDE = "not certain: the {name} model override of SGLang {version} is not modelled exactly"


def _model_dependent(rel: R.Release, raw_algorithm: Any, args: dict[str, Any], model_arch: str | None,
                     error: str | None) -> bool:
    """Would a model-specific override of this release change the answer, for some architecture?

    The overrides turn on multi-layer EAGLE for `--speculative-algorithm EAGLE` (the raw string) on the
    architectures in `rel.multi_layer_archs`, and (0.5.17+) R.MODEL_OVERRIDES refuse or adjust
    speculative launches of their architectures; without the model's architecture neither is ruled out.
    """
    if model_arch is not None or error is not None:
        return False
    if raw_algorithm is not None and R.model_overrides(rel.version):
        return True
    return bool(rel.multi_layer_archs) and raw_algorithm == "EAGLE" and not args.get("enable_multi_layer_eagle")


def _unmodelled_override(version: str, raw_algorithm: Any, model_arch: str | None,
                         error: str | None) -> R.ModelOverride | None:
    """The model override of `model_arch` whose effect on this speculative launch fleetctl cannot model."""
    if raw_algorithm is None or error is not None or model_arch is None:
        return None
    return next((o for o in R.model_overrides(version, model_arch) if not o.exact), None)


def _as_int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


_OVERRIDE_CHECKS = {
    "attention_backend_not_fa3": lambda a, algo: any(
        a.get(k) not in (None, "fa3") for k in ("attention_backend", "prefill_attention_backend",
                                                  "decode_attention_backend")),
    "algorithm_not_eagle_nextn": lambda a, algo: algo is not None and str(algo).upper() not in ("EAGLE", "NEXTN"),
    "draft_backend_not_fa3": lambda a, algo: algo is not None
    and a.get("speculative_draft_attention_backend") not in (None, "fa3"),
    "context_parallel": lambda a, algo: _as_int(a.get("attn_cp_size"), 1) > 1 or _as_int(a.get("dcp_size"), 1) > 1
    or bool(a.get("enable_prefill_cp")),
    "topk_gt_1": lambda a, algo: a.get("speculative_eagle_topk") is not None and a["speculative_eagle_topk"] > 1,
    "multi_layer": lambda a, algo: bool(a.get("enable_multi_layer_eagle")),
    "dp_attention": lambda a, algo: bool(a.get("enable_dp_attention")),
    "pp": lambda a, algo: a["pp_size"] > 1,
    "draft_path_not_independent": lambda a, algo: a.get("speculative_draft_model_path") in (None, a.get("model_path")),
}


def _apply_model_overrides(st: _State, model_arch: str | None, stage: str = "override") -> None:
    """The refusals of the release's model overrides for `model_arch` run at `stage`, in SGLang's order."""
    if model_arch is None:  # (not knowing the architecture is handled by _model_dependent)
        return
    raw_algorithm = st.args.get("speculative_algorithm")
    for override in R.model_overrides(st.rel.version, model_arch):
        if override.stage != stage:
            continue
        for check, error in override.refuses:
            if _OVERRIDE_CHECKS[check](st.args, raw_algorithm):
                st.causes.append(f"the {override.name} model override of {model_arch}")
                raise LaunchError(error)


def _check_pp_spec(st: _State, algorithm: str | None, env: dict[str, str]) -> None:
    """check_server_args on pp_size > 1 with speculative decoding (after every post-init handler)."""
    args, rel = st.args, st.rel
    if args["pp_size"] <= 1 or algorithm is None:
        return
    if rel.pp_spec_error is not None:
        raise LaunchError(rel.pp_spec_error)
    if algorithm != "EAGLE" or args.get("enable_multi_layer_eagle"):
        raise LaunchError(R.PP_SPEC_ONLY_EAGLE)
    raw = env.get(R.PP_SPEC_ENV)
    if raw is not None and raw.lower() in R.ENV_TRUE:
        if args.get("speculative_adaptive"):
            raise LaunchError(R.PP_SPEC_ENV_ADAPTIVE)
        if args.get("enable_dp_attention"):
            raise LaunchError(rel.pp_spec_dp_error)
        st.causes.append(f"{R.PP_SPEC_ENV}={raw}")
        return
    raise LaunchError(R.PP_SPEC_PREFILL_ONLY)  # (fleetctl does not model --disaggregation-mode prefill)


def _normalize_algorithm(rel: R.Release, raw: Any) -> str | None:
    if raw is None:
        return None
    name = str(raw)
    if rel.algorithm_choices:
        if name not in rel.algorithms:
            choices = ", ".join(repr(a) for a in rel.algorithms)
            raise LaunchError(f"argument --speculative-algorithm: invalid choice: {name!r} (choose from {choices})")
    elif name.upper() not in rel.algorithms:
        raise LaunchError(f"ValueError: Unknown speculative algorithm name: {name}")
    name = name.upper()
    return "EAGLE" if name == "NEXTN" else name


def _route(rel: R.Release, algorithm: str, args: dict[str, Any]) -> str:
    if args.get("enable_multi_layer_eagle") and algorithm in rel.multi_layer_algorithms:
        family = R.MULTI_LAYER
    else:
        family = R.STANDALONE if algorithm == "STANDALONE" else R.EAGLE
    on, off = rel.rules.routes[family]
    return off if args["disable_overlap_schedule"] else on


def _run(st: _State, algorithm: str | None, model_arch: str | None) -> None:
    rel, args = st.rel, st.args
    raw_algorithm = args.get("speculative_algorithm")
    # model-specific adjustments run first and see the raw --speculative-algorithm string
    if rel.forces_multi_layer(model_arch) and raw_algorithm == "EAGLE":
        args["enable_multi_layer_eagle"] = True
        st.causes.append(f"{model_arch} turns on multi-layer EAGLE")
        if rel.multi_layer_arch_forces_env and not st.env.get():
            st.env.forced = True
            st.warnings.append(R.MULTI_LAYER_FORCES_ENV_WARNING)
    _apply_model_overrides(st, model_arch)
    if args["pp_size"] > 1:
        args["disable_overlap_schedule"] = True
        st.warnings.append(R.PP_WARNING)
        st.causes.append(f"pp_size={args['pp_size']}")
    elif args["disable_overlap_schedule"]:
        st.causes.append("--disable-overlap-schedule")
    if "env_removed" in rel.rules.messages and st.env.raw is not None:
        st.warnings.append(rel.rules.messages["env_removed"])
    if algorithm not in EAGLE_FAMILY:
        if algorithm is not None:
            st.notes.append(f"{algorithm} is not an EAGLE-family algorithm; its worker is not modelled")
        return
    adaptive = rel.adaptive
    if adaptive and adaptive.stage == "before_handler" and args.get("speculative_adaptive"):
        _check_adaptive(st, algorithm)
        if args["speculative_adaptive"] and adaptive.initializes_params:
            _init_adaptive(st)
    _eagle_family(st, algorithm, model_arch)
    if adaptive and adaptive.stage == "after_handler" and args.get("speculative_adaptive"):
        _check_adaptive(st, algorithm)
        if args["speculative_adaptive"] and adaptive.validates_initial_steps:
            _validate_adaptive_steps(st)


def _eagle_family(st: _State, algorithm: str, model_arch: str | None) -> None:
    args, rules = st.args, st.rel.rules
    if algorithm == "STANDALONE" and args.get("enable_dp_attention"):
        raise LaunchError(R.STANDALONE_DP_ERROR)
    if args.get("max_running_requests") is None:
        args["max_running_requests"] = 48
        st.warnings.append(R.MAX_RUNNING_WARNING)
    _OVERLAP_POLICIES[rules.policy](st, algorithm)
    _apply_model_overrides(st, model_arch, stage="handler")
    _auto_params(st, algorithm, model_arch)


def _policy_env_gates_v1(st: _State, algorithm: str) -> None:
    msgs = st.rel.rules.messages
    if algorithm in st.rel.rules.v2_algorithms and st.env.get():
        st.args["disable_overlap_schedule"] = False
        st.warnings.append(msgs["overlap_on"])
    if not st.env.get():
        st.args["disable_overlap_schedule"] = True
        st.warnings.append(msgs["overlap_off"])


def _policy_env_forces_v2(st: _State, algorithm: str) -> None:
    msgs, args = st.rel.rules.messages, st.args
    if algorithm in st.rel.rules.v2_algorithms and st.env.get():
        args["disable_overlap_schedule"] = False
        st.warnings.append(msgs["overlap_on"])
        topk = args.get("speculative_eagle_topk")
        if topk is not None and topk > 1:
            raise LaunchError(f"ValueError: {msgs['topk_error']}")
    else:
        args["disable_overlap_schedule"] = True
        st.warnings.append(msgs["overlap_off"])


def _policy_v2_default(st: _State, algorithm: str) -> None:
    msgs, args = st.rel.rules.messages, st.args
    reason = None
    topk = args.get("speculative_eagle_topk")
    if topk is not None and topk > 1 and not args["disable_overlap_schedule"]:
        args["disable_overlap_schedule"] = True
        reason = msgs["reason_topk"]
        st.causes.append(f"explicit topk={topk}")
    elif not st.env.get() and not args["disable_overlap_schedule"]:
        args["disable_overlap_schedule"] = True
        reason = msgs["reason_env"]
    if args["disable_overlap_schedule"]:
        st.warnings.append(msgs["overlap_off"].format(reason=reason or msgs["reason_flag"]))
    else:
        st.warnings.append(msgs["overlap_on"])


def _policy_v2_only_env(st: _State, algorithm: str) -> None:
    msgs, args = st.rel.rules.messages, st.args
    if not st.env.get() and not args["disable_overlap_schedule"]:
        args["disable_overlap_schedule"] = True
    st.warnings.append(msgs["overlap_off"] if args["disable_overlap_schedule"] else msgs["overlap_on"])


def _policy_v2_only(st: _State, algorithm: str) -> None:
    if st.args["disable_overlap_schedule"]:
        st.warnings.append(st.rel.rules.messages["overlap_off"])


_OVERLAP_POLICIES = {
    "env_gates_v1": _policy_env_gates_v1,
    "env_forces_v2": _policy_env_forces_v2,
    "v2_default": _policy_v2_default,
    "v2_only_env": _policy_v2_only_env,
    "v2_only": _policy_v2_only,
}


def _auto_params(st: _State, algorithm: str, model_arch: str | None) -> None:
    args, auto = st.args, st.rel.auto
    steps_key, topk_key, tokens_key = ("speculative_num_steps", "speculative_eagle_topk",
                                       "speculative_num_draft_tokens")
    skip_auto = bool(st.rel.adaptive and st.rel.adaptive.initializes_params and args.get("speculative_adaptive"))
    if args[steps_key] is None and not skip_auto:
        if args[topk_key] is not None or args[tokens_key] is not None:
            raise LaunchError(R.STEPS_ASSERTION)
        if algorithm == "STANDALONE":
            chosen: tuple[int, int, int] | None = auto.standalone
        elif model_arch is not None:
            chosen = auto.by_arch.get(model_arch, auto.default)
        else:
            chosen = None
            st.notes.append("num_steps/topk/draft_tokens are auto-chosen from the target architecture "
                            "(not given)")
        if chosen is not None:
            args[steps_key], args[topk_key], args[tokens_key] = chosen
    steps, topk = args[steps_key], args[topk_key]
    if steps is None:  # auto-chosen from an architecture we were not told
        return
    if topk is None:
        raise LaunchError(R.TOPK_UNSET_ERROR)
    if topk == 1 and args[tokens_key] != steps + 1:
        st.warnings.append(R.DRAFT_TOKENS_WARNING)
        args[tokens_key] = steps + 1


def _check_adaptive(st: _State, algorithm: str) -> None:
    args, adaptive = st.args, st.rel.adaptive
    assert adaptive is not None
    topk = args.get("speculative_eagle_topk")
    reasons = adaptive.reasons
    reason = None
    if algorithm not in ("EAGLE", "EAGLE3"):
        reason = reasons["algorithm"].format(algorithm=algorithm)
    elif topk is None and adaptive.stage == "after_handler":
        st.notes.append("adaptive needs topk=1; the auto-chosen topk depends on the target architecture")
        return
    elif topk is not None and topk != 1:
        reason = reasons["topk"].format(topk=topk)
    elif args.get("enable_dp_attention"):
        reason = reasons["dp_attention"]
    elif adaptive.requires_overlap_off and not args["disable_overlap_schedule"]:
        reason = reasons["overlap"]
    elif args.get("enable_multi_layer_eagle"):
        reason = reasons["multi_layer"].format(worker=adaptive.multi_layer_class)
    if reason is not None:
        st.warnings.append(R.ADAPTIVE_DISABLED_WARNING.format(reason=reason))
        args["speculative_adaptive"] = False


def _candidates(st: _State) -> list[int] | None:
    path = st.args.get("speculative_adaptive_config")
    if path:
        got = st.files.get(str(path)) if st.files is not None else None
        if got is None:
            st.notes.append("adaptive candidate steps come from --speculative-adaptive-config (not read)")
            return None
        if isinstance(got, str):  # the release opens it at start-up: the server refuses to start
            raise LaunchError(f"{adaptive.OPEN_ERROR}: {path}: {got}")
        try:
            return adaptive.loader_candidates(st.rel.version, got)
        except adaptive.LoaderError as e:
            raise LaunchError(f"{e} (in {path})") from None
    assert st.rel.adaptive is not None
    return list(st.rel.adaptive.default_candidates)


def _validate_adaptive_steps(st: _State) -> None:
    candidates = _candidates(st)
    steps = st.args.get("speculative_num_steps")
    if candidates is not None and steps is not None and steps not in candidates:
        raise LaunchError(R.ADAPTIVE_STEPS_ERROR.format(steps=steps, candidates=candidates))


def _init_adaptive(st: _State) -> None:
    args = st.args
    if args.get("speculative_eagle_topk") is None:
        args["speculative_eagle_topk"] = 1
    candidates = _candidates(st)
    if candidates is None:
        return
    if args.get("speculative_num_steps") is None:
        args["speculative_num_steps"] = candidates[len(candidates) // 2]
    _validate_adaptive_steps(st)
    args["speculative_num_draft_tokens"] = args["speculative_num_steps"] + 1


def _reason(st: _State, algorithm: str | None, worker_class: str | None, worker_file: str | None,
            error: str | None) -> str:
    rules = st.rel.rules
    env_part = f"{R.SPEC_V2_ENV} {st.env.describe()}"
    if st.env.raw is None and rules.spec_v2_default:
        env_part += " (default on)"
    head = f"{st.rel.version} with {env_part}"
    if st.causes:
        head += ", " + ", ".join(st.causes)
    if error is not None:
        return f"{head} -> the server refuses to start: {error}"
    if algorithm is None:
        return f"{head} and no --speculative-algorithm -> no speculative worker"
    dos = st.args.get("disable_overlap_schedule")
    if worker_class is None:
        return f"{head} -> {algorithm}: " + "; ".join(st.notes)
    tail = f" ({'; '.join(st.notes)})" if st.notes else ""
    return f"{head} -> disable_overlap_schedule={dos} -> {worker_class} in {worker_file}{tail}"
