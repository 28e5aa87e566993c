"""become: the agent run as another user on the host, as Ansible's `become` means it.

A wrapper layer of the remote argv, nothing more: `wrap(host, argv)` puts `sudo -n -H -u USER --`
in front of the command that starts the agent (the interpreter, never a shell), so whatever builds
that argv (the plain agent, or one inside a container) composes with it. With --ask-become-pass
the wrapper is `sudo -S -p PROMPT ...`: sudo reads the password from its stdin, and the session
(transport/session.py) sends it there only when sudo's own prompt (PROMPT, on stderr) asks for it,
so a sudo that needs none (NOPASSWD, a cached ticket) never sees it and the agent never reads it.
The password is asked once per command (`ask_password`), kept in this process only, never put on
a command line, in a log, a record or an error.

Only sudo: `su` reads a password from a terminal only (fleetctl never opens one on a host), and
doas has no option to read it from stdin; both are refused with the fix (docs/user-guide.md).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fleetctl.config.hosts import BECOME_METHODS as METHODS
from fleetctl.config.hosts import BECOME_UNSUPPORTED as UNSUPPORTED
from fleetctl.config.hosts import BECOME_USER_RE as USER_RE
from fleetctl.errors import InputError

if TYPE_CHECKING:
    from fleetctl.config.hosts import Host

# sudo's prompt (-p; %U: the user to become): what the session waits for on stderr before it sends the
# password; spelled so that no other line of sudo (or of a login script) is taken for it
PROMPT = "[fleetctl become] password to become %U: "
PROMPT_MARK = b"[fleetctl become] password to become "
ASK = "BECOME password: "  # what the controller asks (Ansible's words for the same question)


def check_method(method: str | None, where: str) -> None:
    """A become_method fleetctl can run, else the one line that says why not and what works."""
    if method is None or method in METHODS:
        return
    why = UNSUPPORTED.get(method, f"unknown become method {method!r}")
    raise InputError(f"{where}: become_method {method}: not supported: {why}",
                     hint="use become_method: sudo (the only one fleetctl runs) with a sudoers rule for the "
                          "interpreter, or leave become off", reference="become-invalid")


def check_user(user: str | None, where: str) -> None:
    if user is not None and not USER_RE.match(user):
        raise InputError(f"{where}: become_user {user!r} is not a user name", hint="name the user to become, e.g. root",
                         reference="become-invalid")


@dataclass(frozen=True)
class Cli:
    """The command line's -b/--become, --become-user, --become-method, -K/--ask-become-pass."""

    become: bool = False
    user: str | None = None
    method: str | None = None
    ask_pass: bool = False


def apply(hosts: list[Host], cli: Cli) -> list[Host]:
    """Each host with the command line's become settings where its inventory says nothing (Ansible:
    a host's ansible_become* variables take precedence over -b, --become-user, --become-method)."""
    check_method(cli.method, "--become-method")
    check_user(cli.user, "--become-user")
    out = []
    for h in hosts:
        become = h.become if h.become is not None else (True if cli.become else None)
        user = h.become_user if h.become_user is not None else cli.user
        method = h.become_method if h.become_method is not None else cli.method
        if (become, user, method) != (h.become, h.become_user, h.become_method):
            h = replace(h, become=become, become_user=user, become_method=method)
        out.append(h)
    return out


_password: bytes | None = None


def set_password(pw: str | None) -> None:
    global _password
    _password = None if pw is None else pw.encode("utf-8")


def password() -> bytes | None:
    """The become password of this command (--ask-become-pass), or None."""
    return _password


def ask_password() -> None:
    """Ask for the become password once, never echoed: from the terminal (getpass: /dev/tty, or stdin
    when that is a terminal); from stdin's first line when stdin is not a terminal (a pipe echoes
    nothing). Kept in this process only."""
    import getpass

    if os.isatty(sys.stdin.fileno()) or _has_tty():
        pw = getpass.getpass(ASK, stream=sys.stderr)
    else:
        sys.stderr.write(ASK)
        sys.stderr.flush()
        got = sys.stdin.readline()
        if not got:
            raise InputError("--ask-become-pass: no password given (stdin ended)",
                             hint="type it when asked, or feed it as the first line of stdin",
                             reference="become-invalid")
        pw = got.rstrip("\n").rstrip("\r")
        sys.stderr.write("\n")
    if "\n" in pw or "\0" in pw:
        raise InputError("--ask-become-pass: the password holds a newline or NUL byte", hint="sudo cannot take it",
                         reference="become-invalid")
    set_password(pw)


def _has_tty() -> bool:
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def wrap(host: Host, argv: list[str]) -> list[str]:
    """`argv` (an interpreter and its arguments: no shell) run as the host's become user, or as is."""
    if not host.becomes:
        return argv
    user = host.become_as
    if _password is not None:
        return ["sudo", "-S", "-p", PROMPT, "-H", "-u", user, "--", *argv]
    return ["sudo", "-n", "-H", "-u", user, "--", *argv]


def rule(host: Host) -> str:
    """The sudoers line that lets the host's login run its interpreter as the become user, no password."""
    if host.container:  # (become runs the container runtime's client: transport/layers.py)
        from fleetctl.config.containers import ContainerSpec

        spec = ContainerSpec.of(host.container)
        assert spec is not None
        py = spec.command[0] if spec.command[0].startswith("/") else f"/full/path/of/{spec.command[0]}"
    else:
        py = host.python if host.python.startswith("/") else f"/full/path/of/{host.python}"
    return f"{host.user or 'LOGIN'} ALL=({host.become_as}) NOPASSWD: {py}"


def diagnose(host: Host, stderr: str, rc: int | None) -> tuple[str, str] | None:
    """Why sudo did not start the agent (its stderr, exit status): (the line naming the host, the fix),
    or None when it is not sudo's doing."""
    h, user, login = host.name, host.become_as, host.user or "the login user"
    s = stderr
    if "a password is required" in s:
        return (f"{h}: sudo asks for a password to become {user} (become, sudo -n)",
                f"allow the interpreter without one (sudoers: '{rule(host)}'), or rerun with --ask-become-pass")
    if "is not allowed to execute" in s or "is not in the sudoers file" in s or "may not run sudo" in s:
        return (f"{h}: sudoers does not let {login} run {host.python} as {user} (become)",
                f"allow it (sudoers: '{rule(host)}'), or set become_user to a user it may become")
    if "incorrect password attempt" in s or "no password was provided" in s:
        return (f"{h}: sudo did not accept the become password to become {user}",
                "rerun with --ask-become-pass and the password of the login user")
    if "unknown user" in s:
        return (f"{h}: become_user {user} does not exist on the host", "fix become_user in the inventory or "
                "--become-user")
    if "a terminal is required" in s or "no tty present" in s or "must have a tty" in s:
        return (f"{h}: sudo there requires a terminal (Defaults requiretty) to become {user}",
                f"drop requiretty for {login} in sudoers (fleetctl never opens a terminal on a host)")
    if rc == 127 and re.search(r"\bsudo\b.*not found|not found.*\bsudo\b", s):
        return (f"{h}: sudo is not installed on the host (become)", "install it there (apt-get install sudo), or "
                "set become: false for this host")
    return None
