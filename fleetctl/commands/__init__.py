"""The command table (pip's commands_dict is the model): every command's name, the module that
declares its options (`register(app)`, light: typer and the shared option types only), the function
that runs it (imported only when the command runs) and its help. The order is `fleetctl --help`'s.

A command body hands its parsed options to `run(name, ...)`: no command module imports its own
implementation by hand. tests/test_startup.py checks each help against the command the module really
defines, and each implementation's name against the module it names.
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class CommandInfo(NamedTuple):
    options: str  # fleetctl.commands.<options>: register(app) declares the command (or a group of them)
    impl: str | None  # "<module>:<function>" under fleetctl.commands that runs it; None: the group's own module
    summary: str


COMMANDS: dict[str, CommandInfo] = {
    "deploy": CommandInfo("deploys", "deploys_impl:deploy",
                "Patch every host to the playbook's intended files: plan, backup, atomic swap, verify."),
    "rollback": CommandInfo("deploys", "deploys_impl:rollback",
                "Restore each host's files to their bytes before its last (or a named) deploy."),
    "status": CommandInfo("deploys", "deploys_impl:status",
                "Per host: deploy state of the playbook's files, interrupted deploys, lock, servers."),
    "history": CommandInfo("deploys", "deploys_impl:history_command",
                "The local ledger of deploys, rollbacks and launches; 'history ID' shows one; "
                "'history show ID' also its run log (plan, per-host start/end, result, timings)."),
    "explain": CommandInfo("deploys", "deploys_impl:explain",
                "Say per host which SGLang worker class and file will run, and whether the playbook "
                "patches it."),
    "launch": CommandInfo("servers", "servers_impl:launch",
                "Start the SGLang servers of the playbook's launch profile and wait until ready."),
    "verify-logs": CommandInfo("servers", "servers_impl:verify_logs",
                "Prove from each server's current log, per host and rank, that the patched code runs."),
    "stop": CommandInfo("servers", "servers_impl:stop",
                "Stop the servers fleetctl launched (SIGTERM, then SIGKILL after a timeout)."),
    "servers": CommandInfo("servers", "servers_impl:servers",
                "List the servers fleetctl launched (--discover: every SGLang server process)."),
    "facts": CommandInfo("facts", "facts_impl:facts",
                "Per host: reachable, OS, python, SGLang version and dir, torch, file hashes, GPUs."),
    "gpu-check": CommandInfo("gpucheck", "gpucheck_impl:gpu_check",
                "On each host's own GPU and SGLang install: a tiny model fleetctl makes there, throwaway "
                "servers (speculation on, off, the patch's dynamic mode): marker, greedy outputs, tokens/s; then "
                "removes it all."),
    "patch": CommandInfo("patch", None,
                "Local tools for patch authors: apply, check, new, port, import."),
    "sandbox": CommandInfo("sandbox", None,
                "A local fleet of real OpenSSH hosts on loopback: up, down, status."),
}


def implementation(name: str) -> Any:
    """The function that runs the command `name`, its module imported now."""
    impl = COMMANDS[name].impl
    if impl is None:
        raise KeyError(f"{name}: its module runs it (no implementation in the table)")
    module, func = impl.split(":")
    return getattr(importlib.import_module(f"fleetctl.commands.{module}"), func)


def run(name: str, **options: Any) -> None:
    """Run the command `name` with its parsed options."""
    implementation(name)(**options)
