"""The kept playbook (config/playbook_cache.py): taken only when every input of load_playbook is what
it was loaded from (the playbook's bytes and real path, each patch's and state file's real path and
bytes, the code), equal to what load_playbook builds, never kept with a value JSON would change; and
a command whose playbook is kept imports neither pydantic nor PyYAML."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fleetctl.config import kept, playbook_cache
from fleetctl.config.playbook import load_playbook
from fleetctl.errors import InputError

pytestmark = pytest.mark.usefixtures("ledger_dir")

ROOT = Path(__file__).resolve().parent.parent
SHA = "ab" * 32


def _write(tmp: Path, extra: str = "") -> Path:
    d = tmp / "pb"
    (d / "patches" / "a").mkdir(parents=True, exist_ok=True)
    (d / "patches" / "b").mkdir(parents=True, exist_ok=True)
    (d / "patches" / "a" / "w.diff").write_text("--- a\n+++ b\n")
    (d / "patches" / "b" / "w.diff").write_text("--- other\n+++ b\n")
    (d / "patches" / "s.diff").write_text("--- s\n+++ s\n")
    (d / "patches" / "w.diff").symlink_to("a/w.diff")
    (d / "files").mkdir(exist_ok=True)
    (d / "files" / "adaptive.json").write_bytes(b'{"threshold": 16}\n')
    (d / "playbook.yaml").write_text(
        "name: kept-test\n"
        "description: a playbook to keep\n"
        "versions:\n"
        "  '0.5.9':\n"
        "    files:\n"
        f"      - {{path: srt/speculative/eagle_worker.py, patch: patches/w.diff, sha256: {SHA}}}\n"
        f"      - {{path: srt/server_args.py, patch: ./patches/s.diff, sha256: {SHA}}}\n"
        "    unsupported_workers: {EAGLEWorkerV2: not here}\n"
        "  '0.5.10': {files: [{path: srt/server_args.py, patch: patches/s.diff, sha256: " + SHA + "}]}\n"
        "launch:\n"
        "  flags: {--tp-size: 2, --x: 1.5, --y: true, --z: null, --cfg: '{file:adaptive.json}'}\n"
        "  env: {A: '1', B: 2, C: false}\n"
        "  layout: {gpus_per_instance: 2, port_stride: 10}\n"
        "  ready_timeout: 60\n"
        "verify:\n"
        "  markers: [M1, M2]\n"
        "  never_fires_when: [{arg: a, at_least: b, why: c}]\n"
        "covers:\n"
        "  worker: true\n"
        "  files: [srt/server_args.py]\n"
        "  markers:\n"
        "    - {text: M1, where: worker}\n"
        "    - {text: M2, where: file, file: srt/server_args.py, class: ServerArgs, function: f, per_rank: false}\n"
        "  report_args: [tp_size]\n"
        "state_files:\n"
        "  - {name: adaptive.json, source: files/adaptive.json, mode: 384}\n" + extra)
    return d


def test_the_kept_copy_equals_the_loaded_playbook(tmp_path: Path) -> None:
    d = _write(tmp_path)
    assert playbook_cache.lookup(d) is None
    first = playbook_cache.load(d)
    assert first == load_playbook(d)
    got = playbook_cache.lookup(d)
    assert got is not None and got == load_playbook(d)
    assert got.path == d / "playbook.yaml"
    assert got.covers.markers[1].cls == "ServerArgs" and got.launch.layout.port_stride == 10
    assert got.versions["0.5.9"][0].patch_text == b"--- a\n+++ b\n"
    assert got.state_files[0].data == b'{"threshold": 16}\n' and got.state_files[0].mode == 0o600
    assert playbook_cache.lookup(d / "playbook.yaml") == got  # the file or its directory alike


@pytest.mark.parametrize("change", ["playbook", "patch", "state_file", "symlink", "code", "moved", "gone"])
def test_any_other_input_finds_nothing(tmp_path: Path, change: str, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _write(tmp_path)
    playbook_cache.load(d)
    if change == "playbook":
        pb = d / "playbook.yaml"
        pb.write_text(pb.read_text().replace("ready_timeout: 60", "ready_timeout: 61"))
    elif change == "patch":  # the same playbook bytes, another patch
        (d / "patches" / "s.diff").write_text("--- s\n+++ changed\n")
    elif change == "state_file":
        (d / "files" / "adaptive.json").write_bytes(b'{"threshold": 8}\n')
    elif change == "symlink":  # patches/w.diff -> b/w.diff now
        (d / "patches" / "w.diff").unlink()
        (d / "patches" / "w.diff").symlink_to("b/w.diff")
    elif change == "code":
        monkeypatch.setattr(playbook_cache, "code_id", lambda: "other")
    elif change == "moved":
        d.rename(tmp_path / "elsewhere")
        d = tmp_path / "elsewhere"
    else:
        (d / "patches" / "s.diff").unlink()
    assert playbook_cache.lookup(d) is None
    if change == "gone":  # loading says what is wrong, as without a kept copy
        with pytest.raises(InputError, match=r"playbook.yaml:\d+: versions.0.5.9.files\[1\].patch: cannot read"):
            playbook_cache.load(d)
    elif change != "code":  # what loading gives now differs from the kept copy, and is kept
        assert playbook_cache.load(d) == load_playbook(d)
        assert playbook_cache.lookup(d) == load_playbook(d)


def test_a_value_json_changes_is_never_kept(tmp_path: Path) -> None:
    d = _write(tmp_path)
    playbook_cache.load(d)
    pb = d / "playbook.yaml"
    pb.write_text(pb.read_text().replace("--tp-size: 2", "--tp-size: 2, --since: 2024-01-02"))
    loaded = playbook_cache.load(d)  # a YAML date: not JSON; the copy before the edit is removed
    assert str(loaded.launch.flags["--since"]) == "2024-01-02"
    assert not kept.store("playbooks", pb).exists()
    assert playbook_cache.lookup(d) is None


@pytest.mark.parametrize("damage", ["cut", "type", "field", "marker"])
def test_a_damaged_copy_is_as_if_none_were_kept(tmp_path: Path, damage: str) -> None:
    d = _write(tmp_path)
    playbook_cache.load(d)
    f = kept.store("playbooks", d / "playbook.yaml")
    if damage == "cut":
        f.write_text(f.read_text()[:-40])
    else:
        doc = json.loads(f.read_text())
        if damage == "type":
            doc["playbook"]["launch"]["layout"]["gpus_per_instance"] = 0
        elif damage == "field":
            doc["playbook"]["launch"]["extra"] = 1
        else:
            doc["playbook"]["covers"]["markers"][1]["where"] = "file"
            doc["playbook"]["covers"]["markers"][1]["file"] = "../escape.py"
        f.write_text(json.dumps(doc))
    assert playbook_cache.lookup(d) is None


def test_a_state_file_grown_too_large_is_refused_as_when_loaded(tmp_path: Path) -> None:
    d = _write(tmp_path)
    playbook_cache.load(d)
    (d / "files" / "adaptive.json").write_bytes(b"x" * ((1 << 20) + 1))
    assert playbook_cache.lookup(d) is None
    with pytest.raises(InputError, match=r"adaptive.json is 1048577 bytes"):
        playbook_cache.load(d)


def test_nested_errors_name_their_line(tmp_path: Path) -> None:
    """The launch/verify/covers classes are plain dataclasses validated by pydantic: an unknown key,
    a bound and a wrong type still name the file, line and key."""
    d = _write(tmp_path)
    pb = d / "playbook.yaml"
    text = pb.read_text()
    for old, new, want in [
        ("port_stride: 10", "port_stride: 10, bogus: 1", r"playbook.yaml:13: launch.layout.bogus: unknown key"),
        ("gpus_per_instance: 2", "gpus_per_instance: 0", r"playbook.yaml:13: launch.layout: gpus_per_instance must "
                                                        r"be at least 1 \(got 0\)"),
        ("ready_timeout: 60", "ready_timeout: 0", r"playbook.yaml:10: launch: ready_timeout must be greater than 0"),
        ("ready_timeout: 60", "ready_timeout: soon", r"playbook.yaml:14: launch.ready_timeout: Input should be"),
        ("  layout: {gpus_per_instance: 2, port_stride: 10}\n", "  layout: 3\n",
         r"playbook.yaml:13: launch.layout: not a mapping"),
        ("function: f,", "function: f, klass: X,", r"playbook.yaml:\d+: covers.markers.1.klass: unknown key"),
        ("class: ServerArgs,", "", r"playbook.yaml:\d+: covers.markers.1: marker 'M2': where: file needs file:"),
        ("files: [srt/server_args.py]", "files: [../x.py]", r"playbook.yaml:\d+: covers: path '../x.py' escapes"),
    ]:
        assert old in text, old
        pb.write_text(text.replace(old, new))
        with pytest.raises(InputError, match=want):
            load_playbook(d)


def test_a_kept_playbook_loads_without_pydantic_or_yaml(tmp_path: Path) -> None:
    """What the cache is for: the second command on the same playbook imports neither."""
    d = _write(tmp_path)
    code = ("import sys; from pathlib import Path; from fleetctl.config import playbook_cache as c; "
            f"pb = c.load(Path({str(d)!r})); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'pydantic', 'yaml'}), pb.name)")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
            for _ in range(2)]
    assert runs == ["['pydantic', 'yaml'] kept-test\n", "[] kept-test\n"]
