"""The one computation of a launch's interpreter, options and environment (fleetctl/model/launchspec.py)."""

from __future__ import annotations

from pathlib import Path

import yaml

from fleetctl.config.inventory import load_inventory
from fleetctl.config.playbook import LaunchProfile
from fleetctl.model.instances import host_launch_spec, plan_instances
from fleetctl.model.launchspec import LaunchSpec, launch_spec

PY = "/opt/venv/bin/python"


def spec(cmd: str, env: dict[str, str] | None = None) -> LaunchSpec:
    import shlex

    return launch_spec([w.replace("{python}", PY) for w in shlex.split(cmd)], PY, env or {})


def test_plain_module_launch() -> None:
    s = spec("{python} -m sglang.launch_server")
    assert (s.interpreter, s.options, s.target_kind, s.target, s.problem) == (
        PY, (), "module", "sglang.launch_server", None)


def test_env_prefix_sets_unsets_and_clears() -> None:
    s = spec("env SGLANG_ENABLE_SPEC_V2=1 {python} -m sglang.launch_server", {"A": "x"})
    assert s.effective_env == {"A": "x", "SGLANG_ENABLE_SPEC_V2": "1"} and s.env == {"A": "x"}
    s = spec("env -u SGLANG_ENABLE_SPEC_V2 {python} -m m", {"SGLANG_ENABLE_SPEC_V2": "1", "B": "y"})
    assert s.effective_env == {"B": "y"}
    s = spec("env -i PATH=/usr/bin {python} -m m", {"SGLANG_ENABLE_SPEC_V2": "1"})
    assert s.clear and s.effective_env == {"PATH": "/usr/bin"}
    assert s.to_agent()["clear"] is True


def test_interpreter_options_wrappers_and_other_pythons() -> None:
    s = spec("numactl --cpunodebind=0 nohup env X=1 /srv/venv2/bin/python3.11 -O -X pycache_prefix=/c -m sglang.x")
    assert s.interpreter == "/srv/venv2/bin/python3.11" and s.options == ("-O", "-X", "pycache_prefix=/c")
    assert s.command_env == {"X": "1"} and s.target == "sglang.x"
    s = spec("taskset -c 0-7 python3 /opt/run_server.py --port 1")
    assert s.interpreter == "python3" and s.target_kind == "script" and s.target == "/opt/run_server.py"


def test_unresolvable_commands_are_reported_not_assumed() -> None:
    for cmd, why in [("sh -c '{python} -m m'", "'sh' is not a python"),
                     ("/opt/start-sglang.sh --port 1", "not a python"),
                     ("SGLANG_ENABLE_SPEC_V2=1 {python} -m m", "fleetctl runs no shell"),
                     ("env --chdir=/x {python} -m m", "env option"),
                     ("{python}", "no module (-m) or script"),
                     ("nohup bash run.sh", "not a python")]:
        s = spec(cmd)
        assert s.problem and why in s.problem and "cannot tell which python" in s.problem, (cmd, s.problem)
        assert s.interpreter is None


def test_instances_and_locate_share_the_spec(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"g1": {
        "address": "127.0.0.9", "python": PY, "gpus": 2, "env": {"TOKEN": {"value": "s3", "secret": True}},
        "launch_command": "env SGLANG_ENABLE_SPEC_V2=1 {python} -m sglang.launch_server"}}}))
    h = load_inventory(inv).hosts[0]
    prof = LaunchProfile(env={"PYTHONPATH": "/srv/tree"})
    (inst,) = plan_instances(h, prof)
    loc = host_launch_spec(h, prof)
    assert inst.launch is not None and inst.launch.interpreter == loc.interpreter == PY
    assert inst.effective_env["SGLANG_ENABLE_SPEC_V2"] == "1" and loc.effective_env["PYTHONPATH"] == "/srv/tree"
    assert inst.launch.public_effective_env["TOKEN"] == "***"
    assert "CUDA_VISIBLE_DEVICES" in inst.env and "CUDA_VISIBLE_DEVICES" not in loc.env
