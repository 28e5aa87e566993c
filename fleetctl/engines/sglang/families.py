"""Does the launch run the member of each family of alternatives that the playbook patches?

Families and their members come from the release's own code (family_tables.py). A family is
checked when the playbook patches one of its members (or its `covers:` asks for it); a playbook
that patches no member of a family hears nothing about it. Each answer is certain (the launch's
flags, env and model config decide it), refused (the member that runs is not patched), or not
certain (it is chosen at startup from the GPU, or from a model config that could not be read).
The speculative worker family is routing.resolve_worker's (patched_worker.py reports it); this
module names its members and handles the algorithms routing does not model (NGRAM and later ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from fleetctl.engines.base import PatchedFile
from fleetctl.engines.sglang import family_tables as FT

SPEC = "speculative_worker"
MODEL = "model"
ATTENTION = "attention_backend"
GRAMMAR = "grammar_backend"
SAMPLING = "sampling_backend"
NAMES = (SPEC, MODEL, ATTENTION, GRAMMAR, SAMPLING)
TITLES = {SPEC: "speculative worker", MODEL: "model implementation", ATTENTION: "attention backend",
          GRAMMAR: "grammar backend", SAMPLING: "sampling backend"}


@dataclass
class FamilyCheck:
    family: str
    patched: list[str]  # the members of the family the playbook changes
    runs: list[str]  # what the launch runs of it (files, or file::branch)
    covered: bool | None  # None: not certain
    message: str
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"family": self.family, "title": TITLES[self.family], "patched": self.patched, "runs": self.runs,
                "covered": self.covered, "message": self.message}


def _short(paths: list[str] | set[str]) -> str:
    names = sorted({PurePosixPath(p.split("::")[0]).name + (f" ({p.split('::')[1]})" if "::" in p else "")
                    for p in paths})
    return ", ".join(names)


def _full(paths: list[str]) -> str:
    """Files as the package names them (a branch of one file: 'file (name branch)')."""
    return ", ".join(p.replace("::", " (") + " branch)" if "::" in p else p for p in dict.fromkeys(paths))


def _norm(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


def flag_values(flags: Mapping[str, Any]) -> dict[str, Any]:
    return {_norm(k): v for k, v in flags.items() if v is not None and v is not False}


def spec_members(version: str) -> dict[str, str]:
    """Worker class -> file for every speculative worker `version`'s factory can build."""
    return dict(FT.table(version).spec_workers)


def other_spec_worker(version: str, algorithm: str) -> list[tuple[str, str]]:
    """(class, file) of the workers a speculative algorithm routing does not model may run (NGRAM...):
    the worker modules named for it in the release's factory."""
    low = algorithm.lower()
    return sorted((c, f) for c, f in spec_members(version).items() if PurePosixPath(f).name.startswith(low + "_"))


# --- which members a patch changes ----------------------------------------------------------

_TOUCHED: dict[tuple[str, bytes], list[str]] = {}


def sampling_touched(version: str, pf: PatchedFile) -> list[str]:
    """The sampling branches (by backend name) a patch of the sampler changes."""
    import ast

    from fleetctl.engines.sglang.sources import WHEELS

    key = (version, pf.patch)
    if key not in _TOUCHED:
        old, new, patched = pf.touched()
        pristine = WHEELS.pristine_bytes(version, FT.SAMPLER)
        out: list[str] = []
        for text, lines in ((pristine, old), (patched, new)):
            try:
                branches = FT.sampling_branches(ast.parse(text))
            except SyntaxError:
                continue
            for b in branches:
                if any(a <= ln <= z for ln in lines for a, z in b.spans):
                    out += b.names
        if len(_TOUCHED) >= 64:  # (bounded, as the lru_cache it replaces)
            _TOUCHED.clear()
        _TOUCHED[key] = sorted(dict.fromkeys(out))
    return _TOUCHED[key]


# --- the checks ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelSeen:
    """A config.json as read on the host: architectures[0], or why it could not be read."""

    arch: str | None
    error: str | None = None


def wanted(version: str, patched: Mapping[str, PatchedFile], asked: Mapping[str, bool | None]) -> dict[str, list[str]]:
    """Family -> the members the playbook patches, for each family to check (derived from the patch,
    widened or narrowed by `asked`: True checks it even with no member patched, False never)."""
    t = FT.table(version)
    files = set(patched)
    out: dict[str, list[str]] = {}
    members = {SPEC: set(t.spec_workers.values()), MODEL: t.model_members(), ATTENTION: t.attention_members(),
               GRAMMAR: t.grammar_members()}
    for fam, mem in members.items():
        hit = sorted(files & mem)
        if (hit and asked.get(fam) is not False) or asked.get(fam):
            out[fam] = hit
    if FT.SAMPLER in files and asked.get(SAMPLING) is not False:
        hit = [f"{FT.SAMPLER}::{n}" for n in sampling_touched(version, patched[FT.SAMPLER])]
        if hit or asked.get(SAMPLING):
            out[SAMPLING] = hit
    elif asked.get(SAMPLING):
        out[SAMPLING] = []
    return out


def _models_run(t: FT.FamilyTable, arch: str) -> list[str]:
    """The srt/models files that run for `arch`: its registry module and the models modules it builds on."""
    first = t.models.get(arch)
    if first is None:
        return []
    seen, todo = [first], [first]
    while todo:
        for dep in t.model_imports.get(todo.pop(), []):
            if dep not in seen:
                seen.append(dep)
                todo.append(dep)
    return seen


def _check_model(version: str, t: FT.FamilyTable, patched: list[str], flags: dict[str, Any], model: ModelSeen | None,
                 draft: ModelSeen | None) -> FamilyCheck:
    mine = _short(patched)
    runs: list[str] = []
    mains: list[str] = []  # the file each role's architecture loads
    said: list[str] = []
    unknown: list[str] = []
    roles = [("target", model, False)]
    if flags.get("speculative_algorithm") and str(flags["speculative_algorithm"]).upper() != "NGRAM":
        named = flags.get("speculative_draft_model_path") or flags.get("speculative_draft_model")
        roles.append(("draft", draft if named else model, True))
    for role, seen, is_draft in roles:
        if seen is None or seen.arch is None:
            why = seen.error if seen is not None and seen.error else "not read (checked on the host: explain, deploy)"
            unknown.append(f"the {role}'s config.json: {why}")
            continue
        arch = seen.arch
        if is_draft and arch in t.draft_renames:
            arch = t.draft_renames[arch]
        files = _models_run(t, arch)
        if not files:
            said.append(f"the {role} architecture {arch} is not in SGLang {version}'s model registry "
                        "(the server falls back to the Transformers backend or refuses it)")
            continue
        runs += [f for f in files if f not in runs]
        mains += [files[0]] if files[0] not in mains else []
        said.append(f"the {role}'s config.json names {seen.arch}"
                    + (f" (loaded as {arch} for the draft)" if arch != seen.arch else "")
                    + f", which SGLang {version}'s model registry loads from {files[0]}")
    hit = set(patched) & set(runs)
    if hit:
        return FamilyCheck(MODEL, patched, runs, True, "; ".join(said) + f"; your patch changes {_short(hit)}")
    if unknown:
        msg = "; ".join(said + unknown) + f": which model implementation runs is not known; your patch changes {mine}"
        return FamilyCheck(MODEL, patched, runs, None, msg)
    return FamilyCheck(MODEL, patched, runs, False, "; ".join(said) + f"; your patch changes only {mine}"
                       + _model_fix(t, patched, mains))


def _model_fix(t: FT.FamilyTable, patched: list[str], mains: list[str]) -> str:
    """The fix that works for a model playbook that misses the implementation that will load: patch
    that file too, or launch a model the patched file implements (an architecture it registers)."""
    fixes = [f"patch {_full(mains)} too (fleetctl patch new)"] if mains else []
    # architectures the patched files register, those named like the file first (llama.py: Llama...)
    stems = [PurePosixPath(p).stem.replace("_", "") for p in patched]
    archs = sorted((a for a, f in t.models.items() if f in patched),
                   key=lambda a: (not any(s and a.lower().startswith(s) for s in stems), a))
    if archs:
        fixes.append("launch a model whose config.json names " + " or ".join(archs[:3])
                     + (" (or another architecture the patched file implements)" if len(archs) > 3 else ""))
    return "; fix: " + ", or ".join(fixes) if fixes else ""


def _backends(flags: dict[str, Any]) -> dict[str, tuple[str | None, str]]:
    """phase -> (the attention backend the launch names for it or None: the release's default, the flag
    that names it). SGLang uses --prefill/--decode-attention-backend over --attention-backend."""
    base = flags.get("attention_backend")
    out: dict[str, tuple[str | None, str]] = {}
    for phase in ("prefill", "decode"):
        own = flags.get(f"{phase}_attention_backend")
        out[phase] = ((str(own), f"--{phase}-attention-backend") if own else
                      (str(base) if base else None, "--attention-backend"))
    if out["prefill"][0] == out["decode"][0]:
        out = {"": out["prefill"] if out["prefill"][1] == out["decode"][1] else (out["prefill"][0],
                                                                                "--attention-backend")}
    draft = flags.get("speculative_draft_attention_backend")
    if draft and flags.get("speculative_algorithm") and str(draft) not in {n for n, _ in out.values()}:
        out["draft"] = (str(draft), "--speculative-draft-attention-backend")  # the draft worker's own
    return out


def _check_choice(family: str, version: str, patched: list[str], choices: dict[str, list[str]],
                  defaults: list[str], picked: dict[str, tuple[str | None, str]]) -> FamilyCheck:
    """A family chosen by a flag with a per-release default: `picked` phase -> (backend or None for the
    default, the flag that chooses it)."""
    mine = _short(patched)
    title = TITLES[family]
    hit_by: dict[str, bool] = {name: bool(set(mods) & set(patched)) for name, mods in choices.items()}
    runs: list[str] = []
    parts: list[str] = []
    uncertain = False
    any_hit = False
    for phase, (name, flag) in picked.items():
        label = f"{phase} " if phase else ""
        if name is None:
            cands = [d for d in defaults if d in choices] or defaults
            hits = [d for d in cands if hit_by.get(d)]
            if hits and len(hits) == len(cands):
                any_hit = True
                parts.append(f"no {flag}: SGLang {version} picks the {label}{title} at startup among "
                             f"{', '.join(cands)}, all patched")
            elif hits:
                uncertain = True
                parts.append(f"no {flag}: SGLang {version} picks the {label}{title} at startup from the GPU and "
                             f"model among {', '.join(cands)}; your patch changes {mine}, which only "
                             f"{', '.join(hits)} runs: pass {flag} {hits[0]}")
            else:
                parts.append(f"no {flag}: SGLang {version} picks the {label}{title} at startup among "
                             f"{', '.join(cands)}, none of which runs {mine}")
            runs += [m for d in cands for m in choices.get(d, [])]
            continue
        mods = choices.get(name)
        if mods is None:
            uncertain = True
            parts.append(f"{flag} {name} is not a {title} SGLang {version} registers (a plugin's?)")
            continue
        runs += mods
        if set(mods) & set(patched):
            any_hit = True
            parts.append(f"with {flag} {name} the {label}{title} runs {_short(mods)}")
        else:
            parts.append(f"with {flag} {name} the {label}{title} runs "
                         + ((("one of " if len(mods) > 1 else "") + _full(mods)) if mods else "no backend module"))
    runs = list(dict.fromkeys(runs))
    if any_hit:  # a phase certainly runs a patched member (as with an explicit unpatched other phase)
        return FamilyCheck(family, patched, runs, True, "; ".join(parts) + f"; your patch changes {mine}")
    if uncertain:
        return FamilyCheck(family, patched, runs, None, "; ".join(parts))
    flag = picked[""][1] if "" in picked else "--attention-backend"  # one flag for every phase
    fixes = [f"pass {flag} {name}" for name in [n for n, hit in hit_by.items() if hit][:1]]  # runs the patch
    if runs and not runs[0].startswith(f"{FT.SAMPLER}::"):  # (a sampler is a branch of one file)
        fixes.append(f"patch {_full(runs)} too" + (" (whichever the model runs)" if len(runs) > 1 else "")
                     if len(runs) <= 3 else f"patch the {TITLES[family]}'s file that runs too")
    return FamilyCheck(family, patched, runs, False, "; ".join(parts) + f"; your patch changes only {mine}"
                       + ("; fix: " + ", or ".join(fixes) if fixes else ""))


def check(version: str, flags: Mapping[str, Any], patched: Mapping[str, PatchedFile], asked: Mapping[str, bool | None],
          *, model: ModelSeen | None = None, draft: ModelSeen | None = None) -> list[FamilyCheck]:
    """The families other than the speculative worker that this playbook's patch (or `covers:`) makes
    relevant, each checked against the launch's flags and the model configs read on the host."""
    want = wanted(version, patched, asked)
    t = FT.table(version)
    fl = flag_values(flags)
    out: list[FamilyCheck] = []
    if MODEL in want:
        out.append(_check_model(version, t, want[MODEL], fl, model, draft))
    if ATTENTION in want:
        out.append(_check_choice(ATTENTION, version, want[ATTENTION], t.attention, t.attention_defaults,
                                 _backends(fl)))
    if GRAMMAR in want:
        c = _check_choice(GRAMMAR, version, want[GRAMMAR], t.grammar, t.grammar_defaults,
                          {"": (str(fl["grammar_backend"]) if fl.get("grammar_backend") else None,
                                "--grammar-backend")})
        c.notes.append("a grammar backend runs only for requests with a structured-output constraint")
        out.append(c)
    if SAMPLING in want:
        choices = {n: [f"{FT.SAMPLER}::{n}"] for b in t.sampling for n in b.names}
        out.append(_check_choice(SAMPLING, version, want[SAMPLING], choices, t.sampling_defaults,
                                 {"": (str(fl["sampling_backend"]) if fl.get("sampling_backend") else None,
                                       "--sampling-backend")}))
    for c in out:
        c.notes += t.problems
    return out
