"""What the runtime says about a host's container, read on the host outside the container.

`docker inspect` / `podman inspect` (a JSON list of one object) or `kubectl get pod -o json` (the
pod; its container's status by name). Untrusted like everything a host sends: bounded in size
(the transport's cap), parsed as JSON only, every field checked for type and length, and only
the fields below kept. Anything else is a ContainerError naming the host and the command.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.containers import ContainerSpec
from fleetctl.errors import FleetctlError

INSPECT_CAP = 4 << 20  # bytes of inspect output (a pod with many containers stays far below)
TEXT_MAX = 512  # longest string kept from an answer (image references, paths)
MOUNTS_MAX = 256
_ID_RE = re.compile(r"^(?:[a-z0-9]+://)?[0-9a-f]{12,128}$")  # docker/podman id, or kubectl's containerd://<hex>
_TEXT_RE = re.compile(r"^[\x20-\x7e]*$")  # printable ASCII: image refs, paths, timestamps


class ContainerError(FleetctlError):
    """The container could not be inspected (missing, stopped, the runtime refused, malformed answer)."""

    reference = "container-unavailable"


@dataclass(frozen=True)
class Mount:
    destination: str
    kind: str  # bind | volume | tmpfs | ... (kubectl: the volume's name)
    read_only: bool


@dataclass
class ContainerInfo:
    runtime: str
    name: str
    id: str  # docker/podman: the container id; kubectl: the container's id in the pod (changes on restart)
    image: str  # the image reference it was created from
    image_id: str | None
    started_at: str | None
    running: bool
    read_only: bool  # its root filesystem is read-only
    restarts: int | None = None  # kubectl: restartCount
    mounts: list[Mount] = field(default_factory=list)

    @property
    def short_id(self) -> str:
        return self.id.split("://")[-1][:12]

    def record(self) -> dict[str, Any]:
        """What a deploy records of the container (the manifest's `container`)."""
        return {"runtime": self.runtime, "name": self.name, "id": self.id, "image": self.image,
                "image_id": self.image_id, "started_at": self.started_at}

    def to_json(self) -> dict[str, Any]:
        return {**self.record(), "running": self.running, "read_only": self.read_only, "restarts": self.restarts,
                "mounts": [{"destination": m.destination, "kind": m.kind, "read_only": m.read_only}
                           for m in self.mounts]}

    def mount_of(self, path: str) -> Mount | None:
        """The mount that holds the absolute path `path` inside the container (the longest prefix);
        None: it lies on the container's own root filesystem (dies with the container)."""
        best: Mount | None = None
        for m in self.mounts:
            d = m.destination.rstrip("/") or "/"
            if d != "/" and (path == d or path.startswith(d + "/")):
                if best is None or len(d) > len(best.destination.rstrip("/")):
                    best = m
        return best


def _text(v: Any, what: str, *, optional: bool = False) -> str | None:
    if v is None or v == "":
        if optional:
            return None
        raise ValueError(f"{what} is missing")
    if not isinstance(v, str) or len(v) > TEXT_MAX or not _TEXT_RE.match(v):
        raise ValueError(f"{what} is not a short printable string")
    return v


def _bool(v: Any, what: str) -> bool:
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ValueError(f"{what} is not true/false")
    return v


def _mounts(items: Any, conv: Any) -> list[Mount]:
    if items is None:
        return []
    if not isinstance(items, list) or len(items) > MOUNTS_MAX:
        raise ValueError("mounts are not a list (or too many)")
    return [conv(m) for m in items]


def _docker(spec: ContainerSpec, doc: Any) -> ContainerInfo:
    if isinstance(doc, list):
        if len(doc) != 1:
            raise ValueError(f"{len(doc)} containers answered, not 1")
        doc = doc[0]
    if not isinstance(doc, dict):
        raise ValueError("not an object")
    cid = _text(doc.get("Id"), "Id")
    assert cid is not None
    if not _ID_RE.match(cid):
        raise ValueError("Id is not a container id")
    state = doc.get("State") if isinstance(doc.get("State"), dict) else {}
    cfg = doc.get("Config") if isinstance(doc.get("Config"), dict) else {}
    hc = doc.get("HostConfig") if isinstance(doc.get("HostConfig"), dict) else {}
    image = _text(cfg.get("Image") or doc.get("ImageName"), "Config.Image", optional=True) \
        or _text(doc.get("Image"), "Image")
    running = state.get("Running")

    def mount(m: Any) -> Mount:
        if not isinstance(m, dict):
            raise ValueError("a mount is not an object")
        dest = _text(m.get("Destination"), "Mounts[].Destination")
        assert dest is not None
        return Mount(dest, _text(m.get("Type"), "Mounts[].Type", optional=True) or "?",
                     not _bool(m.get("RW"), "Mounts[].RW"))

    return ContainerInfo(runtime=spec.runtime, name=spec.name, id=cid, image=image or "?",
                         image_id=_text(doc.get("Image"), "Image", optional=True),
                         started_at=_text(state.get("StartedAt"), "State.StartedAt", optional=True),
                         running=_bool(running, "State.Running"),
                         read_only=_bool(hc.get("ReadonlyRootfs"), "HostConfig.ReadonlyRootfs"),
                         mounts=_mounts(doc.get("Mounts"), mount))


def _kubectl(spec: ContainerSpec, doc: Any) -> ContainerInfo:
    if not isinstance(doc, dict) or doc.get("kind") != "Pod":
        raise ValueError("not a Pod")
    pod_spec = doc.get("spec") if isinstance(doc.get("spec"), dict) else {}
    status = doc.get("status") if isinstance(doc.get("status"), dict) else {}
    containers = pod_spec.get("containers") if isinstance(pod_spec.get("containers"), list) else []
    if not containers:
        raise ValueError("the pod has no containers")
    want = spec.container or (containers[0].get("name") if isinstance(containers[0], dict) else None)
    c = next((c for c in containers if isinstance(c, dict) and c.get("name") == want), None)
    if c is None:
        raise ValueError(f"the pod has no container {want!r}")
    statuses = status.get("containerStatuses") if isinstance(status.get("containerStatuses"), list) else []
    st = next((s for s in statuses if isinstance(s, dict) and s.get("name") == want), {})
    cid = _text(st.get("containerID"), "containerStatuses[].containerID")
    assert cid is not None
    if not _ID_RE.match(cid):
        raise ValueError("containerID is not a container id")
    state = st.get("state") if isinstance(st.get("state"), dict) else {}
    running = state.get("running") if isinstance(state.get("running"), dict) else None
    sc = c.get("securityContext") if isinstance(c.get("securityContext"), dict) else {}
    restarts = st.get("restartCount")
    if restarts is not None and (not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0):
        raise ValueError("restartCount is not a count")

    def mount(m: Any) -> Mount:
        if not isinstance(m, dict):
            raise ValueError("a volumeMount is not an object")
        dest = _text(m.get("mountPath"), "volumeMounts[].mountPath")
        assert dest is not None
        return Mount(dest, _text(m.get("name"), "volumeMounts[].name", optional=True) or "?",
                     _bool(m.get("readOnly"), "volumeMounts[].readOnly"))

    return ContainerInfo(runtime=spec.runtime, name=spec.name, id=cid,
                         image=_text(st.get("image") or c.get("image"), "image") or "?",
                         image_id=_text(st.get("imageID"), "imageID", optional=True),
                         started_at=_text(running.get("startedAt"), "startedAt", optional=True) if running else None,
                         running=running is not None,
                         read_only=_bool(sc.get("readOnlyRootFilesystem"), "readOnlyRootFilesystem"),
                         restarts=restarts, mounts=_mounts(c.get("volumeMounts"), mount))


def parse(host: str, spec: ContainerSpec, out: bytes) -> ContainerInfo:
    """The runtime's answer `out` as a ContainerInfo; ContainerError naming what is wrong."""
    try:
        doc = json.loads(out.decode("utf-8"))
        return _kubectl(spec, doc) if spec.runtime == "kubectl" else _docker(spec, doc)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ContainerError(f"{host}: {spec.label}: the runtime's inspect answer is not one it gives: {e}",
                             hint=f"run '{spec.shown(spec.inspect_argv())}' on the host to see it") from None
