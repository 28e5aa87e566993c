"""The fleetctl command line: parse, call, render, exit code. Thin on purpose."""

from __future__ import annotations

import sys
import traceback

import typer

from fleetctl import __version__
from fleetctl.commands import common
from fleetctl.commands.context import Interrupted
from fleetctl.errors import EXIT_BAD_INPUT, EXIT_FAILED, FleetctlError

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


def _register_all() -> None:
    from fleetctl.commands import facts, fleetops, patch, sandbox, servers

    # Order here is the order `fleetctl --help` lists them.
    fleetops.register(app)
    servers.register(app)
    facts.register(app)
    patch.register(app)
    sandbox.register(app)


_register_all()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        try:
            app(args=args, prog_name="fleetctl")
        except SystemExit as e:  # typer/click exit with the code they decided
            c = e.code
            code = c if isinstance(c, int) else (0 if c is None else EXIT_BAD_INPUT)
        else:
            code = 0
    except Interrupted as e:  # the per-host report is already on stderr
        sys.stderr.write(f"{e.line()}\n")
        code = e.exit_code
    except FleetctlError as e:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"error: {e.line()}\n")  # one line, never wrapped
        code = e.exit_code
    except KeyboardInterrupt:
        common.err.print("interrupted", markup=False)
        code = 130
    except Exception as e:  # an internal error: one line unless --debug
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"internal error: {e.__class__.__name__}: {e} (rerun with --debug for the traceback)\n")
        code = EXIT_FAILED
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
