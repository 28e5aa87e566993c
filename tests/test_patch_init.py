"""`fleetctl patch init` (issue 30.4): a complete playbook directory from a user's edits in a real git
checkout or a diff, on the real release files; and `launch` refusing a playbook whose launch: section
is missing or not filled in, before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fleetctl.config.playbook import load_playbook
from fleetctl.engines import engine, wheels
from fleetctl.patching import apply_patch

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = ROOT / "playbooks" / "dynamic-spec-disable" / "patches" / "0.5.9"
V = "0.5.9"
EW = "srt/speculative/eagle_worker.py"
EW2 = "srt/speculative/eagle_worker_v2.py"
SA = "srt/server_args.py"
MARKER = "Dynamic speculation disable enabled (worker="


def fleetctl(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetctl", *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=cwd)


def git(*args: str | Path, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_NOSYSTEM": "1",
           "HOME": str(cwd)}
    return subprocess.run(["git", *map(str, args)], cwd=cwd, env=env, check=True, capture_output=True, text=True,
                          timeout=60).stdout


def checkout(tmp_path: Path, edited: dict[str, str]) -> Path:
    """A source checkout holding `V`'s files, committed, then edited (uncommitted) by the payload's patches."""
    repo = tmp_path / "sglang"
    for rel in edited:
        target = repo / "python" / "sglang" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(wheels.pristine_bytes(V, rel))
    (repo / "README.md").write_text("checkout\n")
    git("init", "-q", "-b", "main", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", f"sglang {V}", cwd=repo)
    for rel, diff in edited.items():
        target = repo / "python" / "sglang" / rel
        target.write_bytes(apply_patch(target.read_bytes(), (PAYLOAD / diff).read_bytes(), name=rel).output)
    (repo / "README.md").write_text("checkout, edited\n")  # outside the package: not part of the patch
    return repo


def test_init_from_a_checkout_makes_a_playbook_that_runs_the_patched_worker(tmp_path: Path) -> None:
    repo = checkout(tmp_path, {EW: "eagle_worker.py.diff", SA: "server_args.py.diff"})
    proc = fleetctl("patch", "init", "my-dsd", "--release", V, "--git", repo, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pb_dir = tmp_path / "my-dsd"
    pb = load_playbook(pb_dir)
    # pins: each patch reproduces the edited file from the release's pristine bytes
    assert sorted(f.path for f in pb.versions[V]) == [SA, EW]
    for f in pb.versions[V]:
        assert f.sha256 == wheels.sha256_bytes(wheels.pristine_bytes(V, f.path))
        got = apply_patch(wheels.pristine_bytes(V, f.path), f.patch_text, name=f.path).output
        assert got == (repo / "python" / "sglang" / f.path).read_bytes()
    # launch: the release runs the worker the edits changed (the file patched), with the flag they add
    res = engine().resolve_worker(V, dict(pb.launch.flags), {k: str(v) for k, v in pb.launch.env.items()})
    assert res.worker_file == EW and not res.startup_error
    assert "--speculative-disable-batch-threshold" in pb.launch.flags
    # the marker is the added log line's constant start, placed in the worker's __init__
    assert pb.verify.markers == [MARKER]
    site = pb.marker_site(MARKER)
    assert (site.where, site.function, site.per_rank) == ("worker", "__init__", True) and pb.covers.worker
    text = (pb_dir / "playbook.yaml").read_text()
    assert "# README" in text and "# the target model" in text and f"runs {res.worker_class}" in text
    # patch check passes and names what is left to fill; once filled it names nothing
    check = fleetctl("patch", "check", pb_dir)
    assert check.returncode == 0, check.stdout + check.stderr
    for key in ("launch.flags.--model-path", "launch.flags.--speculative-draft-model-path",
                "launch.flags.--speculative-disable-batch-threshold"):
        assert f"to fill: {key} in" in check.stderr
    doc = yaml.safe_load(text)
    doc["launch"]["flags"].update({"--model-path": "meta-llama/Llama-3.1-8B-Instruct",
                                   "--speculative-draft-model-path": "d", "--speculative-disable-batch-threshold": 16})
    (pb_dir / "playbook.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    check = fleetctl("patch", "check", pb_dir)
    assert check.returncode == 0 and "to fill" not in check.stderr + check.stdout, check.stdout + check.stderr


def test_init_from_the_origin_edit_pins_the_v2_worker_and_its_env(tmp_path: Path) -> None:
    """The origin story's edit (eagle_worker_v2.py only, 0.5.9): the launch written runs EAGLEWorkerV2,
    so it carries the env that selects it, commented, instead of silently running EAGLEWorker."""
    repo = checkout(tmp_path, {EW2: "eagle_worker_v2.py.diff", SA: "server_args.py.diff"})
    proc = fleetctl("patch", "init", "origin", "--release", V, "--git", repo, "--dir", tmp_path / "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pb = load_playbook(tmp_path / "out")
    env = {k: str(v) for k, v in pb.launch.env.items()}
    assert engine().resolve_worker(V, dict(pb.launch.flags), env).worker_file == EW2
    assert env, "the env that selects the v2 worker on 0.5.9 must be written"
    text = (tmp_path / "out" / "playbook.yaml").read_text()
    env_line = next(ln for ln in text.splitlines() if ln.strip().startswith(next(iter(env))))
    assert "#" in env_line and "another worker" in env_line
    assert f"fleetctl patch check {tmp_path / 'out'}" in text  # the README's commands name the directory made


def test_init_from_a_diff_with_package_relative_paths(tmp_path: Path) -> None:
    proc = fleetctl("patch", "init", "from-diff", "--release", V, "--diff", PAYLOAD / "eagle_worker.py.diff",
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    pb = load_playbook(tmp_path / "from-diff")
    assert [f.path for f in pb.versions[V]] == [EW] and pb.verify.markers == [MARKER]


@pytest.mark.parametrize("args, needle", [
    (["--release", "0.5.14", "--diff", PAYLOAD / "eagle_worker.py.diff"], "0.5.14"),  # edits of another release
    (["--release", V], "one source of edits"),
    (["--release", V, "--range", "a..b", "--diff", PAYLOAD / "eagle_worker.py.diff"], "--range needs --git"),
])
def test_init_bad_input_is_one_line_exit_2(tmp_path: Path, args: list, needle: str) -> None:
    proc = fleetctl("patch", "init", "x", *args, cwd=tmp_path)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()


def test_init_refuses_a_release_fleetctl_does_not_know_before_asking_the_registry(tmp_path: Path) -> None:
    """`patch init x --release 0.5.99` ran `pip download sglang==0.5.99` (seconds, the network) and
    then said "cannot fetch". A release the engine's table lacks is refused at once: one line naming
    the releases fleetctl knows and how to add one, exit 2, and the wheel cache is never touched (its
    wheels/ dir is made by the first fetch). The registry here is a port nobody listens on."""
    cache = tmp_path / "cache"
    known = engine().known_versions()
    for release in ("0.5.99", "0.4.0"):
        proc = subprocess.run([sys.executable, "-m", "fleetctl", "patch", "init", "x", "--release", release, "--diff",
                               PAYLOAD / "eagle_worker.py.diff"], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env={**os.environ, "FLEETCTL_CACHE_DIR": str(cache),
                                                 "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PYTHONPATH": str(ROOT)})
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith(f"error: --release {release}: fleetctl does not know SGLang {release} "
                               f"(it knows {known[0]} .. {known[-1]})") and "releases.py" in line, line
        assert not (cache / "wheels").exists() and not (tmp_path / "x").exists()
    # the tools that only need the release's wheel (patch new, port --to, import, sandbox up) may ask the
    # registry for a release fleetctl does not know yet (a newer one): asked once, and the line says
    # which releases fleetctl knows
    (tmp_path / "mine.py").write_text("x = 1\n")
    proc = subprocess.run([sys.executable, "-m", "fleetctl", "patch", "new", "--sglang", "0.5.99", "--file", SA,
                           "mine.py"], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "FLEETCTL_CACHE_DIR": str(cache), "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                               "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: cannot fetch sglang==0.5.99: ") and f"fleetctl knows SGLang {known[0]} .. " in line


def test_init_refuses_a_clean_checkout_and_an_existing_playbook(tmp_path: Path) -> None:
    repo = checkout(tmp_path, {EW: "eagle_worker.py.diff"})
    assert fleetctl("patch", "init", "a", "--release", V, "--git", repo, cwd=tmp_path).returncode == 0
    again = fleetctl("patch", "init", "a", "--release", V, "--git", repo, cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr
    git("checkout", "--", ".", cwd=repo)
    clean = fleetctl("patch", "init", "b", "--release", V, "--git", repo, cwd=tmp_path)
    assert clean.returncode == 2 and "no uncommitted change" in clean.stderr


# ---------------------------------------------------------------- launch refuses an unfinished launch:


@pytest.mark.fleet
@pytest.mark.usefixtures("ledger_dir")
def test_launch_refuses_no_launch_section_and_placeholders(tmp_path: Path, fresh_sandbox) -> None:
    sb = fresh_sandbox(hosts=1, versions=(V,), gpus=1)
    pb_dir = tmp_path / "pb"
    (pb_dir / "patches").mkdir(parents=True)
    (pb_dir / "patches" / "ew.diff").write_bytes((PAYLOAD / "eagle_worker.py.diff").read_bytes())
    sha = wheels.sha256_bytes(wheels.pristine_bytes(V, EW))
    base = f'name: nolaunch\nversions:\n  "{V}":\n    files:\n      - {{path: {EW}, patch: patches/ew.diff, sha256: {sha}}}\n'
    (pb_dir / "playbook.yaml").write_text(base)
    proc = fleetctl("launch", "-i", sb.inventory_path, pb_dir)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "no launch: section" in lines[0], proc.stderr
    assert "--model-path" in lines[0] and "Traceback" not in proc.stderr
    (pb_dir / "playbook.yaml").write_text(base + 'launch:\n  flags: {--model-path: "<FILL: the model>"}\n')
    proc = fleetctl("launch", "-i", sb.inventory_path, pb_dir)
    assert proc.returncode == 2 and "launch.flags.--model-path still holds a placeholder" in proc.stderr
    # a launch: section naming no model: refused on the host's plan (nothing started), not launched model-less
    (pb_dir / "playbook.yaml").write_text(base + "launch:\n  port: 30000\n")
    proc = fleetctl("launch", "-i", sb.inventory_path, pb_dir)
    assert proc.returncode == 1 and "names no target model" in proc.stdout + proc.stderr, proc.stdout + proc.stderr


def test_init_with_the_users_launch_keeps_it_and_names_the_origin_mistake(tmp_path: Path) -> None:
    """--launch: the user's own command line is the launch: section; when it runs a worker the edits
    do not change (the origin story: v2 edited, SGLANG_ENABLE_SPEC_V2 unset on 0.5.9), init says so."""
    repo = checkout(tmp_path, {EW2: "eagle_worker_v2.py.diff", SA: "server_args.py.diff"})
    cmd = ("python -m sglang.launch_server --model-path meta-llama/Llama-3.1-8B-Instruct --speculative-algorithm "
           "EAGLE3 --speculative-draft-model-path d --speculative-num-steps 3 --speculative-eagle-topk 1 "
           "--speculative-num-draft-tokens 4 --port 30000")
    proc = fleetctl("patch", "init", "mine", "--release", V, "--git", repo, "--launch", cmd, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"runs EAGLEWorker from {EW}, which your edits do not change" in proc.stderr, proc.stderr
    pb = load_playbook(tmp_path / "mine")
    assert pb.launch.flags["--model-path"] == "meta-llama/Llama-3.1-8B-Instruct" and "--port" not in pb.launch.flags
    text = (tmp_path / "mine" / "playbook.yaml").read_text()
    assert "\n# WARNING: with your launch SGLang 0.5.9 runs EAGLEWorker" in text and "Note: WARNING" not in text
    # the same launch with the env that selects the v2 worker: kept, and no warning
    proc = fleetctl("patch", "init", "mine2", "--release", V, "--git", repo, "--launch",
                    "SGLANG_ENABLE_SPEC_V2=1 " + cmd, cwd=tmp_path)
    assert proc.returncode == 0 and "warning" not in proc.stderr.lower(), proc.stderr
    assert load_playbook(tmp_path / "mine2").launch.env == {"SGLANG_ENABLE_SPEC_V2": "1"}


def test_a_marker_from_a_print_is_checked_once_not_per_rank() -> None:
    """A print() line carries no rank prefix (SGLang's format is its logger's): verify-logs cannot tell
    which rank printed it, so the scaffold declares such a marker per_rank: false (it was true, and
    verify-logs then failed the launch that printed it on every rank)."""
    from fleetctl.engines.sglang.scaffold import added_markers

    pristine = wheels.pristine_bytes("0.5.12", "srt/layers/attention/triton_backend.py")
    anchor = b"        # Parse args\n        self.skip_prefill = skip_prefill\n"
    assert pristine.count(anchor) == 1
    patched = pristine.replace(anchor, b'        print("Triton split-kv tuning enabled", flush=True)\n' + anchor)
    (m,) = added_markers("0.5.12", "srt/layers/attention/triton_backend.py", pristine, patched)
    assert m.text == "Triton split-kv tuning enabled" and m.cls == "TritonAttnBackend" and m.per_rank is False
    logged = patched.replace(b'print("Triton', b'logger.info("Triton')
    (m,) = added_markers("0.5.12", "srt/layers/attention/triton_backend.py", pristine, logged)
    assert m.per_rank is True
