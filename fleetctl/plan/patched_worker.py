"""Does the playbook patch what it declares it must cover (`covers:`), e.g. the worker that will
actually run (the origin story's question)?

The launch environment considered is exactly what `fleetctl launch` will pass: the playbook's
launch env plus the inventory's env for the host — never the controller's own environment.
All SGLang knowledge comes from the engine (fleetctl/engines/base.py).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import Playbook
from fleetctl.model.facts import HostFacts
from fleetctl.plan.deploy import Coverage

if TYPE_CHECKING:
    from fleetctl.engines.base import ModelConfig
from fleetctl.engines import engine
from fleetctl.engines.base import PatchedFile


def instances(host: Host, playbook: Playbook) -> list[Any]:
    """The server instances `fleetctl launch` would start on the host (same code path as launch)."""
    from fleetctl.model.instances import plan_instances

    return plan_instances(host, playbook.launch)


def launch_flags(host: Host, playbook: Playbook) -> dict[str, Any]:
    """The flags of the host's first instance, exactly as launch builds them."""
    return dict(instances(host, playbook)[0].flags)


def launch_env(host: Host, playbook: Playbook) -> dict[str, str]:
    """The environment the launch's python sees (playbook env + inventory env + what an `env` prefix
    in the launch command sets), never the controller's."""
    return dict(instances(host, playbook)[0].effective_env)


def named_files(facts: HostFacts | None, playbook: Playbook, flags: dict[str, Any]) -> dict[str, bytes | str] | None:
    """The files the launch's flags name, as start-up will read them: a playbook state file
    (`{file:NAME}`) from the playbook's own bytes (what deploy ships), others as read on the host
    (None: not asked, e.g. offline)."""
    from fleetctl.engines.base import refs

    out: dict[str, bytes | str] = dict(facts.launch_files) if facts is not None and facts.launch_files else {}
    shipped = {f.name: f.data for f in playbook.state_files}
    for value in flags.values():
        names = refs(value)
        if len(names) == 1 and names[0] in shipped and value == "{file:" + names[0] + "}":
            out[value] = shipped[names[0]]
    return out if out or (facts is not None and facts.launch_files is not None) else None


def coverage(version: str, flags: dict[str, Any], env: dict[str, str], playbook: Playbook, *,
             model: ModelConfig | None = None, draft: ModelConfig | None = None, strict: bool = False,
             files: dict[str, bytes | str] | None = None) -> Coverage:
    """Whether the launch runs what the playbook patches, for every family of alternative files the
    launch chooses between (the speculative worker, the model implementation, the attention,
    grammar and sampling backends): a family is checked when the patch changes one of its members,
    or when `covers:` asks for it (`covers.worker` / `covers.families`: true widens, false narrows),
    plus the package files `covers.files` names. A playbook that patches no member of any family gets
    no coverage answer (covered None, nothing refused).
    `model` / `draft`: the target's / draft's config.json as read on the host (None: not read). An
    answer that is not certain is a warning (`uncertain`), refused with `strict`. `files`: the files
    the launch's flags name, as start-up reads them (`named_files`)."""
    cov = _coverage(version, flags, env, playbook, model, files)
    if engine().is_known(version):  # (an unknown release: no wheel is fetched to guess its families)
        _other_families(cov, version, flags, playbook, model, draft)
    layout = {engine().port_flag, *engine().tp_spellings}  # what fleetctl itself adds to every launch
    described = bool(playbook.launch.flags) or any(("--" + k.lstrip("-")) not in layout for k in flags)
    if cov.covered is False and cov.refused and not described:
        # a playbook that names no launch flags says nothing of how its servers are launched: what the
        # bare default launch would run is a warning, not a refusal
        cov.uncertain = _join(cov.uncertain, f"the playbook names no launch flags; launched with none: {cov.refused}")
        cov.refused, cov.covered = None, None
    if cov.uncertain and strict and not cov.refused:
        cov.refused = f"{cov.uncertain} (--strict refuses an answer that is not certain)"
    return cov


def _patches(playbook: Playbook, version: str) -> dict[str, PatchedFile]:
    """The playbook's patched files of `version` as the engine's family checks read them: the lines
    each patch touches and its patched bytes, read with the strict diff engine when first asked."""
    return {f.path: patched_file(version, f.path, f.patch_text) for f in playbook.files_for(version) or []}


def patched_file(version: str, rel: str, patch: bytes) -> PatchedFile:
    return PatchedFile(patch, functools.partial(_touched, version, rel, patch))


def _touched(version: str, rel: str, patch: bytes) -> tuple[frozenset[int], frozenset[int], bytes]:
    """(pristine line numbers the one-file patch removes, patched line numbers it adds, the patched bytes)."""
    from fleetctl.engines import wheels
    from fleetctl.patching.engine import ADDED, REMOVED, apply_patch, parse_patch

    old: set[int] = set()
    new: set[int] = set()
    for fp in parse_patch(patch):
        for h in fp.hunks:
            o, n = h.old_start, h.new_start
            for kind, _ in h.lines:
                if kind == REMOVED:
                    old.add(o)
                    o += 1
                elif kind == ADDED:
                    new.add(n)
                    n += 1
                else:
                    o += 1
                    n += 1
    return frozenset(old), frozenset(new), apply_patch(wheels.pristine_bytes(version, rel), patch, name=rel).output


def _short(paths: list[str] | set[str]) -> str:
    return ", ".join(sorted({p.rsplit("/", 1)[-1] for p in paths}))


def _spec_members(version: str) -> dict[str, str]:
    """Worker class -> file of the release's speculative workers ({} when its code cannot be read)."""
    from fleetctl.errors import FleetctlError

    if not engine().is_known(version):  # no wheel is fetched for a release fleetctl does not know:
        # a file that is a worker in any known release counts as one
        return {c: f for v in engine().known_versions() for c, f in engine().worker_files(v).items()}
    known = engine().worker_files(version)
    try:
        return {**known, **engine().spec_members(version)}
    except (FleetctlError, OSError):
        return known


def _other_families(cov: Coverage, version: str, flags: dict[str, Any], playbook: Playbook,
                    model: ModelConfig | None, draft: ModelConfig | None) -> None:
    """Add the model / attention / grammar / sampling families the patch makes relevant to `cov`."""
    from fleetctl.errors import FleetctlError

    patched = _patches(playbook, version)
    asked = {k: v for k, v in playbook.covers.asked().items() if k != engine().family_names[0]}
    if not patched and not any(asked.values()):
        return
    try:
        checks = engine().family_checks(version, flags, patched, asked, model=model, draft=draft)
    except (FleetctlError, OSError) as e:
        cov.uncertain = _join(cov.uncertain, f"the families of SGLang {version} could not be read from its code "
                                             f"({e}): only the speculative worker is checked")
        return
    if checks and not cov.families:  # the speculative worker is not checked: its routing is not the story
        cov.reason = ""
    for c in checks:
        cov.families.append(c.to_json())
        title = c.to_json()["title"]
        if c.covered is False:
            cov.refused = _join(cov.refused, f"{title}: {c.message}")
            cov.covered = False
        elif c.covered is None:
            cov.uncertain = _join(cov.uncertain, f"{title}: not certain: {c.message}")
        elif cov.covered is None:
            cov.covered = True
        cov.reason = _join(cov.reason, f"{title}: {c.message}") or ""
        cov.notes += [n for n in c.notes if n not in cov.notes]


def _join(a: str | None, b: str) -> str:
    return f"{a}; {b}" if a else b


def _coverage(version: str, flags: dict[str, Any], env: dict[str, str], playbook: Playbook,
              model: ModelConfig | None, files: dict[str, bytes | str] | None = None) -> Coverage:
    res = engine().resolve_worker(version, flags, env, model_arch=model.arch if model else None, files=files)
    patched = {f.path for f in playbook.files_for(version) or []}
    members = _spec_members(version) if patched or playbook.covers.worker else {}
    mine = sorted(patched & set(members.values()))
    need_worker = playbook.covers.checks_worker(bool(mine))
    spec = {"family": engine().family_names[0], "title": "speculative worker", "patched": mine}
    uncertain = None
    if res.known and not res.certain and need_worker:
        if model is not None and model.arch and not model.error:  # read: an override is not modelled exactly
            uncertain = res.reason.split("): ", 1)[0] + ")" if "): " in res.reason else res.reason
        else:
            if model is None and flags.get(engine().model_flag):  # offline (patch check): not read here
                uncertain = (f"not certain offline: the target's config.json decides it (a model-specific "
                             f"override of SGLang {version} is not ruled out)")
            else:
                why = model.error if model is not None and model.error else \
                    f"the launch names no {engine().model_flag}"
                uncertain = f"{engine().not_certain} ({why})"
    if not res.known:
        if not need_worker:
            return Coverage(None, None, None, None, f"SGLang {version} is an unknown version")
        return Coverage(None, None, None, None,
                        f"SGLang {version} is an unknown version: fleetctl cannot tell which worker runs",
                        refused=f"SGLang {version} is not a version fleetctl knows, so it cannot check which "
                                f"worker runs (--allow-uncovered to deploy anyway)")
    if res.startup_error:
        return Coverage(res.worker_class, res.worker_file, res.disable_overlap_schedule, None, res.reason,
                        refused=f"{res.reason}; the server would refuse to start: {res.startup_error}")
    named = list(playbook.covers.files)
    missing = [f for f in named if f not in patched]
    files_reason = ""
    if named:  # (load_playbook already refuses a version that does not patch them)
        files_reason = f"the playbook patches {', '.join(named)}: {'no' if missing else 'yes'}"
    worker_class, worker_file = res.worker_class, res.worker_file
    reason = res.reason
    if need_worker and res.algorithm is not None and worker_file is None:
        # an algorithm routing does not model (NGRAM, ...): the worker module named for it
        cands = engine().other_spec_worker(version, res.algorithm)
        if len(cands) == 1:
            worker_class, worker_file = cands[0]
            reason = f"{version} with speculative algorithm {res.algorithm} -> {worker_class} in {worker_file}"
        else:
            uncertain = _join(uncertain, f"speculative worker: {res.reason}: which worker runs is not modelled"
                                         + (f" (one of {', '.join(c for c, _ in cands)})" if cands else ""))
    if not need_worker:
        reason = reason if not named else (f"{reason}; {files_reason}" if reason else files_reason)
        return Coverage(worker_class, worker_file, res.disable_overlap_schedule,
                        (not missing) if named else None, reason, refused=reason if missing else None,
                        uncertain=uncertain)
    if worker_file is None:
        if res.algorithm is None:  # no speculative decoding: no worker file runs at all
            refused = (f"{res.reason}: the patched {_short(mine)} never runs" if mine else
                       f"{res.reason}, but the playbook's covers.worker asks for one")
            return Coverage(None, None, res.disable_overlap_schedule, False, refused, refused=refused,
                            uncertain=uncertain, families=[{**spec, "runs": [], "covered": False, "message": refused}])
        return Coverage(None, None, res.disable_overlap_schedule, None, reason, uncertain=uncertain,
                        families=[{**spec, "runs": [], "covered": None, "message": reason}])
    covered = worker_file in patched and not missing
    reason = f"{reason}; the playbook patches it: {'yes' if worker_file in patched else 'no'}"
    if worker_file not in patched and mine:
        reason = f"{reason}; your patch changes only {_short(mine)}"
        from fleetctl.plan.intended import intended_data

        fixes = engine().worker_fixes(version, flags, env, set(mine), model_arch=model.arch if model else None,
                                      intended=intended_data(playbook, version))
        fixes.append(f"patch {worker_file} too (fleetctl patch new / patch port)")
        reason = f"{reason}; fix: {' or '.join(fixes)}"
    if named:
        reason += f"; {files_reason}"
    refused = None
    if not covered:
        refused = reason
    else:
        why = playbook.unsupported_workers.get(version, {}).get(worker_class or "")
        if why:
            refused = f"{res.reason}; the playbook does not support {worker_class} on {version}: {why}"
    return Coverage(worker_class, worker_file, res.disable_overlap_schedule, covered, reason, refused,
                    uncertain=uncertain, families=[{**spec, "runs": [worker_file], "covered": worker_file in patched,
                                                    "message": reason}])


def host_coverage(host: Host, facts: HostFacts, playbook: Playbook, *, strict: bool = False) -> Coverage | None:
    if not facts.package_version:
        return None
    flags = launch_flags(host, playbook)
    # the env judged is the server process's after its interpreter's start-up hooks ran
    cov = coverage(facts.package_version, flags, facts.judged_env(launch_env(host, playbook)), playbook,
                   model=facts.model, draft=getattr(facts, "draft_model", None), strict=strict,
                   files=named_files(facts, playbook, flags))
    hooks = facts.hook_notes([k for k in facts.env_changes if k.startswith(engine().routing_env_prefixes)])
    if hooks:
        cov.reason = f"{cov.reason} ({'; '.join(hooks)})"
        if cov.refused:
            cov.refused = f"{cov.refused} ({'; '.join(hooks)})"
    # the code import loads for the worker must come from the source fleetctl patches: a compiled
    # extension module or sourceless bytecode in its place is never patched (a stale cached pyc is:
    # deploy removes it with the file)
    # (for each file the playbook declares it covers: the running worker's, and named ones)
    checked = any(c.get("family") == engine().family_names[0] for c in cov.families)
    covered = ([cov.worker_file] if cov.worker_file and checked else []) + list(playbook.covers.files)
    for rel in covered:
        if facts.bytecode_loader(rel) in ("extension", "sourceless") and not cov.refused:
            cov.refused = facts.bytecode_problem(rel)
    # every file the playbook patches must be what the launch imports for that module (a start-up
    # hook's meta-path finder serving other code, a module preloaded at start, another file)
    for pf in playbook.files_for(facts.package_version) or []:
        why = facts.module_problem(pf.path)
        if why and not cov.refused:
            cov.refused = why
    return cov
