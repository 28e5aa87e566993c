"""A local cache of an engine's real release wheels and their extracted package trees, for any
engine: `WheelCache(package, display_name, known_versions)`. It imports no engine (engine modules
that read their releases' sources make their own; fleetctl/engines/wheels.py binds the engine
fleetctl drives).

Wheels come from the package registry with `pip download --no-deps PACKAGE==V` and are cached once
per version; two processes at once build a wheel or a tree once (flocks), and a tree is complete or
absent (extracted beside it, renamed into place).

Cache dir: $FLEETCTL_CACHE_DIR, else $XDG_CACHE_HOME/fleetctl, else ~/.cache/fleetctl.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from fleetctl.errors import FleetctlError, InputError


def cache_dir() -> Path:
    env = os.environ.get("FLEETCTL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fleetctl"


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (made if missing) until the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class WheelCache:
    """The cached wheels and trees of one engine's package."""

    def __init__(self, package: str, display_name: str, known_versions: Sequence[str]) -> None:
        self.package = package  # the wheel distribution and its top-level package
        self.display_name = display_name
        self.known_versions = tuple(known_versions)
        self._records: dict[str, dict[str, str]] = {}

    def _find_wheel(self, d: Path, version: str) -> Path | None:
        hits = sorted(d.glob(f"{self.package}-{version}-*.whl"))
        return hits[0] if hits else None

    def ensure_wheel(self, version: str) -> Path:
        """Path of the cached wheel for `version`, downloading it on first use."""
        wdir = cache_dir() / "wheels"
        wdir.mkdir(parents=True, exist_ok=True)
        found = self._find_wheel(wdir, version)
        if found:
            return found
        with locked(wdir / ".lock"):
            found = self._find_wheel(wdir, version)
            if found:
                return found
            tmp = wdir / f".dl-{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            # a release fleetctl does not know may be a newer one (patch new/port/import, the sandbox take
            # it): asked once, no retries, so a version that is not there fails in about a second
            once = [] if version in self.known_versions else ["--retries", "0"]
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", *once,
                   "-q", "-d", str(tmp), f"{self.package}=={version}"]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            got = self._find_wheel(tmp, version)
            if proc.returncode != 0 or got is None:
                shutil.rmtree(tmp, ignore_errors=True)
                tail = (proc.stderr or proc.stdout).strip().splitlines()
                why = tail[-1] if tail else "no wheel downloaded"
                known = self.known_versions
                hint = ("check the package registry is reachable" if version in known else
                        f"fleetctl knows {self.display_name} {known[0]} .. {known[-1]}; another release must be in the "
                        "package registry, and the registry reachable")
                raise InputError(f"cannot fetch {self.package}=={version}: {why}", hint=hint, reference="release-unavailable")
            final = wdir / got.name
            os.replace(got, final)
            shutil.rmtree(tmp, ignore_errors=True)
            return final

    def extracted(self, version: str) -> Path:
        """Directory holding the wheel's full contents (package dir + dist-info), extracted once.

        Returns the site-packages-like root; the package itself is `root / self.package`.
        """
        root = cache_dir() / "trees" / version
        done = root / ".complete"
        if done.exists():
            return root
        wheel = self.ensure_wheel(version)
        with locked(cache_dir() / "trees" / f".{version}.lock"):
            if done.exists():
                return root
            tmp = root.with_name(f".{version}.tmp-{os.getpid()}")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            with zipfile.ZipFile(wheel) as zf:
                for info in zf.infolist():
                    name = info.filename
                    if name.startswith("/") or ".." in Path(name).parts:
                        raise FleetctlError(f"{wheel}: unsafe path in wheel: {name}", reference="wheel-cache-invalid")
                zf.extractall(tmp)
            # files are read-only in the cache: copies made from it must never share inodes
            shutil.rmtree(root, ignore_errors=True)
            os.replace(tmp, root)
            done.write_text(wheel.name + "\n")
        return root

    def package_dir(self, version: str) -> Path:
        return self.extracted(version) / self.package

    def pristine_bytes(self, version: str, rel: str) -> bytes:
        """The pristine bytes of `rel` (relative to the package dir) in release `version`."""
        p = self.package_dir(version) / rel
        try:
            return p.read_bytes()
        except FileNotFoundError:
            raise InputError(f"{self.package} {version} has no file {rel}", hint=self._file_hint(version, rel),
                             reference="release-file-missing") from None

    def _file_hint(self, version: str, rel: str) -> str:
        """What the path may have meant (the release's files named alike), for a playbook's path or a
        `patch new --file` alike."""
        root = self.package_dir(version)
        base = rel.rsplit("/", 1)[-1]
        close = sorted(str(p.relative_to(root)) for p in root.rglob(base))[:3] if base else []
        if close:
            return f"did you mean {' or '.join(close)}? paths are inside the {self.package} package"
        return f"paths are inside the {self.package} package, e.g. srt/server_args.py"

    def pristine_hashes(self, version: str) -> dict[str, str]:
        """sha256 (hex) of every file of the package in release `version`, relative to the package dir,
        as the wheel's own RECORD states them (no hashing of the tree). Cached per process."""
        if version not in self._records:
            import base64
            import csv
            import io

            wheel = self.ensure_wheel(version)
            with zipfile.ZipFile(wheel) as zf:
                name = next((n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1), None)
                if name is None:
                    raise FleetctlError(f"{wheel}: no RECORD in the wheel", reference="wheel-cache-invalid")
                text = zf.read(name).decode("utf-8")
            out: dict[str, str] = {}
            prefix = self.package + "/"
            for row in csv.reader(io.StringIO(text)):
                if len(row) < 2 or not row[0].startswith(prefix) or not row[1].startswith("sha256="):
                    continue
                digest = row[1][len("sha256="):]
                out[row[0][len(prefix):]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
            self._records[version] = out
        return self._records[version]

    def verified_pristine(self, version: str, rel: str, expect_sha: str | None = None) -> bytes:
        """The pristine bytes of `rel` in `version`, checked against the wheel's RECORD and, if given, the
        sha256 a playbook states for it, before anyone writes them anywhere."""
        data = self.pristine_bytes(version, rel)
        got = sha256_bytes(data)
        rec = self.pristine_hashes(version).get(rel)
        if rec is None or got != rec:
            raise FleetctlError(f"{self.package} {version}: cached {rel} hashes {got[:12]}, the wheel's RECORD says "
                                f"{(rec or 'nothing')[:12]}", hint=f"remove {cache_dir() / 'trees' / version} to re-extract",
                                reference="wheel-cache-invalid")
        if expect_sha is not None and got != expect_sha:
            raise InputError(f"{self.package} {version}: pristine {rel} hashes {got[:12]}, the playbook says {expect_sha[:12]}",
                             hint="check the playbook's sha256 for this file and version",
                             reference="pristine-hash-mismatch")
        return data
