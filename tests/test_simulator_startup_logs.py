"""The simulator logs what the constructors a launch runs log (issue 30, the new user's path): a
playbook's own start-up line in the worker the launch selects, the model class its config.json names
or the attention backend its flags name is in the sandbox log, so `verify-logs` passes a playbook
that patches the code that runs, and a line in code that does not run is not logged. Before, the
simulator logged only the payload's marker and literal `logger.info` lines of `Scheduler.__init__`:
every other playbook a user wrote failed verify-logs on the sandbox, told "was the feature's flag
given?"."""

from __future__ import annotations

import json
from pathlib import Path

from test_simulator import EAGLE_FLAGS, Sim, fake_tree, run, sims  # noqa: F401  (sims: the fixture)

from fleetctl.engines.sglang import parse_line
from fleetctl.sandbox.startup_logs import FIELD, logged_messages

USER = "Accept-rate probe enabled on rank"
WORKER = '''
import logging
logger = logging.getLogger(__name__)

class {cls}:
    def __init__(self, server_args, tp_rank):
        self.server_args = server_args
{body}
'''


def _worker(cls: str, body: str = "") -> str:
    return WORKER.format(cls=cls, body=body or "        pass")


def test_logged_messages_reads_literals_fstrings_and_prints_run_unconditionally() -> None:
    src = '''
import logging
logger = logging.getLogger(__name__)
class W:
    def __init__(self, tp_rank, x):
        logger.info(f"Accept-rate probe enabled on rank {tp_rank}")
        logger.warning("a literal %s", x)
        print("printed", flush=True)
        if x:
            logger.info("under a condition")
        for _ in range(x):
            logger.info("in a loop")
        def inner():
            logger.info("in a nested function")
        logger.debug("below INFO")
    def other(self):
        logger.info("another method")
'''
    got = logged_messages(compile(src, "w.py", "exec"), "W")
    assert got == [("info", f"{USER} {FIELD}"), ("warning", "a literal %s"), ("print", "printed")]
    assert logged_messages(compile(src, "w.py", "exec"), "W", "other") == [("info", "another method")]


def test_a_users_fstring_line_in_the_worker_that_runs_is_logged_per_rank(tmp_path: Path, sims: list[Sim]) -> None:  # noqa: F811
    line = f'        logger.info(f"{USER} {{tp_rank}}")'
    site = fake_tree(tmp_path, "0.5.9", {"eagle_worker.py": _worker("EAGLEWorker"),
                                         "eagle_worker_v2.py": _worker("EAGLEWorkerV2", line)})
    s = run(sims, site, [*EAGLE_FLAGS, "--tp-size", "2"], {"SGLANG_ENABLE_SPEC_V2": "1"})
    marks = [parse_line(x) for x in s.wait_ready() if USER in x]
    assert [m.ranks for m in marks] == [{"TP": 0}, {"TP": 1}], marks
    s.stop()
    # the origin mistake: env unset, 0.5.9 runs EAGLEWorker, which the edit does not change: no line
    s2 = run(sims, site, [*EAGLE_FLAGS, "--tp-size", "2"])
    assert not [x for x in s2.wait_ready() if USER in x]


def _models(root: Path) -> None:
    models = root / "sglang" / "srt" / "models"
    models.mkdir(parents=True)
    for mod, cls in (("llama.py", "LlamaForCausalLM"), ("qwen2.py", "Qwen2ForCausalLM")):
        (models / mod).write_text(_worker(cls, f'        logger.info("{cls} patched line")')
                                  + f"\nEntryClass = {cls}\n")


def test_the_model_class_the_config_names_logs_its_line(tmp_path: Path, sims: list[Sim]) -> None:  # noqa: F811
    site = fake_tree(tmp_path / "site", "0.5.17", {})
    _models(site)
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    s = run(sims, site, ["--model-path", str(model)])
    lines = s.wait_ready()
    assert [parse_line(x).message for x in lines if "patched line" in x] == ["Qwen2ForCausalLM patched line"]


def test_the_attention_backend_the_flags_name_logs_its_line(tmp_path: Path, sims: list[Sim]) -> None:  # noqa: F811
    site = fake_tree(tmp_path, "0.5.12", {})
    att = site / "sglang" / "srt" / "layers" / "attention"
    att.mkdir(parents=True)
    reg = ["def register_attention_backend(name):\n    return lambda f: f\n"]
    for name, mod, cls in (("triton", "triton_backend", "TritonAttnBackend"),
                           ("fa3", "flashattention_backend", "FlashAttentionBackend")):
        reg.append(f'@register_attention_backend("{name}")\ndef create_{name}(runner):\n'
                   f"    from sglang.srt.layers.attention.{mod} import {cls}\n    return {cls}(runner)\n")
        (att / f"{mod}.py").write_text(_worker(cls, f'        print("{cls} tuned", flush=True)'))
    (att / "attention_registry.py").write_text("\n".join(reg))
    s = run(sims, site, ["--model-path", "m", "--attention-backend", "fa3", "--decode-attention-backend", "triton"])
    lines = s.wait_ready()
    assert sorted(x for x in lines if x.endswith(" tuned")) == ["FlashAttentionBackend tuned", "TritonAttnBackend tuned"]
    s.stop()
    s2 = run(sims, site, ["--model-path", "m", "--attention-backend", "fa3"])
    assert [x for x in s2.wait_ready() if x.endswith(" tuned")] == ["FlashAttentionBackend tuned"]
