"""Everything fleetctl knows about SGLang internals, per release (see releases.py for the table)."""

from fleetctl.engines.sglang.logs import (
    DUMP_ANCHOR,
    READY_LINE,
    LogLine,
    expected_ranks,
    format_line,
    format_startup_warning,
    parse_line,
    parse_server_args_dump,
    rank_prefix,
    server_args_dump,
)
from fleetctl.engines.sglang.releases import KNOWN_VERSIONS, PORT_FLAG
from fleetctl.engines.sglang.routing import (
    Resolution,
    eagle_worker_classes,
    is_known,
    parse_flags,
    resolve_worker,
    worker_files,
)

__all__ = [
    "DUMP_ANCHOR",
    "KNOWN_VERSIONS",
    "PORT_FLAG",
    "READY_LINE",
    "LogLine",
    "Resolution",
    "eagle_worker_classes",
    "expected_ranks",
    "format_line",
    "format_startup_warning",
    "is_known",
    "parse_flags",
    "parse_line",
    "parse_server_args_dump",
    "rank_prefix",
    "resolve_worker",
    "server_args_dump",
    "worker_files",
]
