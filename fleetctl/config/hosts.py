"""The inventory as resolved: each host with every value decided and its paths absolute.

Plain data, no pydantic: config/inventory.py validates the file and builds these; a command whose
inventory was resolved before from the same inputs takes the kept copy (config/inventory_cache.py)
and connects without importing that validation at all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetctl.errors import InputError

# become (transport/become.py runs it): the one method fleetctl runs and why the others are refused
BECOME_METHODS = ("sudo",)
BECOME_UNSUPPORTED = {
    "su": "su reads its password from a terminal only, and fleetctl never opens one on a host",
    "doas": "doas cannot take a password on stdin (only from a terminal) and has no non-interactive check",
    "pbrun": "fleetctl becomes through sudo only", "pfexec": "fleetctl becomes through sudo only",
    "dzdo": "fleetctl becomes through sudo only", "ksu": "fleetctl becomes through sudo only",
    "machinectl": "fleetctl becomes through sudo only", "runas": "fleetctl becomes through sudo only",
}
# a user name sudo's -u takes as a name (no '#uid' forms, no option-like or shell-special words)
BECOME_USER_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*\$?$")

FLAG_RE = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_\-]*$")  # a server flag as the inventory and playbook name it
DEFAULT_HOST_TIMEOUT = 1800.0  # seconds one host transaction (one step of a command on a host) may take
DEFAULT_MAX_ANSWER_BYTES = 64 << 20  # the largest answer a host may send for one request


@dataclass(frozen=True)
class Host:
    """One resolved host: every value decided, paths absolute."""

    name: str
    address: str
    port: int | None
    user: str | None
    identity_file: str | None
    known_hosts: str | None
    python: str
    sglang_dir: str | None
    state_dir: str
    env: dict[str, str]
    secret_env_keys: frozenset[str]
    flags: dict[str, Any]
    launch_command: str | None
    gpus: tuple[int, ...]
    groups: tuple[str, ...]
    connect_timeout: float
    command_timeout: float
    host_timeout: float = DEFAULT_HOST_TIMEOUT
    max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES
    from_ssh_config: bool = False
    probe: bool = False  # deploy asks the host's own SGLang before changing anything
    connection: str = "ssh"  # "local": the agent runs on this machine without SSH (transport/local.py)
    # become (Ansible's meaning): the agent runs as `become_user` (default root) through sudo;
    # None: not said by the inventory (the command line's -b/--become-user/--become-method decide)
    become: bool | None = None
    become_user: str | None = None
    become_method: str | None = None
    # launch.manager supervisor: the control command and the dir supervisord's [include] reads;
    # systemd: the dir units are written to (defaults in fleetctl/ops/managers.py)
    supervisorctl: str | None = None
    supervisor_conf_dir: str | None = None
    systemd_unit_dir: str | None = None
    systemd_unit: str | None = None  # an operator's own unit (or template) to run through a drop-in

    @property
    def becomes(self) -> bool:
        return bool(self.become)

    @property
    def become_as(self) -> str:
        return self.become_user or "root"
    # SGLang runs in a container on this host: its runtime and name, as fleetctl.config.containers
    # ContainerSpec.of reads them (plain data so the kept copy holds it as JSON)
    container: dict[str, Any] | None = None

    def public_env(self) -> dict[str, str]:
        return {k: ("***" if k in self.secret_env_keys else v) for k, v in self.env.items()}


@dataclass
class Inventory:
    path: Path
    ssh_config: Path | None
    hosts: list[Host]
    identity_where: dict[str, str] = field(default_factory=dict)  # host -> "file:line: key" its identity_file comes from
    # each path value of the file as written -> as resolved (resolve_path), which depends on more than
    # the file's bytes: the kept copy resolves them again before it is used (inventory_cache.py)
    paths: dict[str, str] = field(default_factory=dict)
    # an Ansible inventory: each group's hosts in Ansible's order (what `--limit group[0:3]` indexes)
    group_hosts: dict[str, list[str]] | None = None
    kind: str = "fleetctl"  # the inventory's format (config/ansible_inventory.py detect)

    def check_local_files(self, hosts: list[Host]) -> None:
        """The controller-side files the chosen hosts need exist (a missing key is bad input, exit 2)."""
        for h in hosts:
            if h.identity_file and not Path(h.identity_file).is_file():
                raise InputError(f"{self.identity_where.get(h.name, self.path)}: {h.identity_file} does not exist",
                                 hint="fix the path (relative to the inventory file), or remove "
                                      "'identity_file:' to use your ssh agent and default keys",
                                 reference="inventory-invalid")

    def select(self, limit: str | None) -> list[Host]:
        """Hosts matching --limit (Ansible's meaning), their local files checked. An empty selection is
        bad input: no command ever runs on zero hosts."""
        chosen = self._select(limit)
        self.check_local_files(chosen)
        return chosen

    def groups_hosts(self) -> dict[str, list[str]]:
        """Each group's hosts, `all` included: Ansible's order for an Ansible inventory, else this
        inventory's order."""
        if self.group_hosts is not None:
            out = dict(self.group_hosts)
            out["all"] = [h.name for h in self.hosts]
            return out
        out = {"all": [h.name for h in self.hosts]}
        for h in self.hosts:
            for g in h.groups:
                out.setdefault(g, []).append(h.name)
        return out

    def _select(self, limit: str | None) -> list[Host]:
        """--limit with Ansible's patterns (config/patterns.py): `a,b` or `a:b`, `&P`, `!P`, globs,
        `~regex`, subscripts `web[0:3]`, `@FILE`. The union of the plain patterns (all hosts when there
        is none), then each `&`, then each `!`; hosts in inventory order."""
        if limit is None:
            return list(self.hosts)
        from fleetctl.config.patterns import select

        def missing(pat: str) -> InputError:
            return InputError(f"--limit: '{pat}' matches no host or group in {self.path}",
                              hint=f"'fleetctl facts -i {self.path} --list-hosts' lists the hosts",
                              reference="limit-matches-nothing")

        names = select(limit, [h.name for h in self.hosts], self.groups_hosts(), missing=missing)
        if not names:
            raise InputError(f"no host matches --limit {limit!r} in {self.path}",
                             hint="'!x' alone means every host but x; check the names with "
                                  f"'fleetctl facts -i {self.path} --list-hosts'", reference="limit-matches-nothing")
        by_name = {h.name: h for h in self.hosts}
        return [by_name[n] for n in names]


def resolve_path(base: Path, value: str) -> str:
    """A path value of the inventory: `~` expanded (HOME), a relative one taken from `base` (the
    inventory's directory) with its symlinks resolved."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        p = (base / p).resolve()
    return str(p)
