"""The sandbox simulator's replay of the server_args.py checks on a host's disk: the code lives in
fleetctl/engines/sglang/server_args_replay.py (explain replays a playbook's patched checks with it too)."""

from fleetctl.engines.sglang.server_args_replay import replayable_checks, run_checks

__all__ = ["replayable_checks", "run_checks"]
