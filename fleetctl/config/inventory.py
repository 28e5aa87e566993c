"""The inventory: which hosts exist, how to reach them, and what runs SGLang there.

    ssh_config: ./ssh_config          # optional; host names may be its Host aliases
    defaults: {user: root, port: 22, python: python3}
    groups:   {h200: {flags: {...}, env: {...}}}   # launch overrides per group
    hosts:
      gpu-a: {address: 10.1.230.174, gpus: 8, groups: [h200]}

Host values override group values, which override `defaults`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleetctl.config.hosts import (
    DEFAULT_HOST_TIMEOUT,
    DEFAULT_MAX_ANSWER_BYTES,
    FLAG_RE,
    Host,
    Inventory,
    resolve_path,
)
from fleetctl.config.yamlpos import YamlDoc, load_yaml, validate
from fleetctl.errors import InputError

HOST_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class SecretValue(Strict):
    """An environment value that is passed to the host but never printed or logged."""

    value: str
    secret: bool = True


EnvValue = str | int | float | bool | SecretValue


ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_env(v: dict[str, Any] | None) -> dict[str, Any] | None:
    for k, val in (v or {}).items():
        if not ENV_NAME_RE.match(k):
            raise ValueError(f"environment variable name {k!r} is not a valid name (letters, digits, _)")
        text = val.value if isinstance(val, SecretValue) else str(val)
        if "\0" in text:
            raise ValueError(f"environment value of {k} holds a NUL byte")
    return v


def check_flags(v: dict[str, Any] | None) -> dict[str, Any] | None:
    for k, val in (v or {}).items():
        if not FLAG_RE.match(k):
            raise ValueError(f"flag {k!r} must look like --some-flag")
        if isinstance(val, (dict, list)):
            raise ValueError(f"flag {k} must have a scalar value (string, number, true/false)")
    return v


def check_become_method(v: str | None) -> str | None:
    from fleetctl.config.hosts import BECOME_METHODS, BECOME_UNSUPPORTED

    if v is not None and v not in BECOME_METHODS:
        why = BECOME_UNSUPPORTED.get(v, "unknown become method")
        raise ValueError(f"{v}: not supported: {why} (use become_method: sudo, the only one fleetctl runs, "
                         "with a sudoers rule for the interpreter)")
    return v


def check_become_user(v: str | None) -> str | None:
    from fleetctl.config.hosts import BECOME_USER_RE

    if v is not None and not BECOME_USER_RE.match(v):
        raise ValueError(f"{v!r} is not a user name (e.g. root)")
    return v
class ContainerFields(Strict):
    """`container:` of a host: SGLang runs in this container on the host (fleetctl.containers)."""

    runtime: Literal["docker", "podman", "kubectl"]
    name: str  # the container (docker, podman) or the pod (kubectl)
    container: str | None = None  # kubectl: the pod's container (-c)
    namespace: str | None = None  # kubectl: -n
    context: str | None = None  # kubectl: --context
    user: str | None = None  # docker/podman: exec -u USER[:GROUP]
    # the runtime's client as run on the host (default: the runtime's name), e.g. "docker -H unix:///run/d.sock"
    command: str | list[str] | None = None
    main_process: bool = False  # the SGLang server is the container's main process

    @field_validator("name", "container")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        from fleetctl.config.containers import NAME_RE

        if v is not None and not NAME_RE.match(v):
            raise ValueError(f"{v!r} is not a container or pod name (letters, digits, _ . -; not starting with -)")
        return v

    @field_validator("namespace", "context")
    @classmethod
    def _kube_word(cls, v: str | None) -> str | None:
        if v is not None and (not v or v.startswith("-") or any(c.isspace() for c in v)):
            raise ValueError(f"{v!r} is not a Kubernetes name (no spaces, not starting with -)")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str | None) -> str | None:
        from fleetctl.config.containers import USER_RE

        if v is not None and not USER_RE.match(v):
            raise ValueError(f"{v!r} is not a user[:group] name or id")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str] | None) -> str | list[str] | None:
        import shlex

        words = shlex.split(v) if isinstance(v, str) else v
        if words is not None and (not words or any(not w or "\0" in w for w in words)):
            raise ValueError("command must name the runtime's client (e.g. 'docker' or 'podman --remote')")
        return v

    def resolved(self) -> dict[str, Any]:
        import shlex

        d = self.model_dump(exclude_none=True)
        if self.command is not None:
            d["command"] = shlex.split(self.command) if isinstance(self.command, str) else list(self.command)
        if self.runtime != "kubectl":
            bad = [k for k in ("container", "namespace", "context") if k in d]
            if bad:
                raise ValueError(f"{', '.join(bad)}: for kubectl only (runtime is {self.runtime})")
        elif self.user is not None:
            raise ValueError("user: kubectl exec has no user option (the pod's securityContext decides)")
        return d


class HostFields(Strict):
    """Keys allowed both in `defaults:` and in a host entry."""

    address: str | None = None
    port: Annotated[int, Field(ge=1, le=65535)] | None = None
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    python: str | None = None
    sglang_dir: str | None = None
    state_dir: str | None = None
    env: dict[str, EnvValue] | None = None
    flags: dict[str, Any] | None = None
    launch_command: str | None = None
    gpus: int | list[int] | None = None
    groups: list[str] | None = None
    connect_timeout: Annotated[float, Field(gt=0)] | None = None
    command_timeout: Annotated[float, Field(gt=0)] | None = None
    host_timeout: Annotated[float, Field(gt=0)] | None = None
    max_answer_bytes: Annotated[int, Field(ge=1024)] | None = None
    # deploy's coverage check also asks the host's own SGLang (`explain --probe`) before changing anything
    probe: bool | None = None
    # how the agent reaches the host: ssh (default), or local (this machine, no SSH: the agent runs as a
    # subprocess of `python`; Ansible's `connection: local`), e.g. a GPU box that runs fleetctl itself
    connection: Literal["ssh", "local"] | None = None
    # become (Ansible's): the agent runs as become_user (default root) through sudo (transport/become.py)
    become: bool | None = None
    become_user: str | None = None
    become_method: str | None = None
    container: ContainerFields | None = None
    # servers under a service manager (playbook launch.manager): supervisorctl's command line, the
    # dir supervisord includes program sections from; the dir systemd units are written to
    supervisorctl: str | None = None
    supervisor_conf_dir: str | None = None
    systemd_unit_dir: str | None = None
    systemd_unit: str | None = None  # the operator's own unit: fleetctl writes a drop-in for it

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
    _flags = field_validator("flags")(classmethod(lambda cls, v: check_flags(v)))
    _become_method = field_validator("become_method")(classmethod(lambda cls, v: check_become_method(v)))
    _become_user = field_validator("become_user")(classmethod(lambda cls, v: check_become_user(v)))

    @field_validator("container")
    @classmethod
    def _container(cls, v: ContainerFields | None) -> ContainerFields | None:
        if v is not None:
            v.resolved()  # (its cross-field checks, raised here so the error names the key)
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: int | list[int] | None) -> int | list[int] | None:
        if isinstance(v, int) and v < 0:
            raise ValueError("gpus must be a count >= 0 or a list of GPU indices")
        if isinstance(v, list) and (len(set(v)) != len(v) or any(i < 0 for i in v)):
            raise ValueError("gpus list must hold distinct indices >= 0")
        return v


class GroupFields(Strict):
    env: dict[str, EnvValue] | None = None
    flags: dict[str, Any] | None = None
    probe: bool | None = None
    become: bool | None = None
    become_user: str | None = None
    become_method: str | None = None

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
    _flags = field_validator("flags")(classmethod(lambda cls, v: check_flags(v)))
    _become_method = field_validator("become_method")(classmethod(lambda cls, v: check_become_method(v)))
    _become_user = field_validator("become_user")(classmethod(lambda cls, v: check_become_user(v)))


class InventoryFile(Strict):
    ssh_config: str | None = None
    defaults: HostFields = HostFields()
    groups: dict[str, GroupFields] = {}
    hosts: dict[Annotated[str, Field(pattern=HOST_NAME_PATTERN)], HostFields | None]


def _env_strings(env: dict[str, EnvValue]) -> tuple[dict[str, str], set[str]]:
    out: dict[str, str] = {}
    secret: set[str] = set()
    for k, v in env.items():
        if isinstance(v, SecretValue):
            out[k] = v.value
            if v.secret:
                secret.add(k)
        elif isinstance(v, bool):
            out[k] = "1" if v else "0"
        else:
            out[k] = str(v)
    return out, secret


def _ssh_config_hosts(path: Path) -> set[str]:
    from fleetctl.config.ssh_config import ssh_config  # parsed once per command: the connections use it too

    try:
        cfg, _ = ssh_config(path)
    except FileNotFoundError:
        raise InputError(f"{path}: ssh_config file not found", hint="fix 'ssh_config:' in the inventory",
                         reference="inventory-invalid") from None
    return {h for h in cfg.get_hostnames() if not any(c in h for c in "*?!")}


def load_inventory(path: Path | str) -> Inventory:
    """The inventory file `path`: fleetctl's own YAML, or an Ansible inventory (INI, YAML, the JSON of
    `ansible-inventory --list`, a script or plugin through ansible-inventory): the format is told
    from the file itself (config/ansible_inventory.py detect_kind)."""
    from fleetctl.config import ansible_inventory as ai

    path = Path(path)
    kind = ai.early_kind(path)
    if kind is not None:
        return load_ansible(path, kind)
    try:
        doc: YamlDoc = load_yaml(path, "inventory")
    except InputError:
        kind = ai.fallback_kind(path)  # not YAML that fleetctl's loader reads: INI, or Ansible's YAML tags
        if kind is None:
            raise
        return load_ansible(path, kind)
    kind = ai.kind_of_data(doc.data, path)
    if kind != "fleetctl":
        return load_ansible(path, kind)
    return _resolve(path, doc, validate(doc, InventoryFile, "inventory"))


BECOME_KEYS = ("become", "become_user", "become_method")


def _resolve(path: Path, doc: YamlDoc, raw: InventoryFile, *, group_hosts: dict[str, list[str]] | None = None,
             kind: str = "fleetctl") -> Inventory:
    base = path.resolve().parent
    paths: dict[str, str] = {}  # each path value as written -> as resolved (the same one often repeats)

    def resolve(value: str | None) -> str | None:
        if value is None:
            return None
        if value not in paths:
            paths[value] = resolve_path(base, value)
        return paths[value]

    ssh_config = Path(resolve(raw.ssh_config)) if raw.ssh_config else None
    aliases = _ssh_config_hosts(ssh_config) if ssh_config else set()
    d = raw.defaults
    hosts: list[Host] = []
    identity_where: dict[str, str] = {}
    for name, h in raw.hosts.items():
        h = h or HostFields()
        groups = h.groups if h.groups is not None else (d.groups or [])
        env: dict[str, EnvValue] = dict(d.env or {})
        flags: dict[str, Any] = dict(d.flags or {})
        probe = bool(d.probe)
        bec = {k: getattr(d, k) for k in BECOME_KEYS}
        for g in groups:
            gf = raw.groups.get(g)
            if gf:
                env.update(gf.env or {})
                flags.update(gf.flags or {})
                probe = gf.probe if gf.probe is not None else probe
                bec.update({k: getattr(gf, k) for k in BECOME_KEYS if getattr(gf, k) is not None})
        probe = h.probe if h.probe is not None else probe
        bec.update({k: getattr(h, k) for k in BECOME_KEYS if getattr(h, k) is not None})
        env.update(h.env or {})
        flags.update(h.flags or {})
        env_s, secret = _env_strings(env)

        def pick(key: str, default: Any = None, _h: HostFields = h) -> Any:
            v = getattr(_h, key)
            return v if v is not None else (getattr(d, key) if getattr(d, key) is not None else default)

        address = pick("address")
        from_cfg = False
        if address is None:
            if name in aliases:
                address, from_cfg = name, True
            else:
                line = doc.line_of(("hosts", name))
                raise InputError(
                    f"{path}:{line}: hosts.{name}.address: missing",
                    hint="add 'address:' or an ssh_config Host entry of that name",
                    reference="inventory-invalid")
        identity = resolve(pick("identity_file"))
        if identity is not None:
            where = ("hosts", name, "identity_file") if h.identity_file is not None else ("defaults", "identity_file")
            identity_where[name] = f"{path}:{doc.line_of(where)}: {'.'.join(where)}"
        gpus = pick("gpus", 0)
        gpu_list = tuple(range(gpus)) if isinstance(gpus, int) else tuple(gpus)
        hosts.append(
            Host(
                name=name,
                address=str(address),
                port=pick("port"),
                user=pick("user"),
                identity_file=identity,
                known_hosts=resolve(pick("known_hosts")),
                python=pick("python", "python3"),
                sglang_dir=pick("sglang_dir"),
                state_dir=pick("state_dir", "~/.fleetctl"),
                env=env_s,
                secret_env_keys=frozenset(secret),
                flags=flags,
                launch_command=pick("launch_command"),
                gpus=gpu_list,
                groups=tuple(groups),
                connect_timeout=pick("connect_timeout", 10.0),
                command_timeout=pick("command_timeout", 120.0),
                host_timeout=pick("host_timeout", DEFAULT_HOST_TIMEOUT),
                max_answer_bytes=pick("max_answer_bytes", DEFAULT_MAX_ANSWER_BYTES),
                from_ssh_config=from_cfg,
                probe=probe,
                connection=pick("connection", "ssh"),
                become=bec["become"],
                become_user=bec["become_user"],
                become_method=bec["become_method"],
                container=c.resolved() if (c := pick("container")) is not None else None,
                supervisorctl=pick("supervisorctl"),
                supervisor_conf_dir=pick("supervisor_conf_dir"),
                systemd_unit_dir=pick("systemd_unit_dir"),
                systemd_unit=pick("systemd_unit"),
            )
        )
    if not hosts:
        raise InputError(f"{path}:{doc.line_of(('hosts',))}: hosts: the inventory names no host", hint="add hosts",
                         reference="inventory-invalid")
    return Inventory(path=path, ssh_config=ssh_config, hosts=hosts, identity_where=identity_where, paths=paths,
                     group_hosts=group_hosts, kind=kind)


# --- Ansible inventories -------------------------------------------------------------------------

# Ansible's connection variables -> fleetctl's host keys (the first one set of each key wins)
ANSIBLE_VARS: dict[str, tuple[str, ...]] = {
    "address": ("ansible_host", "ansible_ssh_host"),
    "port": ("ansible_port", "ansible_ssh_port"),
    "user": ("ansible_user", "ansible_ssh_user"),
    "identity_file": ("ansible_ssh_private_key_file", "ansible_private_key_file"),
    "python": ("ansible_python_interpreter",),
    "become": ("ansible_become",),
    "become_user": ("ansible_become_user",),
    "become_method": ("ansible_become_method",),
}
PASSWORD_VARS = ("ansible_password", "ansible_ssh_pass", "ansible_ssh_password", "ansible_become_password",
                 "ansible_become_pass", "ansible_sudo_pass", "ansible_su_pass")
SSH_CONNECTIONS = ("ssh", "smart", "paramiko", "paramiko_ssh", "ansible.builtin.ssh", "ansible.builtin.paramiko_ssh")
# Ansible's container connections -> the runtime fleetctl's `container:` names
CONTAINER_CONNECTIONS = {"docker": "docker", "community.docker.docker": "docker",
                         "community.docker.docker_api": "docker", "podman": "podman",
                         "containers.podman.podman": "podman", "kubectl": "kubectl",
                         "kubernetes.core.kubectl": "kubectl", "community.kubernetes.kubectl": "kubectl"}
_TRUE = ("true", "yes", "on", "1", "y", "t")
_FALSE = ("false", "no", "off", "0", "n", "f", "")


def _ansible_bool(v: Any, where: str) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in _TRUE or s in _FALSE:
        return s in _TRUE
    raise InputError(f"{where}: {v!r} is not true or false", hint="write true or false", reference="inventory-invalid")


def ansible_host_fields(name: str, hv: dict[str, Any], where: str) -> dict[str, Any]:
    """One Ansible host's combined variables -> fleetctl's host keys (HostFields), checked."""
    have = HostFields.model_fields
    out: dict[str, Any] = {}
    conn = hv.get("ansible_connection")
    if conn is not None and str(conn) not in SSH_CONNECTIONS:
        runtime = CONTAINER_CONNECTIONS.get(str(conn))
        if runtime is not None:  # a container: fleetctl reaches it through the machine it runs on
            raise InputError(f"{where}: host {name}: ansible_connection={conn}: fleetctl reaches a container "
                             "through SSH to the machine that runs it",
                             hint="set ansible_host to that machine (SSH) and fleetctl_container="
                                  f"{{runtime: {runtime}, name: CONTAINER}} (see docs/user-guide.md)",
                             reference="inventory-invalid")
        raise InputError(f"{where}: host {name}: ansible_connection={conn}: fleetctl reaches hosts over SSH only",
                         hint=f"remove ansible_connection for this host, or leave it out with --limit '!{name}'",
                         reference="inventory-invalid")
    for var in PASSWORD_VARS:
        if hv.get(var) not in (None, ""):
            raise InputError(f"{where}: host {name}: {var}: fleetctl never takes a password from an inventory",
                             hint="log in with an SSH key (ansible_ssh_private_key_file or your agent); for "
                                  "become, a sudoers NOPASSWD rule for the interpreter, or --ask-become-pass",
                             reference="inventory-invalid")
    for key, names in ANSIBLE_VARS.items():
        var = next((n for n in names if hv.get(n) is not None), None)
        if var is None:
            continue
        v = hv[var]
        if key == "python" and str(v).startswith("auto"):
            continue  # Ansible's interpreter discovery: fleetctl's default python3
        if key == "become":
            v = _ansible_bool(v, f"{where}: host {name}: {var}")
        out[key] = str(v) if key in ("address", "user", "identity_file", "python", "become_user",
                                     "become_method") else v
    for var, v in hv.items():
        if not var.startswith("fleetctl_"):
            continue
        key = var.removeprefix("fleetctl_")
        if key not in have or key == "groups":
            known = ", ".join(f"fleetctl_{k}" for k in have if k != "groups")
            raise InputError(f"{where}: host {name}: unknown variable {var}", hint=f"fleetctl reads {known}",
                             reference="inventory-invalid")
        out[key] = v
    try:
        HostFields.model_validate(out)
    except ValidationError as e:
        first = e.errors()[0]
        key = str(first.get("loc", ("?",))[0])
        var = next((n for n in (f"fleetctl_{key}", *ANSIBLE_VARS.get(key, ())) if n in hv), key)
        msg = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise InputError(f"{where}: host {name}: {var}={hv.get(var)!r}: {msg}", reference="inventory-invalid") from None
    return out


def load_ansible(path: Path, kind: str) -> Inventory:
    """An Ansible inventory as fleetctl hosts: each host's variables combined as Ansible does, mapped to
    fleetctl's keys (ansible_host_fields), then resolved like fleetctl's own inventory."""
    from fleetctl.config import ansible_inventory as ai

    ainv = ai.load(path, kind)
    hosts: dict[str, dict[str, Any]] = {}
    name_re = re.compile(HOST_NAME_PATTERN)
    for name in ainv.hosts:
        if not name_re.match(name):
            raise InputError(f"{path}: host {name!r}: fleetctl host names are letters, digits, _ . - only",
                             hint="name the host with those and put its address in ansible_host",
                             reference="inventory-invalid")
        fields = ansible_host_fields(name, ainv.host_vars(name), str(path))
        fields.setdefault("address", name)
        fields["groups"] = ainv.host_groups(name)
        hosts[name] = fields
    if not hosts:
        raise InputError(f"{path}: the Ansible inventory names no host", hint="add hosts",
                         reference="inventory-invalid")
    doc = YamlDoc(path=path, data={"hosts": hosts}, root=None)
    raw = validate(doc, InventoryFile, "inventory")
    group_hosts = {g: ainv.group_hosts(g) for g in ainv.groups}
    return _resolve(path, doc, raw, group_hosts=group_hosts, kind=kind)
