"""Where a launch's target model config.json lives on the host, and its `architectures[0]`.

SGLang's model-specific ServerArgs adjustments key on the target's `architectures[0]` (see
releases.Release.multi_layer_archs). This module holds the two host-independent halves of reading it:

* `config_locations(model_path, env, home)`: the places SGLang would load config.json from, under
  the launch's own environment: a local `--model-path` directory, or a hub id resolved in the HF cache
  (`HF_HUB_CACHE`, else `HF_HOME`/hub, else `XDG_CACHE_HOME`/huggingface/hub, else
  ~/.cache/huggingface/hub; `models--org--name/refs/<revision>` names the snapshot);
* `architecture(data)`: the validated `architectures[0]` of a config.json's bytes (host data:
  untrusted, size-bounded, never more than an identifier).

Reading the files on the host is the agent's job; whatever it cannot read makes the routing answer
"not certain" (routing.NOT_CERTAIN), never a silent default.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass

from fleetctl.engines.base import ModelConfig

MAX_CONFIG_BYTES = 4 * 1024 * 1024
_ARCH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


@dataclass(frozen=True)
class ConfigLocation:
    kind: str  # "local": `path` is config.json; "hub": read `ref` for the commit, then snapshots/<commit>/
    path: str  # local: the config.json; hub: the repo's cache dir (models--org--name)
    ref: str | None = None  # hub: refs/<revision> file holding the snapshot's commit hash


def _expand(path: str, home: str) -> str:
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def hub_cache_dir(env: dict[str, str], home: str) -> str:
    """The HF hub cache the launch's environment selects (huggingface_hub's own precedence)."""
    if env.get("HF_HUB_CACHE"):
        return _expand(env["HF_HUB_CACHE"], home)
    if env.get("HUGGINGFACE_HUB_CACHE"):  # the older spelling, still honoured
        return _expand(env["HUGGINGFACE_HUB_CACHE"], home)
    if env.get("HF_HOME"):
        return posixpath.join(_expand(env["HF_HOME"], home), "hub")
    base = env.get("XDG_CACHE_HOME") or posixpath.join(home, ".cache")
    return posixpath.join(base, "huggingface", "hub")


def config_locations(model_path: str, env: dict[str, str], home: str, *, cwd: str | None = None,
                     revision: str | None = None) -> list[ConfigLocation]:
    """Where config.json may be, in the order SGLang looks: the local directory first (a relative path
    is taken from the launch's working directory), then the hub cache when it reads like a hub id."""
    out: list[ConfigLocation] = []
    if not model_path or "\x00" in model_path:
        return out
    local = model_path if posixpath.isabs(model_path) or cwd is None else posixpath.join(cwd, model_path)
    out.append(ConfigLocation("local", posixpath.join(posixpath.normpath(local), "config.json")))
    rev = revision or "main"
    if _HUB_ID.match(model_path) and ".." not in model_path and _REVISION.match(rev) and ".." not in rev:
        repo = posixpath.join(hub_cache_dir(env, home), "models--" + model_path.replace("/", "--"))
        out.append(ConfigLocation("hub", repo, posixpath.join(repo, "refs", rev)))
    return out


def snapshot_config(repo_dir: str, commit: str) -> str | None:
    """The config.json of the snapshot a refs/<revision> file names (None if it is not a commit hash)."""
    commit = commit.strip()
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return None
    return posixpath.join(repo_dir, "snapshots", commit, "config.json")


def architecture(data: bytes) -> str | None:
    """`architectures[0]` of a config.json's bytes; None when it is missing, malformed or implausible."""
    if len(data) > MAX_CONFIG_BYTES:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    archs = doc.get("architectures") if isinstance(doc, dict) else None
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return None
    return archs[0] if _ARCH.match(archs[0]) else None


# --- the launch's model, and what the host's agent read of it --------------------------------

MODEL_FLAGS = ("--model-path", "--model")  # every spelling of ServerArgs.model_path (all releases)
REVISION_FLAG = "--revision"
# the speculative draft model: ServerArgs.speculative_draft_model_path / _revision
DRAFT_FLAGS = ("--speculative-draft-model-path", "--speculative-draft-model")
DRAFT_REVISION_FLAG = "--speculative-draft-model-revision"
_MAX_SHOWN = 300


def launch_model(flags: dict[str, object], argv: list[str] | tuple[str, ...] = (), *,
                 draft: bool = False) -> dict[str, str] | None:
    """{"path", "revision"} of the launch's target model (`draft`: its speculative draft model): the
    launch command's own words, then the flags fleetctl appends (argparse keeps the last). None when
    the launch names no such model."""
    model_flags, revision_flag = (DRAFT_FLAGS, DRAFT_REVISION_FLAG) if draft else (MODEL_FLAGS, REVISION_FLAG)
    found: dict[str, str] = {}
    words = list(argv)
    for i, w in enumerate(words):
        name, eq, val = w.partition("=")
        key = "path" if name in model_flags else "revision" if name == revision_flag else None
        if key is None:
            continue
        if eq:
            found[key] = val
        elif i + 1 < len(words):
            found[key] = words[i + 1]
    for k, v in flags.items():
        name = k if k.startswith("--") else "--" + k.replace("_", "-")
        key = "path" if name in model_flags else "revision" if name == revision_flag else None
        if key is not None and v is not None and v is not False and v is not True:
            found[key] = str(v)
    return found if found.get("path") else None


def from_answer(answer: object) -> ModelConfig | None:
    """Validate what the agent sent (untrusted): identifiers only, bounded strings."""
    if answer is None:
        return None
    path = getattr(answer, "path", None)
    path = path[:_MAX_SHOWN] if isinstance(path, str) else None
    error = getattr(answer, "error", None)
    archs = getattr(answer, "architectures", None) or []
    if error is None and archs and isinstance(archs[0], str) and _ARCH.match(archs[0]):
        return ModelConfig(archs[0], path, None)
    why = error if isinstance(error, str) and error else "no valid `architectures` in config.json"
    return ModelConfig(None, path, why[:_MAX_SHOWN])
