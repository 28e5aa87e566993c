"""Container hosts without a runtime: the inventory's `container:` checks, the runtime argv each
runtime gets, how the layers compose (container inside, become outside), and what fleetctl keeps
of an inspect answer (hostile ones refused). The real docker runs are in tests/test_containers.py."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleetctl.cli import main
from fleetctl.config.containers import ContainerSpec
from fleetctl.config.inventory import load_inventory
from fleetctl.containers.inspect import ContainerError, parse
from fleetctl.transport.layers import remote_argv
from fleetctl.transport.session import agent_command


def inv(tmp_path: Path, container: str) -> Path:
    p = tmp_path / "inv.yaml"
    p.write_text(f"hosts:\n  a:\n    address: 127.0.0.1\n    container: {container}\n")
    return p


def host(tmp_path: Path, container: str) -> Any:
    return load_inventory(inv(tmp_path, container)).hosts[0]


def test_runtime_argv_of_each_runtime(tmp_path: Path) -> None:
    d = ContainerSpec.of(host(tmp_path, "{runtime: docker, name: sglang, user: 'root:root'}").container)
    assert d is not None
    assert d.exec_prefix() == ["docker", "exec", "-i", "-u", "root:root", "sglang"]
    assert d.inspect_argv() == ["docker", "inspect", "--type", "container", "sglang"]
    assert d.restart_argv() == ["docker", "restart", "sglang"]
    p = ContainerSpec.of(host(tmp_path, "{runtime: podman, name: s1, command: 'podman --remote'}").container)
    assert p is not None and p.exec_prefix() == ["podman", "--remote", "exec", "-i", "s1"]
    k = ContainerSpec.of(host(tmp_path, "{runtime: kubectl, name: sglang-0, container: server, namespace: llm, "
                                        "context: prod}").container)
    assert k is not None
    assert k.exec_prefix() == ["kubectl", "--context", "prod", "-n", "llm", "exec", "-i", "sglang-0", "-c", "server",
                               "--"]
    assert k.inspect_argv() == ["kubectl", "--context", "prod", "-n", "llm", "get", "pod", "sglang-0", "-o", "json"]
    assert k.restart_argv() is None  # a pod's container restarted by Kubernetes starts from its image
    assert k.label == "kubectl pod llm/sglang-0 (container server)"


def test_the_agent_runs_inside_the_container_and_become_wraps_the_runtime(tmp_path: Path) -> None:
    h = host(tmp_path, "{runtime: docker, name: sglang}")
    h = replace(h, env={"SGLANG_ENABLE_SPEC_V2": "1"})
    argv, _ = agent_command(h)
    # the env reaches the agent inside the container (docker exec passes the client's env to no one)
    assert argv[:6] == ["docker", "exec", "-i", "sglang", "env", "SGLANG_ENABLE_SPEC_V2=1"], argv[:6]
    assert argv[6:8] == ["python3", "-c"] and "-t" not in argv[:4] and "--tty" not in argv
    assert remote_argv(h, ["docker", "inspect", "x"], inside=False) == ["docker", "inspect", "x"]
    b = replace(h, become=True)
    argv, data = agent_command(b)
    assert argv[:10] == ["sudo", "-n", "-H", "-u", "root", "--", "docker", "exec", "-i", "sglang"], argv[:10]
    assert argv[10:12] == ["python3", "-c"]  # (through become the env goes over stdin)
    assert b"SGLANG_ENABLE_SPEC_V2" in data
    assert remote_argv(b, ["docker", "inspect", "x"], inside=False)[:6] == ["sudo", "-n", "-H", "-u", "root", "--"]
    # one shell word per argv word: a name is never pasted into a shell raw
    assert shlex.split(shlex.join(argv)) == argv


BAD = [
    ("{runtime: lxc, name: a}", r"hosts.a.container.runtime: .*docker.*podman.*kubectl"),
    ("{runtime: docker, name: '-rm'}", r"hosts.a.container.name: .*not a container or pod name"),
    ("{runtime: docker, name: 'a;b'}", r"hosts.a.container.name: .*not a container or pod name"),
    ("{runtime: docker, name: a, namespace: llm}", r"hosts.a.container: .*namespace: for kubectl only"),
    ("{runtime: kubectl, name: a, user: root}", r"hosts.a.container: .*kubectl exec has no user option"),
    ("{runtime: docker, name: a, command: ''}", r"hosts.a.container.command: .*name the runtime's client"),
    ("{runtime: docker}", r"hosts.a.container.name: missing"),
]


@pytest.mark.parametrize(("text", "pattern"), BAD)
def test_bad_container_keys_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            text: str, pattern: str) -> None:
    code = main(["facts", "-i", str(inv(tmp_path, text))])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and re.search(r"inv.yaml:\d+: " + pattern, lines[0]), err
    assert "Traceback" not in err


DOCKER = {  # the fields fleetctl reads, as `docker inspect` (Engine 20.10, tests/test_containers.py) prints them
    "Id": "46d0bb5bd22762bab6659e47e83b8aeb85f7c959f021bde4bda0707078ba3a37",
    "Name": "/sglang", "Image": "sha256:16d2c22be10e71c1986d48e2505424263d0fa391bcc047813efd2327025615a3",
    "State": {"Status": "running", "Running": True, "Pid": 13374, "StartedAt": "2026-12-02T11:31:03.8685465Z"},
    "Config": {"Image": "lmsysorg/sglang:v0.5.9-cu129"},
    "HostConfig": {"ReadonlyRootfs": False},
    "Mounts": [{"Type": "volume", "Source": "/var/lib/docker/volumes/st/_data", "Destination": "/var/lib/fleetctl",
                "RW": True}, {"Type": "bind", "Source": "/usr", "Destination": "/usr", "RW": False}],
}


def _docker(**over: Any) -> bytes:
    return json.dumps([{**DOCKER, **over}]).encode()


def test_inspect_docker_answer() -> None:
    spec = ContainerSpec("docker", "sglang", ("docker",))
    c = parse("h", spec, _docker())
    assert (c.id, c.image, c.running, c.read_only, c.started_at) == (
        DOCKER["Id"], "lmsysorg/sglang:v0.5.9-cu129", True, False, "2026-12-02T11:31:03.8685465Z")
    assert c.short_id == "46d0bb5bd227"
    assert c.mount_of("/var/lib/fleetctl/deploys/x") is not None and c.mount_of("/var/lib/fleetctlx") is None
    assert c.mount_of("/root/.fleetctl") is None
    assert c.mount_of("/usr/lib").read_only  # type: ignore[union-attr]


def test_inspect_kubectl_pod() -> None:
    """A Pod as the Kubernetes API (core/v1) describes it: the named container's status."""
    pod = {"kind": "Pod", "metadata": {"name": "sglang-0", "uid": "u1"},
           "spec": {"containers": [
               {"name": "sidecar", "image": "busybox"},
               {"name": "server", "image": "lmsysorg/sglang:v0.5.9",
                "securityContext": {"readOnlyRootFilesystem": True},
                "volumeMounts": [{"name": "state", "mountPath": "/var/lib/fleetctl"}]}]},
           "status": {"containerStatuses": [
               {"name": "server", "containerID": "containerd://" + "ab" * 32, "image": "docker.io/lmsysorg/sglang:v0.5.9",
                "imageID": "docker.io/lmsysorg/sglang@sha256:" + "cd" * 32, "restartCount": 2,
                "state": {"running": {"startedAt": "2026-12-02T10:00:00Z"}}}]}}
    spec = ContainerSpec("kubectl", "sglang-0", ("kubectl",), container="server")
    c = parse("h", spec, json.dumps(pod).encode())
    assert (c.id, c.running, c.read_only, c.restarts, c.short_id) == ("containerd://" + "ab" * 32, True, True, 2,
                                                                       "ab" * 6)
    assert c.mount_of("/var/lib/fleetctl") is not None
    with pytest.raises(ContainerError, match="no container 'web'"):
        parse("h", replace(spec, container="web"), json.dumps(pod).encode())


@pytest.mark.parametrize(("answer", "why"), [
    (b"not json", "not one it gives"),
    (json.dumps([DOCKER, DOCKER]).encode(), "2 containers answered"),
    (_docker(Id="../../etc"), "Id is not a container id"),
    (_docker(Config={"Image": "[bold red]x[/]\x1b[2J"}), "Config.Image is not a short printable string"),
    (_docker(Config={"Image": "a" * 5000}), "Config.Image is not a short printable string"),
    (_docker(Mounts=[{"Destination": "/x", "RW": "yes"}]), "Mounts\\[\\].RW is not true/false"),
    (_docker(Mounts=[{"Destination": f"/m{i}"} for i in range(300)]), "too many"),
    (b"[" * 100000 + b"]" * 100000, "not one it gives"),
])
def test_a_hostile_inspect_answer_is_one_line(answer: bytes, why: str) -> None:
    with pytest.raises(ContainerError, match=why) as e:
        parse("h1", ContainerSpec("docker", "sglang", ("docker",)), answer)
    assert str(e.value).startswith("h1: docker container sglang: ") and "\n" not in str(e.value)


def test_ansible_inventories_name_the_container_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "hosts.yml"
    p.write_text("all:\n  hosts:\n    gpu-c:\n      ansible_host: 127.0.0.1\n"
                 "      fleetctl_container: {runtime: docker, name: sglang}\n")
    (h,) = load_inventory(p).hosts
    assert h.container == {"runtime": "docker", "name": "sglang", "main_process": False}, h.container
    ini = tmp_path / "hosts.ini"
    ini.write_text("gpu-d ansible_connection=community.docker.docker\n")
    assert main(["facts", "-i", str(ini)]) == 2
    err = capsys.readouterr().err
    assert ("ansible_connection=community.docker.docker: fleetctl reaches a container through SSH to the machine "
            "that runs it") in err and "fleetctl_container={runtime: docker, name: CONTAINER}" in err, err


@pytest.mark.parametrize(("args", "said"), [
    (["playbooks/dynamic-spec-disable", "--sglang", "0.4.0"], "the playbook has no patches for sglang 0.4.0"),
    (["playbooks/dynamic-spec-disable", "--sglang", "0.5.9", "--package-dir", "rel"], "an absolute path in the image"),
    (["playbooks/adaptive-spec", "--sglang", "0.5.14"], "patches no file of sglang 0.5.14: nothing to build"),
])
def test_patch_dockerfile_refusals(args: list[str], said: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parent.parent
    args = [str(root / args[0]), *args[1:]]
    assert main(["patch", "dockerfile", *args, "-o", str(tmp_path / "ctx")]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err, err
    assert not (tmp_path / "ctx").exists()


def test_main_process_log_times() -> None:
    """The runtimes' RFC 3339 times (inspect's StartedAt, `logs --timestamps`) as epoch seconds; anything
    else is no time (its line is not counted)."""
    from fleetctl.containers.mainproc import epoch

    assert epoch("2026-12-02T13:01:01.46346526Z") == pytest.approx(1796216461.46346526)
    assert epoch("2026-12-02T14:01:01.5+01:00") == pytest.approx(1796216461.5)  # podman: the local offset
    assert epoch("2026-12-02T13:01:01Z") == 1796216461
    for bad in ("", None, "1796216461", "2026-12-02 13:01:01", "2026-12-02T13:01:01.1234567890Z", "x" * 50,
                "2026-13-02T13:01:01Z"):
        assert epoch(bad) is None, bad


def test_a_pods_main_process_is_not_restarted() -> None:
    """A pod's container restarted by Kubernetes starts from its image: fleetctl refuses to restart it
    (launch, deploy --restart) with that reason; docker and podman restart the container."""
    from fleetctl.containers.mainproc import refusal

    pod = ContainerSpec("kubectl", "sglang-0", ("kubectl",), container="server", main_process=True)
    why = refusal(pod)
    assert why is not None and "starts it from its image" in why and "fleetctl patch dockerfile" in why, why
    for rt in ("docker", "podman"):
        assert refusal(ContainerSpec(rt, "sglang", (rt,), main_process=True)) is None
