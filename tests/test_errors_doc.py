"""Error references (issue 33.4): every reference the code can give an error is listed in
docs/errors.md, every one listed there is used, each is kebab-case, and the --json error envelope
carries the reference of the error the command ended with."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from fleetctl.cli import main
from fleetctl.errors import REFERENCE, FleetctlError, InputError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "errors.md"
NAMES = ("reference", "last_reference")


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _names(target: ast.AST) -> set[str]:
    return {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(target)
            if isinstance(n, ast.Name | ast.Attribute)}


def code_references() -> dict[str, set[str]]:
    """reference -> the files that give it: `reference="x"` keywords, `reference = "x"` (a class's
    default, the CLI's), the "reference" key of a dict, and the values of a *REFERENCES table."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "fleetctl").rglob("*.py")):
        if "remote" in path.parts:  # the agent's own error kinds are mapped (transport/base.py KIND_REFERENCES)
            continue
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            refs: set[str] = set()
            if isinstance(node, ast.keyword) and node.arg == "reference":
                refs = _strings(node.value)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                named = set().union(*(_names(t) for t in targets))
                if node.value is not None and (named & set(NAMES) or any(n.endswith("REFERENCES") for n in named)):
                    table = node.value.values if isinstance(node.value, ast.Dict) else [node.value]
                    refs = {s for v in table for s in _strings(v)}
            elif isinstance(node, ast.Dict):
                refs = {s for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and k.value == "reference" for s in _strings(v)}
            for r in refs:
                found.setdefault(r, set()).add(rel)
    return found


def doc_references() -> list[str]:
    """The first column of the doc's tables: `| \\`reference\\` | ...`."""
    return re.findall(r"^\| `([^`]+)` \|", DOC.read_text(encoding="utf-8"), flags=re.M)


def test_every_reference_in_the_code_is_in_the_doc_and_back() -> None:
    code, doc = code_references(), doc_references()
    assert len(doc) == len(set(doc)), "a reference is listed twice in docs/errors.md"
    assert len(code) > 30  # the collector sees the raise sites (a refactor that hides them fails here)
    missing = {r: sorted(f) for r, f in code.items() if r not in doc}
    assert not missing, f"used in the code, not listed in docs/errors.md: {missing}"
    unused = sorted(set(doc) - set(code))
    assert not unused, f"listed in docs/errors.md, used nowhere in the code: {unused}"
    bad = sorted(r for r in code if not REFERENCE.fullmatch(r))
    assert not bad, f"not kebab-case: {bad}"


def test_a_reference_is_kebab_case_and_a_class_gives_its_default() -> None:
    assert InputError("x").reference == "bad-input" and FleetctlError("x").reference == "failed"
    assert InputError("x", reference="inventory-not-found").reference == "inventory-not-found"
    with pytest.raises(ValueError, match="kebab-case"):
        InputError("x", reference="Inventory_Not_Found")


@pytest.mark.parametrize(("args", "reference"), [
    (["status", "--json", "--no-such-option"], "usage-error"),
    (["status", "--json", "-i", "/nonexistent/inventory.yaml"], "inventory-not-found"),
    (["patch", "check", "--json", "/nonexistent/pb"], "playbook-not-found"),
    (["history", "nosuchid", "--json"], "op-id-unknown"),
    (["rollback", "--json", "-i", "/nonexistent/inventory.yaml", "--to", "x1"], "deploy-id-invalid"),
])
def test_the_error_envelope_names_the_reference(args: list[str], reference: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path))
    capsys.readouterr()
    code = main(args)
    doc = json.loads(capsys.readouterr().out)
    assert code == 2 and doc["error"]["reference"] == reference, doc
    assert reference in doc_references()
