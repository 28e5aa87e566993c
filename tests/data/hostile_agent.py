"""A hostile host's answers, for tests/test_answers_fleet.py: every answer the REAL agent frames on
stdout rewritten as the mode says (in-process hosts apply it: tests/fakehost.py FakeHosts.rewrite):

    null     the whole answer is JSON null
    list     the result is a list
    missing  a required key is missing (a servers entry without `instance`, a manifest without `id`,
             facts without `package`, a server_grep entry without `instance`)
    type     a number where a string goes (python.executable), a string where a bool goes

Test code only.
"""


def mutate(doc, mode):
    """The answer `doc` as `mode` rewrites it."""
    if mode == "null":
        return None
    res = doc.get("result")
    if mode == "list":
        doc["result"] = []
        return doc
    if not isinstance(res, dict):
        return doc
    if "os" in res:  # facts
        if mode == "type":
            res["python"]["executable"] = 42
        elif "servers" in res:
            res["servers"]["instances"].append({"running": True, "record": None})
        elif "state" in res:
            res["state"]["deploys"].append({"state": "complete", "files": []})
        else:
            del res["package"]
    elif isinstance(res.get("instances"), dict):  # server_grep
        if mode == "type":
            for st in res["instances"].values():
                st["running"] = "yes"
        else:
            res["instances"]["port-1"] = {"running": True}
    return doc
