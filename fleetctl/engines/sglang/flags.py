"""Whether a release's server_args.py registers a server flag, read from its source (the controller's
own copy of the test the host agent makes: remote/hostfacts.py flag_registered, which stays stdlib-only
on the host; tests/test_launch.py holds the two to the same answers)."""

from __future__ import annotations

import re

_OPTION = re.compile(r"""["'](--[A-Za-z0-9][A-Za-z0-9_-]*)["']""")


def flag_registered(server_args_text: str, flag: str) -> bool:
    """Does this server_args.py source register `flag`? Either the option string is spelled out, or
    ServerArgs has a field of that name (newer releases derive options from annotated fields), or
    `flag` is an unambiguous prefix of exactly one option spelled out (argparse's allow_abbrev)."""
    if f'"{flag}"' in server_args_text or f"'{flag}'" in server_args_text:
        return True
    dest = flag.lstrip("-").replace("-", "_")
    if re.search(rf"^[ \t]+{re.escape(dest)}[ \t]*:", server_args_text, re.M) is not None:
        return True
    if flag.startswith("--") and len(flag) > 3:
        options = set(_OPTION.findall(server_args_text))
        return len([o for o in options if o.startswith(flag)]) == 1
    return False
