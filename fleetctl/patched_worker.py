"""Does the playbook patch what it declares it must cover (`covers:`), e.g. the worker that will
actually run (the origin story's question)?

The launch environment considered is exactly what `fleetctl launch` will pass: the playbook's
launch env plus the inventory's env for the host — never the controller's own environment.
All SGLang knowledge comes from the engine (fleetctl/engine.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetctl.config.hosts import Host
from fleetctl.config.playbook_model import Playbook
from fleetctl.deploy_plan import Coverage
from fleetctl.facts import HostFacts

if TYPE_CHECKING:
    from fleetctl.engine import ModelConfig
from fleetctl.engine import engine


def instances(host: Host, playbook: Playbook) -> list[Any]:
    """The server instances `fleetctl launch` would start on the host (same code path as launch)."""
    from fleetctl.instances import plan_instances

    return plan_instances(host, playbook.launch)


def launch_flags(host: Host, playbook: Playbook) -> dict[str, Any]:
    """The flags of the host's first instance, exactly as launch builds them."""
    return dict(instances(host, playbook)[0].flags)


def launch_env(host: Host, playbook: Playbook) -> dict[str, str]:
    """The environment the launch's python sees (playbook env + inventory env + what an `env` prefix
    in the launch command sets), never the controller's."""
    return dict(instances(host, playbook)[0].effective_env)


def coverage(version: str, flags: dict[str, Any], env: dict[str, str], playbook: Playbook, *,
             model: ModelConfig | None = None, strict: bool = False) -> Coverage:
    """Whether the playbook covers what it declares it must (`covers:`): the speculative worker the
    launch runs (`covers.worker`) and/or named package files (`covers.files`).
    `model`: the target's config.json as read on the host (None: not read). An answer a
    model-specific override could change is a warning (`uncertain`), refused with `strict`."""
    cov = _coverage(version, flags, env, playbook, model)
    if cov.uncertain and strict and not cov.refused:
        cov.refused = f"{cov.uncertain} (--strict refuses an answer that is not certain)"
    return cov


def _coverage(version: str, flags: dict[str, Any], env: dict[str, str], playbook: Playbook,
              model: ModelConfig | None) -> Coverage:
    need_worker = playbook.covers.worker
    res = engine().resolve_worker(version, flags, env, model_arch=model.arch if model else None)
    uncertain = None
    if res.known and not res.certain and need_worker:
        if model is not None and model.arch and not model.error:  # read: an override is not modelled exactly
            uncertain = res.reason.split("): ", 1)[0] + ")" if "): " in res.reason else res.reason
        else:
            why = model.error if model is not None and model.error else "the launch names no --model-path"
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
    patched = {f.path for f in playbook.files_for(version) or []}
    named = list(playbook.covers.files)
    missing = [f for f in named if f not in patched]
    if named:  # (load_playbook already refuses a version that does not patch them)
        files_reason = f"the playbook patches {', '.join(named)}: {'no' if missing else 'yes'}"
    if res.worker_file is None or not need_worker:
        reason = res.reason if not named else (f"{res.reason}; {files_reason}" if res.reason else files_reason)
        return Coverage(res.worker_class, res.worker_file, res.disable_overlap_schedule,
                        (not missing) if named else None, reason, refused=reason if missing else None,
                        uncertain=uncertain)
    covered = res.worker_file in patched and not missing
    reason = f"{res.reason}; the playbook patches it: {'yes' if res.worker_file in patched else 'no'}"
    if named:
        reason += f"; {files_reason}"
    refused = None
    if not covered:
        refused = reason
    else:
        why = playbook.unsupported_workers.get(version, {}).get(res.worker_class or "")
        if why:
            refused = f"{res.reason}; the playbook does not support {res.worker_class} on {version}: {why}"
    return Coverage(res.worker_class, res.worker_file, res.disable_overlap_schedule, covered, reason, refused,
                    uncertain=uncertain)


def host_coverage(host: Host, facts: HostFacts, playbook: Playbook, *, strict: bool = False) -> Coverage | None:
    if not facts.package_version:
        return None
    cov = coverage(facts.package_version, launch_flags(host, playbook), launch_env(host, playbook), playbook,
                   model=facts.model, strict=strict)
    # the code import loads for the worker must come from the source fleetctl patches: a compiled
    # extension module or sourceless bytecode in its place is never patched (a stale cached pyc is:
    # deploy removes it with the file)
    # (for each file the playbook declares it covers: the running worker's, and named ones)
    covered = ([cov.worker_file] if cov.worker_file and playbook.covers.worker else []) + list(playbook.covers.files)
    for rel in covered:
        if facts.bytecode_loader(rel) in ("extension", "sourceless") and not cov.refused:
            cov.refused = facts.bytecode_problem(rel)
    return cov
