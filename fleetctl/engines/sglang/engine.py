"""SGLang as a fleetctl engine (fleetctl/engines/base.py: the interface). Every SGLang path, env name,
flag and log line that code outside this package needs is reached through `SGLANG`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetctl.engines.base import Engine, PatchedFile
from fleetctl.engines.sglang import logs, model_config, processes, routing
from fleetctl.engines.sglang import releases as R

_RESOLVED: dict[tuple[str, str | None, str], routing.Resolution] = {}  # SGLangEngine.resolve_worker
_RESOLVED_MAX = 4096


@dataclass(frozen=True)
class SGLangEngine:
    package: str = R.PACKAGE
    display_name: str = R.DISPLAY_NAME
    dir_key: str = "sglang_dir"
    source_prefix: str = "python/sglang/"
    image_package_dir: str = "/sgl-workspace/sglang/python/sglang"  # the lmsysorg/sglang images' editable checkout
    add_release_hint: str = "docs/worker-paths.md, one Release row in fleetctl/engines/sglang/releases.py"

    hash_dirs: tuple[str, ...] = (R.SPEC_DIR,)
    hash_files: tuple[str, ...] = ("srt/server_args.py",)
    key_files: tuple[str, ...] = ("srt/server_args.py", R.EAGLE_V1[1], R.EAGLE_V2[1])
    args_file: str = "srt/server_args.py"

    launch_command: str = "{python} -m sglang.launch_server"
    port_flag: str = R.PORT_FLAG
    tp_flag: str = R.TP_FLAG
    tp_spellings: frozenset[str] = R.TP_SPELLINGS
    ready_line: str = R.READY_LINE
    dump_anchor: str = R.DUMP_ANCHOR
    log_stamp_re: str = processes.LOG_STAMP_RE
    log_stamp_fmt: str = processes.LOG_STAMP_FMT
    routing_env_prefixes: tuple[str, ...] = processes.ROUTING_ENV_PREFIXES
    report_args: tuple[str, ...] = ("speculative_algorithm", "disable_overlap_schedule", "speculative_eagle_topk")

    def gpu_check(self) -> Any:
        from fleetctl.engines.sglang import gpu_check

        return gpu_check

    def agent_facts(self) -> dict[str, str]:
        return {"package": self.package, "args_file": self.args_file, "dir_key": self.dir_key}

    def short_path(self, rel: str) -> str:
        """A package-relative path as `facts` shows it in a narrow column."""
        return rel.replace(R.SPEC_DIR + "/", "spec/").replace("srt/", "")

    def flag_registered(self, args_text: str, flag: str) -> bool:
        from fleetctl.engines.sglang.flags import flag_registered

        return flag_registered(args_text, flag)

    def known_versions(self) -> tuple[str, ...]:
        return tuple(R.KNOWN_VERSIONS)

    def is_known(self, version: str) -> bool:
        return routing.is_known(version)

    def worker_files(self, version: str) -> dict[str, str]:
        return routing.worker_files(version)

    def resolve_worker(self, version: str, flags: dict[str, Any], env: dict[str, str], *,
                       model_arch: str | None = None, files: Mapping[str, bytes | str] | None = None
                       ) -> routing.Resolution:
        """routing.resolve_worker: a pure function of its arguments, so one answer per distinct
        launch (the hosts of a fleet mostly share version, flags, env and model) within a command."""
        named = {k: (v.hex() if isinstance(v, bytes) else ["why", v]) for k, v in (files or {}).items()}
        try:
            key = (version, model_arch, json.dumps([flags, env, named if files is not None else None], sort_keys=True))
        except (TypeError, ValueError):  # a value JSON cannot hold: not memoized
            return routing.resolve_worker(version, flags, env, model_arch=model_arch, files=files)
        hit = _RESOLVED.get(key)
        if hit is None:
            hit = routing.resolve_worker(version, flags, env, model_arch=model_arch, files=files)
            if len(_RESOLVED) < _RESOLVED_MAX:
                _RESOLVED[key] = hit
        return hit

    def launch_file_note(self, version: str, flags: Mapping[str, Any], files: Mapping[str, bytes | str] | None) -> str | None:
        from fleetctl.engines.sglang import adaptive

        return adaptive.read_note(version, dict(flags), dict(files) if files is not None else None)

    def launch_files(self, flags: Mapping[str, Any]) -> list[str]:
        from fleetctl.engines.sglang import adaptive

        return adaptive.named_files(dict(flags))

    def overlap_cause(self, version: str, disable_overlap_schedule: bool, env: Mapping[str, str]) -> str | None:
        rel = R.RELEASES.get(version)
        if (disable_overlap_schedule and rel is not None and rel.rules.spec_v2_default is False
                and R.SPEC_V2_ENV not in env):
            return f"disable_overlap_schedule=True because {R.SPEC_V2_ENV} was not in the launch env"
        return None

    def worker_fixes(self, version: str, flags: Mapping[str, Any], env: Mapping[str, str],
                     patched: set[str], *, model_arch: str | None = None,
                     intended: dict[str, bytes] | None = None) -> list[str]:
        """The smallest changes of the launch's routing env under which `version` runs a worker file
        in `patched` (as the release's own routing decides), each as a sentence for a refusal."""
        out: list[str] = []
        if version not in R.RELEASES:
            return out
        current = env.get(R.SPEC_V2_ENV)
        for value in ("1", "0"):
            if current is not None and current.strip().lower() in ((value, "true") if value == "1" else (value, "false")):
                continue
            res = self.resolve_worker(version, dict(flags), {**env, R.SPEC_V2_ENV: value}, model_arch=model_arch)
            if res.worker_file not in patched or res.startup_error:
                continue
            if intended and self.patched_refusal(version, intended, res.resolved_args):
                continue  # the playbook's own server_args refuses that launch: no fix
            out.append(f"set {R.SPEC_V2_ENV}={value} in the playbook's launch.env (then {res.worker_class} "
                       f"in {res.worker_file} runs)")
        return out

    def log_visibility_problems(self, resolved_args: dict[str, Any], env: dict[str, str]) -> list[str]:
        return processes.log_visibility_problems(resolved_args, env)

    def parse_line(self, line: str) -> logs.LogLine:
        return logs.parse_line(line)

    def expected_ranks(self, version: str, resolved_args: dict[str, Any]) -> list[dict[str, int]]:
        return logs.expected_ranks(version, resolved_args)

    def parse_server_args_dump(self, message: str) -> dict[str, Any] | None:
        return logs.parse_server_args_dump(message)

    def match_rules(self, launch_command: str | None = None) -> dict[str, list[str]]:
        return processes.match_rules(launch_command)

    def server_flags(self, argv: list[str], modules: list[str] | None = None) -> dict[str, Any]:
        return processes.server_flags(argv, modules)

    def shown_env(self, env: Mapping[str, str]) -> dict[str, str | None]:
        return {"spec_v2_env": env.get(R.SPEC_V2_ENV, None)}

    def shown_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in flags.items() if "speculative" in k or "overlap" in k}

    model_flag: str = "--model-path"
    not_certain: str = routing.NOT_CERTAIN

    def launch_model(self, flags: Mapping[str, Any], argv: list[str] | tuple[str, ...] = (), *,
                     draft: bool = False) -> dict[str, str] | None:
        return model_config.launch_model(dict(flags), argv, draft=draft)

    def model_from_answer(self, answer: object) -> model_config.ModelConfig | None:
        return model_config.from_answer(answer)

    family_names: tuple[str, ...] = ("speculative_worker", "model", "attention_backend", "grammar_backend",
                                     "sampling_backend")

    def spec_members(self, version: str) -> dict[str, str]:
        from fleetctl.engines.sglang import families

        return families.spec_members(version)

    def other_spec_worker(self, version: str, algorithm: str) -> list[tuple[str, str]]:
        from fleetctl.engines.sglang import families

        return families.other_spec_worker(version, algorithm)

    def family_checks(self, version: str, flags: Mapping[str, Any], patched: Mapping[str, PatchedFile],
                      asked: Mapping[str, bool | None], *, model: Any = None, draft: Any = None) -> list[Any]:
        from fleetctl.engines.sglang import families

        def seen(m: Any) -> families.ModelSeen | None:
            return None if m is None else families.ModelSeen(m.arch, m.error)

        return families.check(version, flags, patched, asked, model=seen(model), draft=seen(draft))

    def playbook_refusal(self, pb: Any, version: str) -> str | None:
        from fleetctl.engines.sglang import adaptive

        return adaptive.release_refusal(pb, version)

    def playbook_warnings(self, pb: Any, flags: dict[str, Any]) -> list[str]:
        from fleetctl.engines.sglang import adaptive

        return adaptive.idle_slot_warnings(pb, flags)

    def state_file_check(self, pb: Any, version: str, name: str, data: bytes) -> tuple[bool, str] | None:
        from fleetctl.engines.sglang import adaptive

        if name not in {n for n, _ in adaptive.adaptive_configs(pb)}:
            return None
        steps = pb.launch.flags.get("--speculative-num-steps", 3)
        initial = steps if isinstance(steps, int) and not isinstance(steps, bool) else 3
        return adaptive.config_check(version, data, initial)

    def patched_refusal(self, version: str, intended: dict[str, bytes], resolved_args: dict[str, Any]) -> str | None:
        from fleetctl.engines.sglang import server_args_replay

        return server_args_replay.patched_refusal(version, intended, resolved_args)

    def scaffold(self, version: str, patched: dict[str, tuple[bytes, bytes]],
                 command: str | None = None) -> tuple[Any, list[Any]]:
        from fleetctl.engines.sglang import scaffold

        markers = [m for rel, (old, new) in patched.items() for m in scaffold.added_markers(version, rel, old, new)]
        order = {"worker": 0, "file": 1, "anywhere": 2}  # a marker in the worker first: it proves the most
        return scaffold.launch_draft(version, patched, command), sorted(markers, key=lambda m: order[m.where])

    probe_disagree: str = "fleetctl's table and this host's SGLang disagree"

    def probe_hardware(self, gpus: Any, use: tuple[int, ...]) -> dict[str, Any]:
        from fleetctl.engines.sglang import probe

        return probe.hardware(gpus, use)

    def probe_host(self, conn: Any, launch: dict[str, Any], argv: list[str], hardware: dict[str, Any],
                   overlay: dict[str, bytes] | None = None) -> Any:
        from fleetctl.engines.sglang import probe

        return probe.run_probe(conn, launch, argv, hardware, overlay=overlay)

    def probe_compare(self, table: routing.Resolution, answer: Any) -> tuple[bool | None, str]:
        from fleetctl.engines.sglang import probe

        v = probe.compare(table, answer)
        return v.agrees, v.line


SGLANG: Engine = SGLangEngine()  # a type checker holds it to the interface
