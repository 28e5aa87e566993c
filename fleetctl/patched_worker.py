"""Does the playbook patch the worker that will actually run? (the origin story's question)

The launch environment considered is exactly what `fleetctl launch` will pass: the playbook's
launch env plus the inventory's env for the host — never the controller's own environment.
All SGLang knowledge comes from the engine (fleetctl/engine.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetctl.config.inventory import Host
from fleetctl.config.playbook import Playbook
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
    """`model`: the target's config.json as read on the host (None: not read). An answer a
    model-specific override could change is a warning (`uncertain`), refused with `strict`."""
    cov = _coverage(version, flags, env, playbook, model)
    if cov.uncertain and strict and not cov.refused:
        cov.refused = f"{cov.uncertain} (--strict refuses an answer that is not certain)"
    return cov


def _coverage(version: str, flags: dict[str, Any], env: dict[str, str], playbook: Playbook,
              model: ModelConfig | None) -> Coverage:
    res = engine().resolve_worker(version, flags, env, model_arch=model.arch if model else None)
    uncertain = None
    if res.known and not res.certain:
        why = model.error if model is not None and model.error else "the launch names no --model-path"
        uncertain = f"{engine().not_certain} ({why})"
    if not res.known:
        return Coverage(None, None, None, None,
                        f"SGLang {version} is an unknown version: fleetctl cannot tell which worker runs",
                        refused=f"SGLang {version} is not a version fleetctl knows, so it cannot check which "
                                f"worker runs (--allow-uncovered to deploy anyway)")
    if res.startup_error:
        return Coverage(res.worker_class, res.worker_file, res.disable_overlap_schedule, None, res.reason,
                        refused=f"{res.reason}; the server would refuse to start: {res.startup_error}")
    if res.worker_file is None:
        return Coverage(None, None, res.disable_overlap_schedule, None, res.reason, uncertain=uncertain)
    files = playbook.files_for(version) or []
    patched = {f.path for f in files}
    covered = res.worker_file in patched
    reason = f"{res.reason}; the playbook patches it: {'yes' if covered else 'no'}"
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
    if cov.worker_file and facts.bytecode_loader(cov.worker_file) in ("extension", "sourceless") and not cov.refused:
        cov.refused = facts.bytecode_problem(cov.worker_file)
    return cov
