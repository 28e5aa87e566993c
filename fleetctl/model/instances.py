"""Launch profile (playbook) + inventory host -> the server instances on that host: GPUs, port,
argv (a list, never a shell string) and the exact environment each one is started with.

Flags: playbook `launch.flags`, overridden by the inventory's (defaults -> groups -> host, already
merged in `Host.flags`). Env: playbook `launch.env`, overridden by the inventory's `env`, plus
CUDA_VISIBLE_DEVICES for the instance's GPUs. Nothing is ever taken from the controller's
environment. Layout: one instance over all the host's GPUs (tp = number of GPUs), or with
`layout.gpus_per_instance: K` one instance per K GPUs, on port + i * port_stride.
"""

from __future__ import annotations

import functools
import shlex
from dataclasses import dataclass, field
from typing import Any

from fleetctl.config.hosts import FLAG_RE, Host
from fleetctl.config.playbook_model import LaunchProfile
from fleetctl.engines import engine
from fleetctl.errors import InputError
from fleetctl.model.launchspec import LaunchSpec, launch_spec

# The tensor-parallel flag, every spelling the engine accepts, and its port flag (fleetctl/engines/base.py).
TP_FLAG = engine().tp_flag
TP_SPELLINGS = engine().tp_spellings
PORT_FLAG = engine().port_flag



@dataclass(frozen=True)
class Instance:
    host: str
    name: str
    index: int
    gpus: tuple[int, ...]
    port: int
    argv: list[str]
    env: dict[str, str]  # exactly what the server gets on top of the host basics (secret values included)
    secret_keys: frozenset[str]
    flags: dict[str, Any]  # '--flag' -> value, after every override (what resolve_worker reads)
    public_argv: list[str] = field(default_factory=list)
    launch: LaunchSpec | None = None  # interpreter, options, env, cwd: how sglang is located for it

    @property
    def public_env(self) -> dict[str, str]:
        return {k: ("***" if k in self.secret_keys else v) for k, v in self.env.items()}

    @property
    def effective_env(self) -> dict[str, str]:
        """The environment the server's python sees on top of the host basics (what worker routing
        reads): this env plus what an `env` prefix in the launch command sets or unsets."""
        return self.launch.effective_env if self.launch is not None else dict(self.env)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.name, "gpus": list(self.gpus), "port": self.port,
                "argv": self.public_argv, "env": self.public_env}


def env_string(v: Any) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def _norm_flags(flags: dict[str, Any], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in flags.items():
        key = k if k.startswith("--") else "--" + k.replace("_", "-")
        if not FLAG_RE.match(key):
            raise InputError(f"{where}: flag {k!r} must look like --some-flag", reference="launch-profile-invalid")
        if isinstance(v, (dict, list)):
            raise InputError(f"{where}: flag {key} must have a scalar value (string, number, true/false)",
                             reference="launch-profile-invalid")
        out[key] = v
    return out


def flag_argv(flags: dict[str, Any]) -> list[str]:
    """{'--a': 1, '--b': True, '--c': False/None} -> ['--a', '1', '--b'] (False/None: left out)."""
    out: list[str] = []
    for k, v in flags.items():
        if v is None or v is False:
            continue
        if v is True:
            out.append(k)
        else:
            out += [k, str(v)]
    return out


def command_argv(host: Host, profile: LaunchProfile) -> list[str]:
    """The launch command as argv: inventory `launch_command` or the profile's, `{python}` filled in
    per word (so a python path stays one word, whatever it holds)."""
    template = host.launch_command or profile.command
    try:
        words = _split(template)
    except ValueError as e:
        raise InputError(f"launch command {template!r} does not split into words: {e}",
                         hint="fix launch.command in the playbook or launch_command in the inventory",
                         reference="launch-profile-invalid") from None
    if not words:
        raise InputError("the launch command is empty", hint="set launch.command in the playbook",
                         reference="launch-profile-invalid")
    return [w.replace("{python}", host.python) for w in words]


@functools.lru_cache(maxsize=256)
def _split(template: str) -> tuple[str, ...]:
    """shlex.split, once per distinct command (every host of a fleet usually shares one)."""
    return tuple(shlex.split(template))


def _mask_argv(argv: list[str], secrets: list[str]) -> list[str]:
    if not secrets:
        return list(argv)
    out = []
    for a in argv:
        for s in secrets:
            if s and s in a:
                a = a.replace(s, "***")
        out.append(a)
    return out


def _base_env(host: Host, profile: LaunchProfile) -> dict[str, str]:
    env = {k: env_string(v) for k, v in profile.env.items()}
    env.update(host.env)
    return env


def host_launch_spec(host: Host, profile: LaunchProfile | None) -> LaunchSpec:
    """How the host's launch runs python (the profile's, or the default one without a playbook):
    what facts, explain, deploy and status locate SGLang with. Instances differ from it only in
    CUDA_VISIBLE_DEVICES and flags, which do not change where sglang is imported from."""
    profile = profile if profile is not None else LaunchProfile()
    env = _base_env(host, profile)
    secret_keys = frozenset(k for k in host.secret_env_keys if k in env)
    return launch_spec(command_argv(host, profile), host.python, env, secret_keys, cwd=profile.cwd)


def plan_instances(host: Host, profile: LaunchProfile) -> list[Instance]:
    """The instances to run on `host`, in order (index 0 first)."""
    flags = _norm_flags(profile.flags, "launch.flags")
    flags.update(_norm_flags(host.flags, f"inventory flags of {host.name}"))
    base_port = profile.port
    if PORT_FLAG in flags:  # a port given as a flag wins over launch.port
        try:
            base_port = int(flags.pop(PORT_FLAG))
        except (TypeError, ValueError):
            raise InputError(f"{host.name}: flag {PORT_FLAG} must be a port number",
                             reference="launch-profile-invalid") from None
    env = _base_env(host, profile)
    secret_keys = frozenset(k for k in host.secret_env_keys if k in env)
    secrets = [env[k] for k in secret_keys]
    gpus = list(host.gpus)
    per = profile.layout.gpus_per_instance
    if not gpus:
        groups: list[tuple[int, ...]] = [()]
    elif per is None:
        groups = [tuple(gpus)]
    else:
        if len(gpus) % per:
            raise InputError(f"{host.name}: {len(gpus)} GPUs do not split into instances of {per}",
                             hint="change layout.gpus_per_instance or the host's gpus",
                             reference="launch-profile-invalid")
        groups = [tuple(gpus[i:i + per]) for i in range(0, len(gpus), per)]
    cmd = command_argv(host, profile)
    user_tp = any(k in TP_SPELLINGS for k in flags)
    out = []
    for i, g in enumerate(groups):
        port = base_port + i * profile.layout.port_stride
        if not 1 <= port <= 65535:
            raise InputError(f"{host.name}: instance {i} would use port {port}", hint="lower launch.port",
                             reference="launch-profile-invalid")
        f = dict(flags)
        if g and not user_tp:
            f[TP_FLAG] = len(g)
        f[PORT_FLAG] = port
        ienv = dict(env)
        if g:
            ienv["CUDA_VISIBLE_DEVICES"] = ",".join(str(x) for x in g)
        argv = cmd + flag_argv(f)
        out.append(Instance(host=host.name, name=f"port-{port}", index=i, gpus=g, port=port, argv=argv,
                            env=ienv, secret_keys=secret_keys, flags=f, public_argv=_mask_argv(argv, secrets),
                            launch=launch_spec(cmd, host.python, ienv, secret_keys, cwd=profile.cwd)))
    ports = [x.port for x in out]
    if len(set(ports)) != len(ports):
        raise InputError(f"{host.name}: instances share a port", hint="set layout.port_stride >= 1",
                         reference="launch-profile-invalid")
    return out
