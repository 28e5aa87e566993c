"""Add one version's entry to a playbook YAML file as text, keeping every other byte (comments,
order, folded strings) as it was. The result is parsed back and checked before anyone writes it."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass

import yaml

from fleetctl.errors import InputError


@dataclass(frozen=True)
class NewFile:
    path: str  # relative to the package dir
    patch: str  # relative to the playbook file
    sha256: str


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version))


def version_entry(version: str, files: list[NewFile], unsupported: dict[str, str], *, indent: int,
                  note: str | None = None) -> str:
    pad = " " * indent
    out = [f'{pad}"{version}":\n', f"{pad}  files:\n"]
    for f in files:
        out += [f"{pad}    - path: {_scalar(f.path)}\n", f"{pad}      patch: {_scalar(f.patch)}\n",
                f"{pad}      sha256: {_scalar(f.sha256)}\n"]
    if unsupported:
        if note:
            out.append(f"{pad}  # {note}\n")
        out.append(f"{pad}  unsupported_workers:\n")
        for worker, why in unsupported.items():
            out += [f"{pad}    {line}\n" for line in _mapping_line(worker, why)]
    return "".join(out)


def _scalar(value: str) -> str:
    """`value` plain when YAML reads it back as that same string (a digest of digits only would be an
    int), else double-quoted (JSON strings are YAML)."""
    try:
        plain_ok = yaml.safe_load(value) == value and "#" not in value and ": " not in value
    except yaml.YAMLError:
        plain_ok = False
    return value if plain_ok and value.strip() == value else json.dumps(value)


def _mapping_line(key: str, value: str) -> list[str]:
    """`key: >-` and the value folded at ~96 columns when folding keeps it exact, else PyYAML's form."""
    plain = re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) and value == " ".join(value.split()) and value
    if plain and not any(c in value for c in "#\t"):
        lines = textwrap.wrap(value, width=92, break_long_words=False, break_on_hyphens=False)
        return [f"{key}: >-", *(f"  {line}" for line in lines)]
    return yaml.safe_dump({key: value}, width=96, allow_unicode=False).splitlines()


def add_version(text: str, where: str, version: str, files: list[NewFile], unsupported: dict[str, str],
                *, note: str | None = None) -> str:
    """`text` with `version`'s entry added under `versions:` (in version order). `where` names the
    file in errors."""
    try:
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        raise InputError(f"{where}: not valid YAML: {e}", reference="playbook-edit-refused") from None
    if not isinstance(root, yaml.MappingNode):
        raise InputError(f"{where}: the playbook is not a mapping", reference="playbook-edit-refused")
    vers = next((v for k, v in root.value if isinstance(k, yaml.ScalarNode) and k.value == "versions"), None)
    if not isinstance(vers, yaml.MappingNode) or vers.flow_style or not vers.value:
        raise InputError(f"{where}: 'versions:' is not a block mapping with entries",
                         hint="write versions: as a block mapping (one version per key) to let fleetctl add one",
                         reference="playbook-edit-refused")
    if any(k.value == version for k, _ in vers.value):
        raise InputError(f"{where}: the playbook already has an entry for SGLang {version}",
                         hint=f"remove the {version} entry first to port again", reference="playbook-version-exists")
    indent = vers.value[0][0].start_mark.column
    entry = version_entry(version, files, unsupported, indent=indent, note=note)
    lines = text.splitlines(keepends=True)
    later = [k for k, _ in vers.value if _version_key(k.value) > _version_key(version)]
    if later:
        at = later[0].start_mark.line
        while at > 0 and lines[at - 1].strip().startswith("#"):
            at -= 1  # comments just above a key belong to it
        new = [*lines[:at], entry, "\n", *lines[at:]]
    else:
        at = min(vers.end_mark.line, len(lines))
        while at > 0 and (not lines[at - 1].strip() or lines[at - 1].startswith("#")):
            at -= 1  # blank lines and top-level comments before the next key stay with it
        head = lines[:at]
        if head and not head[-1].endswith("\n"):
            head[-1] += "\n"
        new = [*head, "\n", entry, *lines[at:]]
    out = "".join(new)
    _check_round_trip(text, out, where, version, files, unsupported)
    return out


def _check_round_trip(old: str, new: str, where: str, version: str, files: list[NewFile],
                      unsupported: dict[str, str]) -> None:
    """The edit added exactly the entry and changed nothing else, or it is not written."""
    before, after = yaml.safe_load(old), yaml.safe_load(new)
    want = {"files": [{"path": f.path, "patch": f.patch, "sha256": f.sha256} for f in files]}
    if unsupported:
        want["unsupported_workers"] = dict(unsupported)  # type: ignore[assignment]
    got = after.get("versions", {}).pop(version, None)
    if got != want or after != before:
        raise InputError(f"{where}: cannot add the {version} entry without changing the rest of the file",
                         hint=f"add it by hand: {want}", reference="playbook-edit-refused")
