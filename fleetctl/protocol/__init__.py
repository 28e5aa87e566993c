"""The agent protocol, controller side: action names and state words (names.py), what each action
answers (answers.py), and the one place an answer is checked (`parse_reply`).

Everything a host sends back goes through `parse_reply` before any other code sees it: the
framing's JSON, the envelope (`{"ok": true, "result": ...}` or `{"ok": false, "error": ...}`) and
the result against its action's type. A bad answer fails that host only, with one bounded line:
`h03: host answered an invalid 'facts' answer: servers.instances[0].instance: missing`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fleetctl.errors import FleetctlError
from fleetctl.protocol import answers as a
from fleetctl.protocol import names as n
from fleetctl.protocol.names import OPEN_STATES, ManifestState
from fleetctl.protocol.schema import Invalid, checker, kind, shown

__all__ = ["ANSWERS", "OPEN_STATES", "InvalidAnswer", "ManifestState", "Reply", "parse_reply"]

# action -> the type its result must have
ANSWERS: dict[str, Any] = {
    n.FACTS: a.FactsAnswer,
    n.PING: a.PingAnswer,
    n.DEPLOY: a.DeployAnswer,
    n.ROLLBACK: a.RollbackAnswer,
    n.READ_FILES: a.ReadFilesAnswer,
    n.SERVER_START: a.LaunchRecord,
    n.SERVER_WAIT: a.ServerWaitAnswer,
    n.SERVER_STOP: a.ServerStopAnswer,
    n.SERVER_GREP: a.ServerGrepAnswer,
    n.WORKER_CHECK: a.WorkerCheckAnswer,
    n.LOCATE: a.LocateAnswer,
    n.ENGINE_PROBE: a.EngineProbeAnswer,
    n.GPUCHECK_PREPARE: a.GpuCheckPrepareAnswer,
    n.GPUCHECK_SCRIPT: a.GpuCheckScriptAnswer,
    n.GPUCHECK_CLEANUP: a.GpuCheckCleanupAnswer,
}

MAX_LINE = 300  # characters of an invalid-answer line
MAX_ERROR = 4000  # characters of an agent's error text kept
MAX_TRACEBACK = 16000  # characters of an agent's traceback kept (its end), shown with --debug


class InvalidAnswer(FleetctlError):
    """A host answered something that does not fit the protocol. Fails that host (exit 1)."""

    reference = "host-answer-invalid"

    def __init__(self, host: str, action: str, where: str, problem: str) -> None:
        line = f"{host}: host answered an invalid {action!r} answer: {where}: {problem}"
        if len(line) > MAX_LINE:
            line = line[:MAX_LINE - 3] + "..."
        super().__init__(line)
        self.where = where
        self.problem = problem


@dataclass
class Reply:
    """One checked answer: `result` (typed as ANSWERS[action]) or the agent's own error."""

    result: Any = None
    error: str | None = None
    kind: str = "failed"
    traceback: str | None = None


def parse_reply(host: str, action: str, raw: bytes) -> Reply:
    """Check one framed answer from `host` to `action`; raise InvalidAnswer if it does not fit."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidAnswer(host, action, "(the whole answer)", f"not JSON: {shown(raw[:40].decode('latin-1'))}") from None
    try:
        if not isinstance(doc, dict):
            raise Invalid(f"expected an object, got {kind(doc)}")
        ok = doc.get("ok")
        if not isinstance(ok, bool):
            raise Invalid("missing" if ok is None else f"expected true or false, got {kind(ok)}").at(".ok")
        if not ok:
            return _error(doc)
        if "result" not in doc:
            raise Invalid("missing").at(".result")
    except Invalid as e:
        raise InvalidAnswer(host, action, e.where, e.problem) from None
    return Reply(result=parse_result(host, action, doc["result"]))


def parse_result(host: str, action: str, result: Any) -> Any:
    """Check the `result` of an answer to `action` (JSON data: an answer's, or one kept from it, as
    a seal's facts are); raise InvalidAnswer if it does not fit."""
    try:
        try:
            return checker(_answer_type(action))(result)
        except Invalid as e:
            raise (e if e.where_known else e.at("result")) from None
    except Invalid as e:
        raise InvalidAnswer(host, action, e.where, e.problem) from None


def _error(doc: dict[str, Any]) -> Reply:
    err, what, tb = doc.get("error"), doc.get("kind", "failed"), doc.get("traceback")
    for key, v in (("error", err), ("kind", what)):
        if not isinstance(v, str):
            raise Invalid("missing" if v is None else f"expected a string, got {kind(v)}").at("." + key)
    if tb is not None and not isinstance(tb, str):
        raise Invalid(f"expected a string, got {kind(tb)}").at(".traceback")
    return Reply(error=err[:MAX_ERROR], kind=what[:40], traceback=tb[-MAX_TRACEBACK:] if tb else tb)


def _answer_type(action: str) -> Any:
    tp = ANSWERS.get(action)
    if tp is None:  # a bug in the controller, not the host's fault
        raise TypeError(f"agent action {action!r} has no answer type: add it to fleetctl.protocol.ANSWERS")
    return tp
