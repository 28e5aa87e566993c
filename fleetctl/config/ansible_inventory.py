"""Ansible inventories as fleetctl reads them: INI and YAML files (host ranges, children groups,
`group_vars/` and `host_vars/` beside the file), the JSON of `ansible-inventory --list`, and, where
ansible-core is installed, any source Ansible itself reads (a script, a plugin config) through
`ansible-inventory -i SOURCE --list`.

Parsing gives the inventory as Ansible sees it: groups (their own hosts, children and vars) and
hosts (their own vars), each host's variables combined with Ansible's precedence (`all`, then the
other groups by depth, `ansible_group_priority` and name, inventory vars before `group_vars/`
files, then the host's own, then `host_vars/`). config/inventory.py turns that into fleetctl hosts:
`ansible_host`, `ansible_port`, `ansible_user`, `ansible_python_interpreter`, the ssh key, the
`ansible_become*` variables (fleetctl's become: transport/become.py), and `fleetctl_<key>` for any
key of fleetctl's own host entries.

The tests hold this parser to ansible-core's own parse of the same files (tests/test_ansible_inventory.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import string
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fleetctl.errors import InputError

VARS_EXTS = ("", ".yml", ".yaml", ".json")  # the names a group_vars/host_vars file may have
MAX_FILE_BYTES = 16 << 20  # an inventory or vars file larger than this is refused
MAX_HOSTS = 100_000  # ranges that expand past this many hosts are refused
LIST_TIMEOUT = 120.0  # seconds `ansible-inventory --list` may take
FLEETCTL_KEYS = ("ssh_config", "defaults", "groups", "hosts")  # fleetctl's own inventory's top-level keys


@dataclass
class Group:
    name: str
    hosts: list[str] = field(default_factory=list)  # its own hosts, in the order first named
    children: list[str] = field(default_factory=list)
    vars: dict[str, Any] = field(default_factory=dict)
    parents: list[str] = field(default_factory=list)
    priority: int = 1  # ansible_group_priority: a group attribute, not a variable


@dataclass
class AnsibleInventory:
    """An Ansible inventory as parsed: groups and each host's own variables."""

    source: Path
    groups: dict[str, Group]
    hosts: dict[str, dict[str, Any]]  # host -> its own vars (inventory order)
    group_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # group_vars/ per group
    host_files: dict[str, dict[str, Any]] = field(default_factory=dict)  # host_vars/ per host

    def group(self, name: str) -> Group:
        g = self.groups.get(name)
        if g is None:
            g = self.groups[name] = Group(name)
        return g

    def add_host(self, group: str, name: str, vars_: dict[str, Any], port: int | None = None) -> None:
        own = self.hosts.setdefault(name, {})
        if len(self.hosts) > MAX_HOSTS:
            raise InputError(f"{self.source}: more than {MAX_HOSTS} hosts", hint="split the inventory",
                             reference="inventory-invalid")
        if port is not None:
            own["ansible_port"] = port
        own.update(vars_)
        g = self.group(group)
        if name not in g.hosts:
            g.hosts.append(name)

    def set_group_vars(self, group: str, values: dict[str, Any]) -> None:
        g = self.group(group)
        for k, v in values.items():
            if k == "ansible_group_priority":
                try:
                    g.priority = int(v)
                except (TypeError, ValueError):
                    raise InputError(f"{self.source}: group '{group}': ansible_group_priority must be a whole "
                                     f"number, not {v!r}", reference="inventory-invalid") from None
            else:
                g.vars[k] = v

    def add_child(self, parent: str, child: str) -> None:
        p, c = self.group(parent), self.group(child)
        if child == parent or child in self.ancestors(parent):
            raise InputError(f"{self.source}: group '{child}' would be its own ancestor (through '{parent}')",
                             hint="remove the loop from the children sections", reference="inventory-invalid")
        if child not in p.children:
            p.children.append(child)
        if parent not in c.parents:
            c.parents.append(parent)

    def ancestors(self, group: str) -> set[str]:
        seen: set[str] = set()
        todo = list(self.groups[group].parents) if group in self.groups else []
        while todo:
            g = todo.pop()
            if g not in seen:
                seen.add(g)
                todo.extend(self.groups[g].parents)
        return seen

    def reconcile(self) -> None:
        """As Ansible completes an inventory: `all` and `ungrouped` exist, every group without a parent
        is a child of `all`, and a host in no group but `all` is in `ungrouped`."""
        self.group("all")
        self.group("ungrouped")
        for name in list(self.groups):
            if name != "all" and not self.groups[name].parents:
                self.add_child("all", name)
        named = {h for n, g in self.groups.items() if n not in ("all", "ungrouped") for h in g.hosts}
        ung = self.groups["ungrouped"]
        ung.hosts = [h for h in ung.hosts if h not in named]
        for h in self.hosts:
            if h not in named and h not in ung.hosts:
                ung.hosts.append(h)

    def depth(self, group: str) -> int:
        """The longest path from `all` to the group (Ansible's group depth)."""
        memo: dict[str, int] = {}

        def d(g: str) -> int:
            if g not in memo:
                ps = self.groups[g].parents
                memo[g] = 0 if not ps else 1 + max(d(p) for p in ps)
            return memo[g]

        return d(group)

    def host_groups(self, host: str) -> list[str]:
        """Every group the host is in (through children too), `all` excluded, in Ansible's order of
        precedence: depth, `ansible_group_priority`, name."""
        direct = [n for n, g in self.groups.items() if host in g.hosts and n != "all"]
        found: set[str] = set(direct)
        for g in direct:
            found |= self.ancestors(g)
        found.discard("all")
        return sorted(found, key=lambda g: (self.depth(g), self.groups[g].priority, g))

    def host_vars(self, host: str) -> dict[str, Any]:
        """The host's variables combined as Ansible does (top-level keys replaced, not merged)."""
        groups = self.host_groups(host)
        out: dict[str, Any] = {}
        out.update(self.groups["all"].vars)
        out.update(self.group_files.get("all", {}))
        for g in groups:
            out.update(self.groups[g].vars)
        for g in groups:
            out.update(self.group_files.get(g, {}))
        out.update(self.hosts[host])
        out.update(self.host_files.get(host, {}))
        return out

    def group_hosts(self, group: str) -> list[str]:
        """The group's hosts in Ansible's order: its own, then each child's, level by level."""
        out: list[str] = []
        seen_g: set[str] = set()
        level = [group]
        while level:
            nxt: list[str] = []
            for g in level:
                if g in seen_g:
                    continue
                seen_g.add(g)
                out += [h for h in self.groups[g].hosts if h not in out]
                nxt += self.groups[g].children
            level = nxt
        return out


# --- the format of a file ------------------------------------------------------------------------

def _read(path: Path, what: str = "inventory") -> str:
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise InputError(f"{path}: {what} file is larger than {MAX_FILE_BYTES >> 20} MiB",
                             reference="inventory-invalid")
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: {what} file not found", hint="check the path",
                         reference="inventory-invalid") from None
    except (PermissionError, UnicodeDecodeError, IsADirectoryError) as e:
        raise InputError(f"{path}: cannot read {what}: {e.__class__.__name__}: {e}",
                         reference="inventory-invalid") from None


class _AnsibleLoader(yaml.SafeLoader):
    """YAML as Ansible writes it: `!unsafe` is a plain string; `!vault` cannot be read here."""


def _unsafe(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]


def _vault(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    raise InputError(f"{node.start_mark.name}:{node.start_mark.line + 1}: a '!vault' encrypted value: fleetctl "
                     "does not decrypt Ansible Vault",
                     hint="run 'ansible-inventory -i INVENTORY --list --vault-password-file F > inv.json' "
                          "and pass -i inv.json (it holds the secret in clear: keep it private)",
                     reference="inventory-invalid")


_AnsibleLoader.add_constructor("!unsafe", _unsafe)
_AnsibleLoader.add_constructor("!vault", _vault)


def _yaml(text: str, path: Path) -> Any:
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        _vault_file(path)
    try:
        loader = _AnsibleLoader(text)
        loader.name = str(path)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise InputError(f"{path}{f':{mark.line + 1}' if mark else ''}: malformed YAML: {e.problem or e}",
                         hint="fix the YAML syntax", reference="inventory-invalid") from None
    except yaml.YAMLError as e:
        raise InputError(f"{path}: malformed YAML: {e}", hint="fix the YAML syntax",
                         reference="inventory-invalid") from None


def _vault_file(path: Path) -> None:
    raise InputError(f"{path}: encrypted with Ansible Vault: fleetctl does not decrypt it",
                     hint="run 'ansible-inventory -i INVENTORY --list --vault-password-file F > inv.json' and "
                          "pass -i inv.json (it holds the secrets in clear: keep it private)",
                     reference="inventory-invalid")


def early_kind(path: Path) -> str | None:
    """What the file is before any YAML parse: "ansible-ini" (a .ini or .cfg file), "ansible-json" (a
    .json file that is not fleetctl's), "ansible-tool" (an executable: an inventory script), or None."""
    if not path.is_file():
        return None  # (missing, a directory: fleetctl's loader says so)
    suffix = path.suffix.lower()
    if suffix in (".ini", ".cfg"):
        return "ansible-ini"
    if suffix not in (".yml", ".yaml", ".json") and os.access(path, os.X_OK):
        return "ansible-tool"
    if suffix == ".json":
        try:
            data = json.loads(_read(path))
        except ValueError:
            return None
        return "ansible-json" if isinstance(data, dict) and kind_of_data(data, path) != "fleetctl" else None
    return None


def fallback_kind(path: Path) -> str | None:
    """A file fleetctl's YAML loader refused: an INI inventory (a file not named .yml/.yaml), YAML
    with Ansible's tags (`!unsafe`), or None (the YAML error stands)."""
    if not path.is_file():
        return None
    text = _read(path)
    if text.lstrip().startswith("$ANSIBLE_VAULT"):
        _vault_file(path)
    try:
        data = yaml.load(text, Loader=_AnsibleLoader)
    except yaml.YAMLError:
        return None if path.suffix.lower() in (".yml", ".yaml") else "ansible-ini"
    if isinstance(data, dict):
        kind = kind_of_data(data, path)
        return None if kind == "fleetctl" else kind
    return None if path.suffix.lower() in (".yml", ".yaml") else "ansible-ini"


_GROUP_KEYS = {"hosts", "vars", "children"}


def kind_of_data(data: Any, path: Path) -> str:
    """Parsed YAML/JSON: "fleetctl" (its own inventory, or anything fleetctl's validation should
    answer), "ansible-tool" (a plugin config: `plugin:`), "ansible-json" (`_meta`), "ansible-yaml"."""
    if not isinstance(data, dict):
        if isinstance(data, str) and path.suffix.lower() not in (".yml", ".yaml", ".json"):
            return "ansible-ini"  # bare host names, one a line: YAML reads them as one string
        return "fleetctl"
    if "plugin" in data:
        return "ansible-tool"
    if "_meta" in data:
        return "ansible-json"
    if ("hosts" in data and set(data) <= set(FLEETCTL_KEYS)) or set(data) & {"ssh_config", "defaults", "groups"}:
        return "fleetctl"
    if data and all(v is None or (isinstance(v, (dict, list)) and (isinstance(v, list) or set(v) <= _GROUP_KEYS))
                    for v in data.values()):
        return "ansible-yaml" if path.suffix.lower() != ".json" else "ansible-json"
    return "fleetctl"


def detect(path: Path) -> str:
    """The inventory's format: "fleetctl", "ansible-ini", "ansible-yaml", "ansible-json" or
    "ansible-tool" (what `fleetctl inventory`-style tools and the tests ask)."""
    kind = early_kind(path)
    if kind is not None:
        return kind
    try:
        data = yaml.load(_read(path), Loader=_AnsibleLoader)
    except yaml.YAMLError:
        return fallback_kind(path) or "fleetctl"
    return kind_of_data(data if data is not None else {}, path)


def is_ansible(path: Path) -> bool:
    return detect(path) != "fleetctl"


# --- INI -----------------------------------------------------------------------------------------

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_NAME = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")
_BRACKET_PORT = re.compile(r"^\[(.+)\]:([0-9]+)$")
_HOST_PORT = re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$")


def _literal(v: str) -> Any:
    """An INI value as Ansible reads it: a Python literal where it is one, else the string."""
    try:
        out = ast.literal_eval(v)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return v
    if out is ... or isinstance(out, (complex, bytes)):
        return v if out is ... or isinstance(out, bytes) else str(out)
    if isinstance(out, (tuple, set)):
        return list(out)
    return out


def expand_range(pattern: str, where: str) -> list[str]:
    """`gpu[01:16].dc1` -> gpu01.dc1 ... gpu16.dc1: numeric (leading zeros keep the width) or
    single-letter ranges, `[beg:end:step]`, several ranges in one name; Ansible's meaning."""
    if "[" not in pattern:
        return [pattern]
    head, _, rest = pattern.partition("[")
    if "]" not in rest:
        raise InputError(f"{where}: host pattern {pattern!r}: '[' without ']'",
                         hint="write a range as name[01:16] or name[a:f]", reference="inventory-invalid")
    body, _, tail = rest.partition("]")
    bounds = body.split(":")
    if len(bounds) not in (2, 3):
        raise InputError(f"{where}: host range {pattern!r} must be [begin:end] or [begin:end:step]",
                         reference="inventory-invalid")
    beg, end = bounds[0] or "0", bounds[1]
    step_s = bounds[2] if len(bounds) == 3 else "1"
    if not end:
        raise InputError(f"{where}: host range {pattern!r} must give an end value", reference="inventory-invalid")
    width = len(beg) if beg[0] == "0" and len(beg) > 1 else 0
    if width and len(end) != width:
        raise InputError(f"{where}: host range {pattern!r}: begin and end must have the same width",
                         hint=f"write [{beg}:{end.zfill(width)}]", reference="inventory-invalid")
    try:
        step = int(step_s)
        if step <= 0:
            raise ValueError
    except ValueError:
        raise InputError(f"{where}: host range {pattern!r}: the step must be a whole number above 0",
                         reference="inventory-invalid") from None
    letters = string.ascii_letters
    seq: list[str]
    if beg in letters and end in letters and len(beg) == 1 and len(end) == 1:
        i, j = letters.index(beg), letters.index(end)
        if i > j:
            raise InputError(f"{where}: host range {pattern!r}: begin must come before end",
                             reference="inventory-invalid")
        seq = list(letters[i:j + 1:step])
    else:
        try:
            b, e = int(beg), int(end)
        except ValueError:
            raise InputError(f"{where}: host range {pattern!r}: begin and end must be numbers or single letters",
                             reference="inventory-invalid") \
                from None
        if (e - b) // step > MAX_HOSTS:
            raise InputError(f"{where}: host range {pattern!r} expands to more than {MAX_HOSTS} hosts",
                             reference="inventory-invalid")
        seq = [str(n).zfill(width) if width else str(n) for n in range(b, e + 1, step)]
    out: list[str] = []
    for s in seq:
        out += expand_range(f"{head}{s}{tail}", where)
    return out


def split_host_port(token: str) -> tuple[str, int | None]:
    """`name:2222` -> (name, 2222); `[::1]:22`; a bare IPv6 address keeps its colons."""
    m = _BRACKET_PORT.match(token) or _HOST_PORT.match(token)
    if m:
        return m.group(1), int(m.group(2))
    return token, None


def _host_pattern(token: str, where: str) -> tuple[list[str], int | None]:
    name, port = split_host_port(token)
    if token.strip().endswith(":") and port is None:
        raise InputError(f"{where}: host pattern {token!r} ends in ':'", hint="write name:PORT or drop the ':'",
                         reference="inventory-invalid")
    names = expand_range(name, where)
    if any(n.strip() == "---" for n in names):
        raise InputError(f"{where}: '---' in an INI inventory: is this a YAML file?",
                         hint="name it .yaml, or fix the line", reference="inventory-invalid")
    return names, port


def parse_ini(path: Path, text: str, inv: AnsibleInventory) -> None:
    group, state = "ungrouped", "hosts"
    pending: dict[str, tuple[int, str, list[str]]] = {}  # group named before declared: line, state, parents
    declared: set[str] = {"ungrouped", "all"}

    for n, raw in enumerate(text.splitlines(), 1):
        where = f"{path}:{n}"
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            m = _SECTION.match(line)
            if not m:
                raise InputError(f"{where}: invalid section line {line!r}",
                                 hint="write [group], [group:vars] or [group:children], with no spaces inside",
                                 reference="inventory-invalid")
            group, state = m.group(1), m.group(2) or "hosts"
            if state not in ("hosts", "vars", "children"):
                raise InputError(f"{where}: section [{group}:{state}] has an unknown type '{state}'",
                                 hint="use [group], [group:vars] or [group:children]", reference="inventory-invalid")
            if group not in inv.groups and state == "vars" and group not in pending:
                pending[group] = (n, "vars", [])
            inv.group(group)
            if state != "vars":
                declared.add(group)
                pending.pop(group, None)
            continue
        if state == "hosts":
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:
                raise InputError(f"{where}: cannot parse host line: {e}", hint="check its quotes",
                                 reference="inventory-invalid") from None
            if not tokens:
                continue
            names, port = _host_pattern(tokens[0], where)
            values: dict[str, Any] = {}
            for t in tokens[1:]:
                if "=" not in t:
                    raise InputError(f"{where}: expected key=value after the host name, got {t!r}",
                                     hint="write host variables as key=value", reference="inventory-invalid")
                k, v = t.split("=", 1)
                values[k] = _literal(v)
            for h in names:
                inv.add_host(group, h, dict(values), port)
        elif state == "vars":
            if "=" not in line:
                raise InputError(f"{where}: expected key=value in [{group}:vars], got {line!r}",
                                 reference="inventory-invalid")
            k, v = (e.strip() for e in line.split("=", 1))
            inv.set_group_vars(group, {k: _literal(v)})
        else:
            m = _GROUP_NAME.match(line)
            if not m:
                raise InputError(f"{where}: expected a group name in [{group}:children], got {line!r}",
                                 reference="inventory-invalid")
            child = m.group(1)
            if child not in declared:
                pending.setdefault(child, (n, "children", []))
            inv.add_child(group, child)
    for name, (n, st, _) in pending.items():
        if name in declared:
            continue
        if st == "vars":
            raise InputError(f"{path}:{n}: section [{name}:vars] names a group that is never declared",
                             hint=f"add a [{name}] or [{name}:children] section, or fix the name",
                             reference="inventory-invalid")
        raise InputError(f"{path}:{n}: a [...:children] section names group '{name}', which is never declared",
                         hint=f"add a [{name}] section (it may be empty), or fix the name",
                         reference="inventory-invalid")


# --- YAML ----------------------------------------------------------------------------------------

def _mapping(v: Any, where: str, what: str) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise InputError(f"{where}: {what} must be a mapping, not {type(v).__name__}", reference="inventory-invalid")
    return v


def parse_yaml(path: Path, data: dict[str, Any], inv: AnsibleInventory) -> None:
    def group(name: str, body: Any, parent: str | None) -> None:
        where = f"{path}: group '{name}'"
        if not isinstance(name, str):
            raise InputError(f"{path}: group name {name!r} must be a string", reference="inventory-invalid")
        inv.group(name)
        if parent is not None:
            inv.add_child(parent, name)
        body = _mapping(body, where, "a group")
        for key, val in body.items():
            if key == "vars":
                inv.set_group_vars(name, _mapping(val, where, "vars"))
            elif key == "hosts":
                for pat, hv in _mapping(val, where, "hosts").items():
                    if not isinstance(pat, (str, int)):
                        raise InputError(f"{where}: host name {pat!r} must be a string", reference="inventory-invalid")
                    names, port = _host_pattern(str(pat), where)
                    hv = _mapping(hv, f"{where}: host '{pat}'", "host vars")
                    for h in names:
                        inv.add_host(name, h, dict(hv), port)
            elif key == "children":
                for child, cbody in _mapping(val, where, "children").items():
                    group(child, cbody, name)
            # other keys: Ansible skips them (with a warning)

    for name, body in data.items():
        group(name, body, None)


# --- ansible-inventory --list JSON ---------------------------------------------------------------

def parse_list_json(path: Path, data: dict[str, Any], inv: AnsibleInventory) -> None:
    meta = _mapping(data.get("_meta"), f"{path}: _meta", "_meta")
    hostvars = _mapping(meta.get("hostvars"), f"{path}: _meta.hostvars", "hostvars")
    for name, body in data.items():
        if name == "_meta":
            continue
        where = f"{path}: group '{name}'"
        if isinstance(body, list):  # the short form: a list of hosts
            body = {"hosts": body}
        body = _mapping(body, where, "a group")
        inv.group(name)
        for h in body.get("hosts") or []:
            inv.add_host(name, str(h), {})
        for c in body.get("children") or []:
            inv.add_child(name, str(c))
        inv.set_group_vars(name, _mapping(body.get("vars"), where, "vars"))
    for h, hv in hostvars.items():
        if h in inv.hosts:
            inv.hosts[h].update(_mapping(hv, f"{path}: _meta.hostvars.{h}", "host vars"))


def ansible_inventory_tool() -> str | None:
    """`ansible-inventory` beside this Python (a venv), else on PATH."""
    here = Path(sys.executable).parent / "ansible-inventory"
    return str(here) if here.is_file() else shutil.which("ansible-inventory")


def run_list(source: Path) -> dict[str, Any]:
    """`ansible-inventory -i SOURCE --list`, bounded in time and size."""
    tool = ansible_inventory_tool()
    if tool is None:
        raise InputError(f"{source}: an inventory script or plugin: only Ansible can read it, and "
                         "ansible-inventory is not installed",
                         hint="pip install ansible-core, or run 'ansible-inventory -i SOURCE --list > inv.json' "
                              "where Ansible is and pass -i inv.json", reference="inventory-invalid")
    try:
        p = subprocess.run([tool, "-i", str(source), "--list"], capture_output=True, timeout=LIST_TIMEOUT,
                           stdin=subprocess.DEVNULL, check=False)
    except subprocess.TimeoutExpired:
        raise InputError(f"{source}: 'ansible-inventory --list' took more than {LIST_TIMEOUT:.0f} s",
                         reference="inventory-invalid") from None
    if p.returncode != 0 or len(p.stdout) > MAX_FILE_BYTES:
        tail = p.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["(no message)"]
        raise InputError(f"{source}: 'ansible-inventory -i {source} --list' failed (exit {p.returncode}): "
                         f"{tail[0][:300]}", hint="run it yourself to see why", reference="inventory-invalid")
    try:
        data = json.loads(p.stdout)
    except ValueError:
        raise InputError(f"{source}: 'ansible-inventory --list' did not print JSON",
                         reference="inventory-invalid") from None
    return _mapping(data, f"{source}: ansible-inventory --list", "its output")


# --- group_vars/ and host_vars/ -------------------------------------------------------------------

def _vars_file(path: Path) -> dict[str, Any]:
    text = _read(path, "vars")
    data = json.loads(text) if path.suffix == ".json" and text.lstrip().startswith("{") else _yaml(text, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: a vars file must hold a mapping, not {type(data).__name__}",
                         reference="inventory-invalid")
    return data


def _vars_for(base: Path, name: str) -> dict[str, Any] | None:
    """group_vars/NAME(.yml|.yaml|.json) and the files of group_vars/NAME/, in name order."""
    found: list[Path] = []
    for ext in VARS_EXTS:
        p = base / f"{name}{ext}"
        if p.is_file():
            found.append(p)
        elif ext == "" and p.is_dir():
            for root, dirs, files in os.walk(p):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for f in sorted(files):
                    fp = Path(root) / f
                    if not f.startswith(".") and not f.endswith("~") and fp.suffix in VARS_EXTS:
                        found.append(fp)
    if not found:
        return None
    out: dict[str, Any] = {}
    for p in found:
        out.update(_vars_file(p))
    return out


def load_vars_dirs(inv: AnsibleInventory, base: Path) -> None:
    for kind, names, into in (("group_vars", inv.groups, inv.group_files), ("host_vars", inv.hosts, inv.host_files)):
        d = base / kind
        if not d.is_dir():
            continue
        for name in names:
            v = _vars_for(d, name)
            if v is not None:
                into[name] = v


# --- load ----------------------------------------------------------------------------------------

def load(path: Path, kind: str | None = None) -> AnsibleInventory:
    """Parse the Ansible inventory `path` (`kind` as detect() says), with its vars directories."""
    kind = kind or detect(path)
    inv = AnsibleInventory(source=path, groups={}, hosts={})
    inv.group("all")
    inv.group("ungrouped")
    if kind == "ansible-tool":
        parse_list_json(path, run_list(path), inv)
    else:
        text = _read(path)
        if kind == "ansible-json":
            parse_list_json(path, _mapping(_yaml(text, path), str(path), "an inventory"), inv)
        elif kind == "ansible-yaml":
            parse_yaml(path, _yaml(text, path), inv)
        else:
            parse_ini(path, text, inv)
    inv.reconcile()
    load_vars_dirs(inv, path.resolve().parent)
    return inv
