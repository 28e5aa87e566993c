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
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
    _flags = field_validator("flags")(classmethod(lambda cls, v: check_flags(v)))

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

    _env = field_validator("env")(classmethod(lambda cls, v: check_env(v)))
    _flags = field_validator("flags")(classmethod(lambda cls, v: check_flags(v)))


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
    from fleetctl.transport.direct import ssh_config  # parsed once per command: the connections use it too

    try:
        cfg, _ = ssh_config(path)
    except FileNotFoundError:
        raise InputError(f"{path}: ssh_config file not found", hint="fix 'ssh_config:' in the inventory") from None
    return {h for h in cfg.get_hostnames() if not any(c in h for c in "*?!")}


def load_inventory(path: Path | str) -> Inventory:
    path = Path(path)
    doc: YamlDoc = load_yaml(path, "inventory")
    raw = validate(doc, InventoryFile, "inventory")
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
        for g in groups:
            gf = raw.groups.get(g)
            if gf:
                env.update(gf.env or {})
                flags.update(gf.flags or {})
                probe = gf.probe if gf.probe is not None else probe
        probe = h.probe if h.probe is not None else probe
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
                )
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
            )
        )
    if not hosts:
        raise InputError(f"{path}:{doc.line_of(('hosts',))}: hosts: the inventory names no host", hint="add hosts")
    return Inventory(path=path, ssh_config=ssh_config, hosts=hosts, identity_where=identity_where, paths=paths)
