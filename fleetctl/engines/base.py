"""The engine interface: `Engine` (a Protocol) and the plain types its answers are made of.

An engine package (fleetctl/engines/<name>/) implements `Engine` and imports only this module, the
protocol's types and errors; `fleetctl.engines.engine()` returns the one instance.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fleetctl.protocol.answers import EngineProbeAnswer
    from fleetctl.protocol.gpus import Gpu


# what `fleetctl patch init` writes where the user must still give a value (config/launch_ready.py
# names each one left and `launch` refuses them); an engine's scaffold writes it into its drafts
PLACEHOLDER = "<FILL: "
# a playbook state file named in a launch flag or env value: `{file:<name>}` (model/statefiles.py
# makes it the file's path on the host); an engine reads its own config files through `refs`
REF_RE = re.compile(r"\{file:([^{}]*)\}")


def refs(value: Any) -> list[str]:
    """The state file names a launch value refers to (`{file:<name>}`)."""
    return REF_RE.findall(value) if isinstance(value, str) else []


@dataclass(frozen=True)
class PatchedFile:
    """A package file the playbook's patch changes, as an engine's family checks read it. The diff
    itself is read by the caller (fleetctl/patching/engine.py); `touched()` answers (the pristine
    line numbers the patch removes, the patched line numbers it adds, the patched bytes), worked out
    on first call (it raises FleetctlError when the patch does not apply)."""

    patch: bytes
    touched: Callable[[], tuple[frozenset[int], frozenset[int], bytes]] = field(compare=False, repr=False)


@dataclass(frozen=True)
class LogLine:
    raw: str
    timestamp: str | None  # "YYYY-MM-DD HH:MM:SS" or with ".mmm"; None for bare lines
    ranks: dict[str, int]  # e.g. {"TP": 1}; {} for the main process, detokenizer, bare lines
    message: str


@dataclass(frozen=True)
class ModelConfig:
    """The target model config.json as read on the host: `arch` (architectures[0]) or `error`."""

    arch: str | None
    path: str | None
    error: str | None

    @property
    def readable(self) -> bool:
        return self.arch is not None


@dataclass(frozen=True)
class Resolution:
    version: str
    known: bool
    algorithm: str | None  # normalized, e.g. "EAGLE3"; None when no speculation
    worker_class: str | None
    worker_file: str | None  # relative to the sglang package dir
    disable_overlap_schedule: bool | None
    spec_v2_env: str  # e.g. "unset", "set to '1' (on)"
    reason: str  # one sentence
    startup_error: str | None  # the real server refuses to start with this
    warnings: tuple[str, ...]  # startup warnings SGLang prints for this case, in order
    adaptive_available: bool  # upstream --speculative-adaptive exists
    resolved_args: dict[str, Any] = field(default_factory=dict)
    unknown_flags: tuple[str, ...] = ()  # flags the upstream parser of this release does not have
    # False when the answer depends on the target model's config.json `architectures`, which was not
    # given (not readable): model-specific overrides of this release could change the worker
    certain: bool = True


class Engine(Protocol):
    """What fleetctl needs to know about the engine it patches and launches."""

    # -- the package: how an interpreter imports it, how the user names it
    package: str  # import name and wheel distribution name
    display_name: str  # how messages name the engine
    dir_key: str  # the inventory key that pins the package directory
    source_prefix: str  # where the package lives in a source checkout (patch import)
    image_package_dir: str  # the package dir in the engine's published container images (patch dockerfile)
    add_release_hint: str  # how a new release of the engine is taught to fleetctl (docs and the file)

    # -- files: what facts hash, what `facts` shows, where server flags are registered
    hash_dirs: tuple[str, ...]
    hash_files: tuple[str, ...]
    key_files: tuple[str, ...]
    args_file: str

    # -- launching and reading a server
    launch_command: str  # the default launch profile command, `{python}` filled per host
    port_flag: str
    tp_flag: str
    tp_spellings: frozenset[str]
    ready_line: str  # the log line that says the server is ready
    dump_anchor: str  # the log line's prefix that carries the resolved server arguments
    log_stamp_re: str  # a log line's timestamp (regex, group 1) and its strptime format
    log_stamp_fmt: str
    routing_env_prefixes: tuple[str, ...]  # env names (prefixes) that can change which code runs
    report_args: tuple[str, ...]  # resolved server arguments verify reports per instance

    def agent_facts(self) -> dict[str, str]:
        """The engine facts the host agent needs, sent in its requests (the agent is engine-blind)."""
        ...

    def short_path(self, rel: str) -> str:
        """A package-relative path as `facts` shows it in a narrow column."""
        ...

    def flag_registered(self, args_text: str, flag: str) -> bool:
        """Does this source of `args_file` register the server flag `flag` (argparse's abbreviations too)?"""
        ...

    # -- releases and their pristine sources
    def known_versions(self) -> tuple[str, ...]: ...
    def is_known(self, version: str) -> bool: ...
    def worker_files(self, version: str) -> dict[str, str]: ...

    # -- which code runs for given flags/env/model
    def resolve_worker(self, version: str, flags: dict[str, Any], env: dict[str, str], *,
                       model_arch: str | None = None, files: Mapping[str, bytes | str] | None = None) -> Resolution: ...
    def launch_file_note(self, version: str, flags: Mapping[str, Any], files: Mapping[str, bytes | str] | None) -> str | None:
        """What the engine makes of the files the launch names, as read (explain's note; None: nothing read)."""
        ...
    def launch_files(self, flags: Mapping[str, Any]) -> list[str]:
        """Host files the launch's flags name that the engine reads at start-up (facts reads them)."""
        ...
    def overlap_cause(self, version: str, disable_overlap_schedule: bool, env: Mapping[str, str]) -> str | None:
        """Why the resolved routing turned the overlap schedule off, when the launch env decided it."""
        ...

    def log_visibility_problems(self, resolved_args: dict[str, Any], env: dict[str, str]) -> list[str]:
        """Launch settings that would hide the log lines verify reads."""
        ...

    # -- log and rank parsing, process matching
    def parse_line(self, line: str) -> LogLine: ...
    def expected_ranks(self, version: str, resolved_args: dict[str, Any]) -> list[dict[str, int]]: ...
    def parse_server_args_dump(self, message: str) -> dict[str, Any] | None: ...
    def match_rules(self, launch_command: str | None = None) -> dict[str, list[str]]:
        """What the agent matches /proc command lines against to find server processes."""
        ...
    def server_flags(self, argv: list[str], modules: list[str] | None = None) -> dict[str, Any]: ...

    def shown_env(self, env: Mapping[str, str]) -> dict[str, str | None]:
        """The launch environment variables that decide which code runs (explain shows them)."""
        ...
    def shown_flags(self, flags: Mapping[str, Any]) -> dict[str, Any]:
        """The launch flags that decide which code runs (explain shows them)."""
        ...

    # -- the launch's target model (model-specific routing reads its config.json on the host)
    model_flag: str  # the launch flag naming the target model
    not_certain: str  # how an answer that a model-specific override could change is qualified
    def launch_model(self, flags: Mapping[str, Any], argv: list[str] | tuple[str, ...] = (), *,
                     draft: bool = False) -> dict[str, str] | None:
        """{"path", "revision"} of the model (`draft`: the speculative draft model) a launch names
        (None: it names none)."""
        ...
    def model_from_answer(self, answer: object) -> ModelConfig | None:
        """What the agent read of the model config, validated (untrusted)."""
        ...

    # -- families of alternative files the launch chooses between (coverage derived from the patch)
    family_names: tuple[str, ...]  # the keys `covers.families` takes; the first is the speculative worker
    def spec_members(self, version: str) -> dict[str, str]:
        """Worker class -> file of every speculative worker the release's factory can build."""
        ...
    def other_spec_worker(self, version: str, algorithm: str) -> list[tuple[str, str]]:
        """(class, file) of workers an algorithm resolve_worker does not model may run."""
        ...
    def family_checks(self, version: str, flags: Mapping[str, Any], patched: Mapping[str, PatchedFile],
                      asked: Mapping[str, bool | None], *, model: ModelConfig | None = None,
                      draft: ModelConfig | None = None) -> list[Any]:
        """The other families the patch (or `covers:`) makes relevant, each checked (FamilyCheck)."""
        ...

    # -- what a playbook's launch flags ask of the engine (e.g. adaptive speculation's config)
    def playbook_refusal(self, pb: Any, version: str) -> str | None:
        """Why this release cannot run the playbook's launch at all (None: it can)."""
        ...
    def playbook_warnings(self, pb: Any, flags: dict[str, Any]) -> list[str]:
        """What in the playbook's launch would never act with these flags (a warning each)."""
        ...
    def state_file_check(self, pb: Any, version: str, name: str, data: bytes) -> tuple[bool, str] | None:
        """How this release's own loader reads a playbook state file the launch names (None: not one)."""
        ...

    def patched_refusal(self, version: str, intended: dict[str, bytes], resolved_args: dict[str, Any]) -> str | None:
        """What a check the playbook's patch adds to the argument file raises for this launch (None: nothing)."""
        ...

    # -- `patch init`: a new playbook's launch and marker from the files a patch changes
    def scaffold(self, version: str, patched: dict[str, tuple[bytes, bytes]],
                 command: str | None = None) -> tuple[Any, list[Any]]:
        """(the launch draft, the log lines the patch adds) for rel -> (pristine, patched) bytes;
        `command`: the user's own launch command line (kept as the launch)."""
        ...

    # -- the host's own engine asked (`explain --probe`): run on the host's CPU, no GPU visible
    probe_disagree: str  # how a disagreement between the table and the host's engine starts
    def probe_hardware(self, gpus: list[Gpu] | None, use: tuple[int, ...]) -> dict[str, Any]:
        """The engine's hardware queries answered from nvidia-smi facts (ProbeInputError: cannot be)."""
        ...
    def probe_host(self, conn: Any, launch: dict[str, Any], argv: list[str], hardware: dict[str, Any],
                   overlay: dict[str, bytes] | None = None) -> EngineProbeAnswer:
        """Run the engine's own argument processing and worker selection on the host (agent `engine_probe`)."""
        ...
    def probe_compare(self, table: Resolution, answer: EngineProbeAnswer) -> tuple[bool | None, str]:
        """Does the table agree with the host's engine? (None: no comparison) and one sentence."""
        ...

    # -- `gpu-check`: throwaway servers of a tiny model fleetctl makes on the host (fleetctl/ops/gpu_check.py)
    def gpu_check(self) -> Any:
        """The engine's part of gpu-check: `phases()`, `threshold()`, `model_script()`,
        `bench_script()`, `PHASES`, `PHASE_HELP` (fleetctl/engines/sglang/gpu_check.py)."""
        ...
