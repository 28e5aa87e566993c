"""The intended bytes of a playbook's files for one SGLang version, computed once on the
controller from the real pristine file (wheel cache) and the playbook's exact patch."""

from __future__ import annotations

from functools import lru_cache

from fleetctl import wheels
from fleetctl.config.playbook import Playbook
from fleetctl.errors import InputError
from fleetctl.plan import Intended, sha


@lru_cache(maxsize=256)
def _apply(version: str, rel: str, patch_text: bytes, expect_sha: str, where: str) -> Intended:
    from fleetctl.patching.engine import apply_patch

    pristine = wheels.pristine_bytes(version, rel)
    got = sha(pristine)
    if got != expect_sha:
        raise InputError(
            f"{where}: sha256 {expect_sha[:12]}… for {rel} does not match the real sglang {version} file ({got[:12]}…)",
            hint="the patch set was made for other bytes; regenerate it with 'fleetctl patch new'",
        )
    res = apply_patch(pristine, patch_text, name=f"{rel} (sglang {version})")
    try:
        compile(res.output, rel, "exec", dont_inherit=True)
    except SyntaxError as e:
        raise InputError(f"{where}: patched {rel} for sglang {version} does not compile: line {e.lineno}: {e.msg}",
                         hint="fix the patch") from None
    return Intended(rel, got, res.output, sha(res.output), list(res.offsets))


def intended_for(playbook: Playbook, version: str) -> dict[str, Intended] | None:
    files = playbook.files_for(version)
    if files is None:
        return None
    return {f.path: _apply(version, f.path, f.patch_text, f.sha256, str(f.patch_path)) for f in files}
