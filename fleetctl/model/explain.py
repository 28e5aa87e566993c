"""What `explain` says of one host: `HostResult[Explained]`, per launch instance an `ExplainedInstance`.

A host that answered facts gets the worker its launch runs and whether the playbook patches it, with
the notes and the refusal that explain it; a host that did not keeps the same few keys (None), so a
script reads `covered` and `worker_file` on every row (docs/schemas/explain.schema.json). Plain data:
commands/deploys_impl.py fills it, ui renders it, `to_json` gives the row's own fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ExplainedInstance:
    """One launch instance: its worker and coverage, and the playbook's markers its flags never reach."""

    instance: str
    gpus: list[int]
    port: int | None
    worker_class: str | None
    worker_file: str | None
    disable_overlap_schedule: bool | None
    covered: bool | None
    reason: str
    refused: str | None
    never_fires: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"instance": self.instance, "gpus": self.gpus, "port": self.port, "worker_class": self.worker_class,
                "worker_file": self.worker_file, "disable_overlap_schedule": self.disable_overlap_schedule,
                "covered": self.covered, "reason": self.reason, "refused": self.refused,
                "never_fires": self.never_fires}


@dataclass
class Explained:
    """explain's detail for one host. `answered` False: the host gave no facts (the row keeps `reason`
    and the worker keys, None); `instances` None: no SGLang found, so no launch instance was judged."""

    reason: str
    answered: bool = True
    version: str | None = None
    shown_env: dict[str, Any] = field(default_factory=dict)  # the engine's launch env that decides the worker
    flags: dict[str, Any] = field(default_factory=dict)  # the engine's launch flags that decide it
    worker_class: str | None = None
    worker_file: str | None = None
    disable_overlap_schedule: bool | None = None
    covered: bool | None = None
    refused: str | None = None  # why the playbook cannot serve this host (None: it can)
    families: list[dict[str, Any]] = field(default_factory=list)
    instances: list[ExplainedInstance] | None = None
    bytecode: str | None = None
    notes: list[str] = field(default_factory=list)
    startup_env: list[str] = field(default_factory=list)
    model_architecture: str | None = None
    probe: list[dict[str, Any]] | None = None  # explain --probe: each instance's answer from the host's SGLang

    def note(self, *notes: str) -> None:
        """Add notes not there yet (in order)."""
        self.notes += [n for n in dict.fromkeys(notes) if n not in self.notes]

    def to_json(self) -> dict[str, Any]:
        worker = {"worker_class": self.worker_class, "worker_file": self.worker_file,
                  "disable_overlap_schedule": self.disable_overlap_schedule, "covered": self.covered,
                  "reason": self.reason}
        if not self.answered:
            return worker
        return {"version": self.version, **self.shown_env, "flags": self.flags, **worker, "refused": self.refused,
                "families": self.families,
                **({"instances": [i.to_json() for i in self.instances]} if self.instances is not None else {}),
                "bytecode": self.bytecode, "notes": self.notes, "startup_env": self.startup_env,
                "model_architecture": self.model_architecture,
                **({"probe": self.probe} if self.probe is not None else {})}
