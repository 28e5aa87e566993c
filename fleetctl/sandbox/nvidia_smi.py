"""STAND-IN for NVIDIA's `nvidia-smi` on fleetctl sandbox hosts. There is no GPU in the sandbox.

This is not nvidia-smi. It replays REAL captures taken on a 1-GPU H200 host (driver 580.159.04,
shipped in `fleetctl/sandbox/captures/h200-1gpu/`), so that fleetctl's GPU facts code parses the
bytes a real host prints. Each sandbox host's `bin/nvidia-smi` is a small sh script that runs this
file with the controller's interpreter (`python -I`, stdlib only) and sets:

    FLEETCTL_SANDBOX_HOST_DIR   the host's dir; its `gpu-state` file holds `idle` or `busy`
    FLEETCTL_SANDBOX_GPUS       how many GPUs the host has (the inventory's `gpus`)

Served forms (anything else exits 2 with the real tool's message):

    nvidia-smi                                    the summary table
    nvidia-smi -L | --list-gpus                   one line per GPU
    nvidia-smi -q | --query                       the full per-GPU report
    nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits]
    nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
    -i / --id=I[,J]                               restrict to GPU indices (with any of the above)

How G GPUs are served from a 1-GPU capture: the capture's GPU row/block is repeated per index with
the index, the UUID (last group + index), the PCI bus id (device 0x06 + index), the `-q` minor number
and module id adjusted. With G == 1 the output is byte-for-byte the capture (the timestamp is the
capture's: this is a replay). `busy` uses the busy captures (one compute process per GPU: pid 423 + index).
There is no busy `-q` capture: in the busy state `-q` is the idle report with FB memory used/free, GPU
utilization, current temperature and the process list taken from the busy query captures.
"""

from __future__ import annotations

import os
import sys

# Started once per query (sandbox hosts' `bin/nvidia-smi`), so it imports only os and sys up front
# (`re` where a form needs it): the real tool is a C program that answers a query in ~25 ms (two at
# once on an H200: docs/gpu-verified.md call 25); with dataclasses, pathlib and re this took ~70 ms.
CAPTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "captures", "h200-1gpu")

BAD_ARGS = "\nInvalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n"
NO_DEVICES = "No devices were found"

EXIT_OK = 0
EXIT_BAD_ARGS = 2  # nvidia-smi(1): "A supplied argument or flag is invalid"
EXIT_NOT_FOUND = 6  # nvidia-smi(1): "A query to find an object was unsuccessful"

HELP = """\
fleetctl sandbox STAND-IN for nvidia-smi (no GPU here; replays real H200 captures).

    nvidia-smi                     summary table
    nvidia-smi -L                  list GPUs
    nvidia-smi -q                  full report
    nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]
    nvidia-smi --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]
    -i, --id=INDEX[,INDEX]         restrict to these GPUs
"""

# names nvidia-smi accepts for a column, mapped to the capture's column name
GPU_FIELD_ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "temperature.gpu": "temperature.gpu",
    "utilization.gpu": "utilization.gpu",
}
APP_FIELD_ALIASES = {"name": "process_name", "used_memory": "used_gpu_memory"}

BASE_UUID = "GPU-00000000-1111-2222-3333-444444444444"
BASE_BUS = "00000000:00:06.0"
BASE_PID = 423


class Usage(Exception):
    """Bad arguments: print `text` on stdout and exit with `code`."""

    def __init__(self, text: str = BAD_ARGS, code: int = EXIT_BAD_ARGS) -> None:
        super().__init__(text)
        self.text = text
        self.code = code


def gpu_uuid(i: int) -> str:
    head, last = BASE_UUID.rsplit("-", 1)
    return f"{head}-{int(last, 16) + i:012x}"


def bus_id(i: int) -> str:
    return f"00000000:00:{6 + i:02X}.0"


def _read(name: str) -> str:
    with open(os.path.join(CAPTURES, name), encoding="utf-8") as fh:
        return fh.read()


def _rjust_sub(line: str, pattern: str, new: str) -> str:
    """Replace the first match of `pattern` (its leading spaces included) keeping the column width."""
    import re

    m = re.search(pattern, line)
    if not m:
        return line
    old = m.group(0)
    return line[: m.start()] + new.rjust(len(old)) + line[m.end():]


def _per_gpu(text: str, i: int) -> str:
    return text.replace(BASE_BUS, bus_id(i)).replace(BASE_UUID, gpu_uuid(i))


# ---- plain `nvidia-smi` ------------------------------------------------------------------------

def summary(busy: bool, gpus: list[int]) -> str:
    lines = _read("nvidia-smi-busy.txt" if busy else "nvidia-smi.txt").split("\n")
    bars = [k for k, ln in enumerate(lines) if ln.startswith("|====")]
    head = lines[: bars[0] + 1]
    block = lines[bars[0] + 1: bars[0] + 5]  # 3 lines of the GPU + the closing separator
    rest = lines[bars[0] + 5: bars[1] + 1]  # blank, processes header, its ==== line
    proc_rows = lines[bars[1] + 1:]  # rows, closing separator, "" after the final newline
    out = list(head)
    for i in gpus:
        first = _rjust_sub(block[0], r"(?<=^\|)\s+0\b", str(i))
        out += [_per_gpu(first, i), *block[1:]]
    out += rest
    rows, tail = proc_rows[:-2], proc_rows[-2:]
    if busy:
        for i in gpus:
            for r in rows:
                r = _rjust_sub(r, r"(?<=^\|)\s+0\b", str(i))
                out.append(_rjust_sub(r, rf"\s+{BASE_PID}\b", str(BASE_PID + i)))
    else:
        out += rows
    out += tail
    return "\n".join(out)


# ---- `nvidia-smi -L` ---------------------------------------------------------------------------

def list_gpus(gpus: list[int]) -> str:
    line = _read("nvidia-smi-L.txt").rstrip("\n")
    return "".join(_per_gpu(line.replace("GPU 0:", f"GPU {i}:", 1), i) + "\n" for i in gpus)


# ---- `nvidia-smi -q` ---------------------------------------------------------------------------

def _value_col(lines: list[str]) -> int:
    for ln in lines:
        if " : " in ln:
            return ln.index(" : ")
    return 55


def _kv(indent: int, key: str, value: str, col: int) -> str:
    return (" " * indent + key).ljust(col) + " : " + value


def _busy_q(block: list[str], i: int, col: int) -> list[str]:
    gpu = _csv_rows("query-gpu-busy.csv")
    g = dict(zip(gpu[0], gpu[1][0], strict=True))
    apps = _csv_rows("query-apps-busy.csv")
    a = dict(zip(apps[0], apps[1][0], strict=True))
    out: list[str] = []
    section = ""
    for ln in block:
        stripped = ln.strip()
        indent = len(ln) - len(ln.lstrip())
        if indent == 4 and " : " not in ln:
            section = stripped
        key = ln.split(" : ")[0].strip() if " : " in ln else ""
        if section == "FB Memory Usage" and key == "Used":
            ln = _kv(indent, key, g["memory.used [MiB]"], col)
        elif section == "FB Memory Usage" and key == "Free":
            ln = _kv(indent, key, g["memory.free [MiB]"], col)
        elif section == "Utilization" and key == "GPU":
            ln = _kv(indent, key, g["utilization.gpu [%]"], col)
        elif section == "Temperature" and key == "GPU Current Temp":
            ln = _kv(indent, key, g["temperature.gpu"] + " C", col)
        elif indent == 4 and key == "Processes":
            out += [
                " " * 4 + "Processes",
                _kv(8, "GPU instance ID", "N/A", col),
                _kv(8, "Compute instance ID", "N/A", col),
                _kv(8, "Process ID", str(int(a["pid"]) + i), col),
                _kv(12, "Type", "C", col),
                _kv(12, "Name", a["process_name"], col),
                _kv(12, "Used GPU Memory", a["used_gpu_memory [MiB]"], col),
            ]
            continue
        out.append(ln)
    return out


def query(busy: bool, gpus: list[int], total: int) -> str:
    import re

    lines = _read("nvidia-smi-q.txt").split("\n")
    start = next(k for k, ln in enumerate(lines) if ln.startswith("GPU "))
    head, block = lines[:start], lines[start:-1]  # drop the "" after the final newline
    col = _value_col(lines)
    head = [re.sub(r"(Attached GPUs\s+: )\d+", rf"\g<1>{total}", ln) for ln in head]
    out = list(head)
    for i in gpus:
        b = _busy_q(block, i, col) if busy else list(block)
        b = [_per_gpu(ln, i) for ln in b]
        b = [re.sub(r"^(\s+Minor Number\s+: )0$", rf"\g<1>{i}", ln) for ln in b]
        b = [re.sub(r"^(\s+Module Id\s+: )1$", rf"\g<1>{i + 1}", ln) for ln in b]
        b = [re.sub(r"^(\s+Device\s+: )0x06$", rf"\g<1>0x{6 + i:02X}", ln) for ln in b]
        out += b
    return "\n".join(out) + "\n"


# ---- --query-gpu / --query-compute-apps --------------------------------------------------------

def _csv_rows(name: str) -> tuple[list[str], list[list[str]]]:
    lines = [ln for ln in _read(name).split("\n") if ln]
    header = lines[0].split(", ")
    return header, [ln.split(", ") for ln in lines[1:]]


def _field_name(header_col: str) -> str:
    return header_col.split(" [", 1)[0]


def _strip_unit(value: str) -> str:
    for unit in (" MiB", " %", " W", " MHz", " C"):
        if value.endswith(unit):
            return value[: -len(unit)]
    return value


class CsvFormat:
    def __init__(self, header: bool = True, units: bool = True) -> None:
        self.header = header
        self.units = units


def parse_format(spec: str) -> CsvFormat:
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts or parts[0] != "csv" or any(p not in ("csv", "noheader", "nounits") for p in parts):
        raise Usage(f'"{spec}" is not a valid format. Only csv with noheader and nounits is served.\n')
    return CsvFormat(header="noheader" not in parts, units="nounits" not in parts)


def csv_query(kind: str, fields: str, fmt: CsvFormat, busy: bool, gpus: list[int]) -> str:
    if kind == "gpu":
        header, rows = _csv_rows("query-gpu-busy.csv" if busy else "query-gpu.csv")
        aliases = GPU_FIELD_ALIASES
        base = rows[0]
        table = []
        for i in gpus:
            r = [_per_gpu(v, i) for v in base]
            r[[_field_name(h) for h in header].index("index")] = str(i)
            table.append(r)
    else:
        header, rows = _csv_rows("query-apps-busy.csv" if busy else "query-apps-idle.csv")
        aliases = APP_FIELD_ALIASES
        table = []
        if busy:
            for i in gpus:
                r = [_per_gpu(v, i) for v in rows[0]]
                r[[_field_name(h) for h in header].index("pid")] = str(BASE_PID + i)
                table.append(r)
    names = [_field_name(h) for h in header]
    want = [f.strip() for f in fields.split(",") if f.strip()]
    if not want:
        raise Usage()
    cols: list[int] = []
    for f in want:
        name = aliases.get(f, f)
        if name not in names:
            raise Usage(f'Field "{f}" is not a valid field to query.\n')
        cols.append(names.index(name))
    out = []
    if fmt.header:
        out.append(", ".join(header[c] for c in cols))
    for r in table:
        out.append(", ".join(r[c] if fmt.units else _strip_unit(r[c]) for c in cols))
    return "".join(ln + "\n" for ln in out)


# ---- argument handling -------------------------------------------------------------------------

class Args:
    def __init__(self) -> None:
        self.mode = "summary"  # summary | list | query | query-gpu | query-apps | help
        self.fields = ""
        self.fmt: str | None = None
        self.ids: list[int] | None = None


def _take(argv: list[str], k: int, flag: str) -> tuple[str, int]:
    """The value of `flag` given as `--flag=v` or `--flag v`; returns (value, next index)."""
    a = argv[k]
    if a.startswith(flag + "="):
        return a[len(flag) + 1:], k + 1
    if k + 1 < len(argv):
        return argv[k + 1], k + 2
    raise Usage()


def parse_args(argv: list[str]) -> Args:
    args = Args()
    modes: list[str] = []
    k = 0
    while k < len(argv):
        a = argv[k]
        if a in ("-h", "--help"):
            modes.append("help")
            k += 1
        elif a in ("-L", "--list-gpus"):
            modes.append("list")
            k += 1
        elif a in ("-q", "--query"):
            modes.append("query")
            k += 1
        elif a == "--query-gpu" or a.startswith("--query-gpu="):
            args.fields, k = _take(argv, k, "--query-gpu")
            modes.append("query-gpu")
        elif a == "--query-compute-apps" or a.startswith("--query-compute-apps="):
            args.fields, k = _take(argv, k, "--query-compute-apps")
            modes.append("query-apps")
        elif a == "--format" or a.startswith("--format="):
            args.fmt, k = _take(argv, k, "--format")
        elif a in ("-i", "--id") or a.startswith("--id="):
            raw, k = _take(argv, k, "--id") if a.startswith("--id") else _take(argv, k, "-i")
            try:
                args.ids = [int(x) for x in raw.split(",") if x.strip()]
            except ValueError:
                raise Usage() from None
        else:
            raise Usage()
    if len(modes) > 1:
        raise Usage()
    args.mode = modes[0] if modes else "summary"
    if args.mode in ("query-gpu", "query-apps") and args.fmt is None:
        raise Usage("Missing --format. Please run 'nvidia-smi -h' for help.\n")
    if args.fmt is not None and args.mode not in ("query-gpu", "query-apps"):
        raise Usage()
    return args


def _host_state() -> tuple[bool, int]:
    host_dir = os.environ.get("FLEETCTL_SANDBOX_HOST_DIR", "")
    try:
        total = int(os.environ.get("FLEETCTL_SANDBOX_GPUS", "1"))
    except ValueError:
        total = 1
    busy = False
    if host_dir:
        try:
            with open(os.path.join(host_dir, "gpu-state"), encoding="utf-8") as fh:
                busy = fh.read().strip() == "busy"
        except FileNotFoundError:
            busy = False
    return busy, total


def render(argv: list[str]) -> tuple[str, int]:
    """(stdout text, exit code) for one invocation."""
    try:
        args = parse_args(argv)
        if args.mode == "help":
            return HELP, EXIT_OK
        busy, total = _host_state()
        gpus = list(range(total))
        if args.ids is not None:
            if any(i not in gpus for i in args.ids):
                return NO_DEVICES + "\n", EXIT_NOT_FOUND
            gpus = [i for i in gpus if i in args.ids]
        if not gpus:
            return NO_DEVICES + "\n", EXIT_NOT_FOUND
        if args.mode == "list":
            return list_gpus(gpus), EXIT_OK
        if args.mode == "query":
            return query(busy, gpus, total), EXIT_OK
        if args.mode in ("query-gpu", "query-apps"):
            fmt = parse_format(args.fmt or "")
            kind = "gpu" if args.mode == "query-gpu" else "apps"
            return csv_query(kind, args.fields, fmt, busy, gpus), EXIT_OK
        return summary(busy, gpus), EXIT_OK
    except Usage as u:
        return u.text, u.code


def main(argv: list[str] | None = None) -> int:
    text, code = render(list(sys.argv[1:] if argv is None else argv))
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
