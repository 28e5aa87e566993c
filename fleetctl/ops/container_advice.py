"""What fleetctl says about a container host: a read-only root (refused, with the image route), a
state dir that dies with the container, a container re-created since the deploy."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from fleetctl.config.containers import ContainerSpec

if TYPE_CHECKING:
    from fleetctl.config.playbook_model import Playbook
    from fleetctl.containers.inspect import ContainerInfo
    from fleetctl.model.facts import HostFacts

IMAGE_CONTEXT = "fleetctl-image"  # the build context dir the printed `patch dockerfile` writes


def dockerfile_command(playbook: Playbook, version: str | None, package_dir: str | None) -> str:
    """The `fleetctl patch dockerfile` command line for this playbook, release and package dir."""
    argv = ["fleetctl", "patch", "dockerfile", str(playbook.path)]
    if version:
        argv += ["--sglang", version]
    if package_dir:
        argv += ["--package-dir", package_dir]
    return shlex.join([*argv, "-o", IMAGE_CONTEXT])


def read_only_refusal(host: str, facts: HostFacts, playbook: Playbook) -> str:
    box = facts.container
    assert box is not None
    return (f"{host}: {_label(box)} has a read-only root filesystem (image {box.image}): the patch cannot be "
            f"written into it, and a patch written into a container is lost when it is re-created anyway; "
            f"build it into the image: '{dockerfile_command(playbook, facts.package_version, facts.package_dir)}' "
            f"writes the patched files and prints the Dockerfile lines")


def state_dir_warning(facts: HostFacts) -> str | None:
    """None when the state dir is on a mounted volume of the container (or cannot be told)."""
    box = facts.container
    sd = facts.state.state_dir if facts.state else None
    if box is None or not sd or not sd.startswith("/"):
        return None
    if box.mount_of(sd) is not None:
        return None
    return (f"state dir {sd} is on {_label(box)}'s own filesystem: the deploy's records and backups die with "
            f"the container (rollback then has nothing to restore); mount a volume there "
            f"(docker run -v fleetctl-state:{sd} ...) or set state_dir to a mounted path")


def main_process_warning(spec: ContainerSpec | None) -> str | None:
    """A pod whose main process is the server: a restart by Kubernetes starts its container from the
    image, so a patch written into it never runs there."""
    if spec is None or not spec.main_process or spec.restart_argv() is not None:
        return None
    return (f"the server is {spec.label}'s main process, and a restart of a pod's container starts it from its "
            f"image: the patch would never run; build it into the image ('fleetctl patch dockerfile')")


def recreated(host: str, now: ContainerInfo, deploy_id: str, record: dict[str, Any]) -> str | None:
    """The line saying the container is not the one deploy `deploy_id` patched (None: it is)."""
    was = str(record.get("id") or "")
    if not was or was == now.id or record.get("name") != now.name:
        return None
    started = f", started {now.started_at}" if now.started_at else ""
    return (f"{host}: {_label(now)} was re-created since deploy {deploy_id} (container {was.split('://')[-1][:12]} "
            f"then, {now.short_id} now{started}, image {now.image}): what that deploy patched was in the old "
            f"container; 'fleetctl deploy' patches this one (or build the patch into the image: "
            f"'fleetctl patch dockerfile')")


def _label(box: ContainerInfo) -> str:
    return ContainerSpec(box.runtime, box.name, (box.runtime,)).label


def recreated_per_ledger(host: str, now: ContainerInfo) -> str | None:
    """When the host's records say nothing (its state dir died with the old container): this
    controller's ledger, if its newest change of `host` was a deploy that recorded another container."""
    try:
        from fleetctl.ops.ledger import Ledger

        led = Ledger()
        try:
            got = led.last_change(host)
        finally:
            led.close()
    except Exception:  # (no ledger, or one of another layout: nothing to say)
        return None
    if got is None or got[1] != "deploy" or not isinstance(got[2], dict):
        return None
    rec = got[2].get("container")
    if not isinstance(rec, dict):
        return None
    line = recreated(host, now, got[0], rec)
    if line is None:
        return None
    return line + ("; that deploy's records and backups were on the old container's own filesystem and went with "
                   "it (this controller's ledger says so): put state_dir on a mounted volume")
