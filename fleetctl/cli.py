"""The fleetctl command line: parse, call, render, exit code. Thin on purpose.

Start-up is kept light (issue 16.10): `fleetctl --help` and `--version` import
typer and nothing of fleetctl's own dependencies (paramiko, fabric, pydantic, rich). The command
modules are imported only when their command is the one being run (or its own --help is asked for).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from fleetctl import __version__, commands
from fleetctl.commands import coerce
from fleetctl.errors import EXIT_BAD_INPUT, EXIT_FAILED, FleetctlError, Interrupted

# the command table: fleetctl/commands/__init__.py (name -> options module, implementation, help)
COMMANDS = commands.COMMANDS


coerce.install()  # option values converted without importing pydantic (issue 16.10)


class LazyGroup(TyperGroup):
    """The root group: knows every command's name and help, imports a command's module on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS) + [n for n in self.commands if n not in COMMANDS]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            self.commands.update(load_commands(COMMANDS[cmd_name].options))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = {n: self.commands.get(n) or TyperCommand(name=n, help=c.summary) for n, c in COMMANDS.items()}
        rows.update({n: c for n, c in self.commands.items() if n not in rows})
        limit = formatter.width - 6 - max(len(n) for n in rows)
        with formatter.section("Commands"):
            formatter.write_dl([(n, c.get_short_help_str(limit)) for n, c in rows.items()])

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] not in COMMANDS:
            # a typo (answered with the close names of every command), or a command a module
            # defines without a row in COMMANDS: load them all, the slow path
            for module in dict.fromkeys(c.options for c in COMMANDS.values()):
                for n, c in load_commands(module).items():
                    self.commands.setdefault(n, c)
        return super().resolve_command(ctx, args)


def load_commands(module: str) -> dict[str, Any]:
    """The click commands a command module registers."""
    mod = importlib.import_module(f"fleetctl.commands.{module}")
    sub = typer.Typer(rich_markup_mode=None, add_completion=False)
    mod.register(sub)
    sub.callback()(lambda: None)  # always a group, even for a module with one command
    commands = dict(typer.main.get_group(sub).commands)
    for c in commands.values():
        _guard_values(c)
    return commands


def _guard_values(command: Any) -> None:
    """An option's value that is another option of the same command is a forgotten value, never
    meant: `stop -i --limit h03` would take '--limit' as the inventory and 'h03' as the playbook, and
    fail on a file that was never named. Refused as a usage error (exit 2) naming both options."""
    for sub in getattr(command, "commands", {}).values():
        _guard_values(sub)
    parse = command.parse_args

    def parse_args(ctx: Any, args: list[str]) -> list[str]:
        check_values(command, args, ctx)
        return parse(ctx, args)

    command.parse_args = parse_args


# what a command that takes no playbook works from, for the usage error of one given a playbook anyway
# (`rollback -i INV PLAYBOOK`, typed after `deploy -i INV PLAYBOOK`)
NO_PLAYBOOK = {
    "rollback": "it restores each host's files from that host's own deploy records (pick a deploy with --to ID)",
    "facts": "it reads every host as it is",
    "servers": "it lists the servers fleetctl launched on the hosts",
}


def check_values(command: Any, args: list[str], ctx: Any = None) -> None:
    opts = [p for p in command.params if getattr(p, "param_type_name", "") == "option"]
    takes_value = {o for p in opts if not p.is_flag and not p.count for o in p.opts}
    names = {o for p in opts for o in [*p.opts, *p.secondary_opts]} | {"--help"}
    from typer._click.exceptions import UsageError

    for i, a in enumerate(args[:-1]):
        if a == "--":
            break
        if a in takes_value and args[i + 1] in names:
            raise UsageError(f"Option '{a}' needs a value, and the next word is the option '{args[i + 1]}': "
                             f"give {a} its value (e.g. {a} VALUE {args[i + 1]} ...)", ctx=ctx)
    why = NO_PLAYBOOK.get(getattr(command, "name", "") or "")
    if why and not any(getattr(p, "param_type_name", "") == "argument" for p in command.params):
        word = next((w for w in _positional(args, takes_value) if _names_playbook(w)), None)
        if word is not None:
            raise UsageError(f"'{command.name}' takes no playbook (got '{word}'): {why}; drop it and name the "
                             "hosts with -i INVENTORY [--limit HOSTS]", ctx=ctx)


def _positional(args: list[str], takes_value: set[str]) -> list[str]:
    """The words of `args` that are neither options nor option values."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
        elif a == "--":
            return out + args[i + 1:]
        elif a.startswith("-") and a != "-":
            skip = a in takes_value
        else:
            out.append(a)
    return out


def _names_playbook(word: str) -> bool:
    """Whether `word` names a playbook: a directory holding playbook.yaml, or a file playbook.y(a)ml."""
    from pathlib import Path

    p = Path(word)
    try:
        return (p.is_dir() and (p / "playbook.yaml").is_file()) or (p.is_file() and p.name in ("playbook.yaml",
                                                                                               "playbook.yml"))
    except OSError:
        return False


app = typer.Typer(
    name="fleetctl",
    help=(
        "Roll SGLang patches across GPU fleets over SSH, launch the servers, prove from the logs "
        "that the patched code is what runs on every host and rank, and roll back."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    cls=LazyGroup,
)


def _version(value: bool) -> None:
    if value:
        print(f"fleetctl {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """fleetctl: deploy, launch, verify-logs, rollback."""


def _print_traceback() -> None:
    import traceback

    from fleetctl.ui.safetext import DETAIL_LIMIT, clean

    sys.stderr.write(clean(traceback.format_exc(), limit=DETAIL_LIMIT) + "\n")


def _clean(x: object) -> str:
    from fleetctl.ui.safetext import clean

    return clean(x, multiline=False)


class _Tee:
    """stderr, with its last lines kept (--json: the error envelope names the error printed)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.kept = ""

    def write(self, s: str) -> int:
        self.kept = (self.kept + s)[-8192:]
        return self.real.write(s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def error_line(self) -> str:
        lines = [ln.strip() for ln in self.kept.splitlines() if ln.strip()]
        for ln in reversed(lines):
            for prefix in ("error: ", "Error: ", "internal error: "):
                if ln.startswith(prefix):
                    return ln[len(prefix):] if prefix != "internal error: " else ln
        return lines[-1] if lines else "failed"


# the reference of the error this run ended with (docs/errors.md): the error envelope says it
last_reference: str | None = None


def _error_envelope(args: list[str], code: int, tee: _Tee) -> None:
    """--json and the command printed no document (bad input, an error before any host): the
    envelope saying so, so a script reading stdout always gets one (docs/json.md)."""
    import json

    from fleetctl.ui.jsonout import envelope

    words = [a for a in args if not a.startswith("-")]
    command = " ".join(words[:2]) if words[:1] in (["patch"], ["sandbox"]) else (words[0] if words else "fleetctl")
    doc = envelope(command, ok=False, message=tee.error_line(), hosts=[],
                   error={"exit_code": code, "bad_input": code == 2,
                          "reference": last_reference or ("usage-error" if code == 2 else "failed")})
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    from fleetctl.commands import common

    common.ARGV = list(args)
    want_json = "--json" in args
    tee = None
    if want_json:
        import fleetctl.ui.jsonout

        fleetctl.ui.jsonout.emitted = False
        tee = _Tee(sys.stderr)
        sys.stderr = tee  # type: ignore[assignment]
    try:
        code = _main(args)
    finally:
        if tee is not None:
            sys.stderr = tee.real
    if tee is not None and code != 0:
        import fleetctl.ui.jsonout

        if not fleetctl.ui.jsonout.emitted:
            _error_envelope(args, code, tee)
            sys.stdout.flush()
    return code


def _main(args: list[str]) -> int:
    global last_reference
    last_reference = None
    debug = "--debug" in args
    from fleetctl.model import suggest

    suggest.set_from_argv(args)
    try:
        try:
            app(args=args, prog_name="fleetctl")
        except SystemExit as e:  # typer/click exit with the code they decided
            c = e.code
            code = c if isinstance(c, int) else (0 if c is None else EXIT_BAD_INPUT)
            if code == 130:  # typer turns a Ctrl-C outside a fleet step into a silent exit 130
                sys.stderr.write("interrupted (Ctrl-C)\n")
                last_reference = "interrupted"
            elif code == EXIT_BAD_INPUT:  # click's usage errors: an unknown option, a missing argument
                last_reference = "usage-error"
        else:
            code = 0
    # Error lines carry host and inventory text: control characters (newlines too) are escaped,
    # so the line stays one line and nothing reaches the terminal raw.
    except Interrupted as e:  # the per-host report is already on stderr
        sys.stderr.write(f"{_clean(e.line())}\n")
        code, last_reference = e.exit_code, e.reference
    except FleetctlError as e:
        last_reference = e.reference
        if debug:
            _print_traceback()
        sys.stderr.write(f"error: {_clean(e.line())}\n")  # one line, never wrapped
        code = e.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code, last_reference = 130, "interrupted"
    except Exception as e:  # an internal error: one line unless --debug
        if debug:
            _print_traceback()
        sys.stderr.write(f"internal error: {e.__class__.__name__}: {_clean(e)} "
                         "(rerun with --debug for the traceback)\n")
        code, last_reference = EXIT_FAILED, "internal-error"
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
