"""transport/direct.py: a host with no gateway is reached with paramiko alone, resolved exactly as
fabric's Connection resolves it; a host that needs fabric (ProxyJump, ProxyCommand, a fabric config
file, `Match exec`, a user@host:port shorthand) is handed back to fabric. Issue 17: fabric imports
invoke, which imports unittest.mock and asyncio (~75 ms of every command's start)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetctl.config import ssh_config as sshcfg
from fleetctl.transport import direct, internals


@pytest.fixture(autouse=True)
def _fresh_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sshcfg, "_parsed", {})
    monkeypatch.setattr(direct, "_fabric_files", [])


SSH_CONFIG = """
Host alias
    HostName 127.0.0.5
    User deployer
    Port 2222
    IdentityFile ~/.ssh/alias_key
    ConnectTimeout 7

Host partial
    Port 2200

Host jumped
    HostName 127.0.0.9
    ProxyJump bastion

Host proxied
    ProxyCommand nc %h %p

Host bastion
    HostName 127.0.0.6

Host *.example
    User wild
    IdentityFile /keys/wild
"""


def _fabric(target: str, cfg: Path | None, user: str | None, port: int | None, kw: dict[str, Any]) -> dict[str, Any]:
    from fabric import Config, Connection

    config = Config(runtime_ssh_path=str(cfg)) if cfg else Config()
    conn = Connection(target, user=user, port=port, config=config, connect_timeout=5, connect_kwargs=dict(kw))
    return {"kwargs": internals.open_kwargs(conn), "host": conn.host, "original": conn.original_host,
            "ssh_config": dict(conn.ssh_config)}


def _direct(target: str, cfg: Path | None, user: str | None, port: int | None, kw: dict[str, Any]) -> dict[str, Any]:
    conn = direct.direct_connection(target, cfg, user=user, port=port, connect_timeout=5, connect_kwargs=dict(kw))
    assert conn is not None, target
    return {"kwargs": conn.open_kwargs(), "host": conn.host, "original": conn.original_host,
            "ssh_config": dict(conn.ssh_config)}


CASES = [
    ("127.0.0.1", "root", 2222, {"key_filename": ["/k/id"], "banner_timeout": 3, "auth_timeout": 3}),
    ("127.0.0.1", None, None, {"banner_timeout": 3, "auth_timeout": 3}),
    ("alias", None, None, {"banner_timeout": 3, "auth_timeout": 3}),
    ("alias", "root", 22, {"key_filename": ["/k/id"], "banner_timeout": 3, "auth_timeout": 3}),
    ("partial", None, None, {}),
    ("h1.example", None, 2022, {"key_filename": ["/k/id"]}),
    ("unknown-name", "u", None, {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] + ("-" + c[1] if c[1] else "") for c in CASES])
def test_direct_resolves_like_fabric(case: tuple[Any, ...], tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(SSH_CONFIG)
    target, user, port, kw = case
    got = _direct(target, cfg, user, port, kw)
    assert got == _fabric(target, cfg, user, port, kw)
    if target == "alias" and user is None:  # the case is not vacuous: ssh_config decided these
        assert got["kwargs"]["hostname"] == "127.0.0.5" and got["kwargs"]["port"] == 2222
        assert got["kwargs"]["username"] == "deployer" and got["kwargs"]["key_filename"][0].endswith("alias_key")


def test_direct_reads_the_default_ssh_configs_like_fabric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ssh_config in the inventory: fabric reads ~/.ssh/config (then /etc/ssh/ssh_config)."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh" / "config").write_text(SSH_CONFIG)
    monkeypatch.setenv("HOME", str(tmp_path))
    got = _direct("alias", None, None, None, {})
    assert got == _fabric("alias", None, None, None, {})
    assert got["kwargs"]["hostname"] == "127.0.0.5"


@pytest.mark.parametrize("target", ["jumped", "proxied", "root@127.0.0.1", "127.0.0.1:22"])
def test_a_host_that_needs_fabric_goes_to_fabric(target: str, tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text(SSH_CONFIG)
    assert direct.direct_connection(target, cfg, user=None, port=None, connect_timeout=5, connect_kwargs={}) is None
    assert direct.direct_connection("alias", cfg, user=None, port=None, connect_timeout=5, connect_kwargs={})


def test_match_exec_or_a_fabric_config_file_goes_to_fabric(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Match host alias exec \"true\"\n    Port 2201\n" + SSH_CONFIG)
    assert direct.direct_connection("alias", cfg, user=None, port=None, connect_timeout=5, connect_kwargs={}) is None
    plain = tmp_path / "plain_config"
    plain.write_text(SSH_CONFIG)
    fab = tmp_path / ".fabric.yaml"
    monkeypatch.setattr(direct, "FABRIC_FILES", (str(fab),))
    assert direct.direct_connection("alias", plain, user=None, port=None, connect_timeout=5, connect_kwargs={})
    fab.write_text("connect_kwargs: {}\n")
    monkeypatch.setattr(direct, "_fabric_files", [])
    assert direct.direct_connection("alias", plain, user=None, port=None, connect_timeout=5, connect_kwargs={}) is None


_FRESH = """
import json, sys
from pathlib import Path
from fleetctl.transport import internals
from fleetctl.transport.internals import paramiko
out = {"invoke_at_import": "invoke" in sys.modules}
cfg = paramiko.SSHConfig.from_text(Path(sys.argv[1]).read_text())
try:
    cfg.lookup("alias")
    out["before"] = "matched"
except ImportError:
    out["before"] = "ImportError"
internals.with_invoke()
out["after"] = cfg.lookup("alias").get("port")
print(json.dumps(out))
"""


def test_paramiko_is_imported_without_invoke_and_match_exec_is_restored(tmp_path: Path) -> None:
    """paramiko without invoke (no unittest.mock/asyncio), and `Match exec` still works once a
    host goes through fabric (with_invoke)."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Match host alias exec \"true\"\n    Port 2201\n")
    p = subprocess.run([sys.executable, "-c", _FRESH, str(cfg)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout) == {"invoke_at_import": False, "before": "ImportError", "after": "2201"}


def test_private_key_parsed_once_per_file_and_left_to_paramiko_when_unusual(tmp_path: Path) -> None:
    """The identity file is parsed once while unchanged (not per connection and key type); an
    encrypted key, a certificate beside it or an unreadable file are left to paramiko's own handling."""
    plain = tmp_path / "id_plain"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(plain)], check=True)
    a = direct._loaded_key(str(plain))
    assert a is not None and a is direct._loaded_key(str(plain))
    plain.write_bytes(plain.read_bytes())  # rewritten: parsed again (a new stamp)
    assert direct._loaded_key(str(plain)) == a
    secret = tmp_path / "id_secret"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "pass phrase", "-f", str(secret)], check=True)
    assert direct._loaded_key(str(secret)) is None
    (tmp_path / "id_plain-cert.pub").write_text("ssh-ed25519-cert-v01@openssh.com AAAA test\n")
    assert direct._loaded_key(str(plain)) is None
    assert direct._loaded_key(str(tmp_path / "missing")) is None
