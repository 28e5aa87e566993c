"""A hostile host's python, for tests/test_answers_fleet.py: runs the REAL agent (the controller's
bootstrap, as sent) but rewrites every answer it frames on stdout, as HOSTILE_MODE says:

    null     the whole answer is JSON null
    list     the result is a list
    missing  a required key is missing (a servers entry without `instance`, a manifest without `id`,
             facts without `package`, a server_grep entry without `instance`)
    type     a number where a string goes (python.executable), a string where a bool goes

Run as: python hostile_agent.py -c BOOTSTRAP CACHE_DIR (what the controller runs, with this file
inserted). Test code only: it never runs outside a sandbox host.
"""

import json
import os
import sys

MODE = os.environ.get("HOSTILE_MODE", "null")


def mutate(doc):
    if MODE == "null":
        return None
    res = doc.get("result")
    if MODE == "list":
        doc["result"] = []
        return doc
    if not isinstance(res, dict):
        return doc
    if "os" in res:  # facts
        if MODE == "type":
            res["python"]["executable"] = 42
        elif "servers" in res:
            res["servers"]["instances"].append({"running": True, "record": None})
        elif "state" in res:
            res["state"]["deploys"].append({"state": "complete", "files": []})
        else:
            del res["package"]
    elif isinstance(res.get("instances"), dict):  # server_grep
        if MODE == "type":
            for st in res["instances"].values():
                st["running"] = "yes"
        else:
            res["instances"]["port-1"] = {"running": True}
    return doc


class Rewriter:
    """Stands in for sys.stdout.buffer: each write is one framed answer (10-digit length + JSON)."""

    def __init__(self, real):
        self.real = real

    def write(self, data):
        if data.startswith(b"FLAGENT"):  # the bootstrap's hello, not an answer
            return self.real.write(data)
        n = int(data[:10])
        doc = json.loads(data[10:10 + n])
        body = json.dumps(mutate(doc)).encode()
        self.real.write(b"%010d" % len(body) + body)
        return len(data)

    def flush(self):
        self.real.flush()


class Stdout:
    def __init__(self, real):
        self.buffer = Rewriter(real.buffer)


if __name__ == "__main__":
    assert sys.argv[1] == "-c", sys.argv
    code = sys.argv[2]
    sys.argv = ["-c", *sys.argv[3:]]
    sys.stdout = Stdout(sys.stdout)
    exec(compile(code, "<bootstrap>", "exec"), {"__name__": "__main__"})
