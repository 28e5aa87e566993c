"""Regenerate the bad-input corpus and cases.yaml beside this file (the files are committed):
    python tests/bad_inputs/generate.py
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import test_faults as tf
import yaml

from fleetctl.engines import wheels
from fleetctl.patching import make_patch

R = Path(__file__).resolve().parent
EW2, SA = tf.EW2, tf.SA
o9 = wheels.pristine_bytes("0.5.9", EW2)
o14 = wheels.pristine_bytes("0.5.14", EW2)
s9, s14 = tf.sha(o9), tf.sha(o14)

def ins(b, text):
    first, rest = b.split(b"\n", 1)
    return first + b"\n" + text + rest

good9 = make_patch(o9, ins(o9, b"# ok\n"), EW2)
# a 0.5.14 patch that edits a line 0.5.9 does not have
l9 = set(o9.split(b"\n"))
line14 = next(x for x in o14.split(b"\n") if x.strip() and x not in l9 and not x.strip().startswith(b"#"))
p14 = make_patch(o14, o14.replace(line14, line14 + b"  # fleetctl: 0.5.14 only", 1), EW2)
sa9 = wheels.pristine_bytes("0.5.9", SA)
psa = make_patch(sa9, ins(sa9, b"# server_args\n"), SA)
pbreak = make_patch(o9, ins(o9, b"def broken(:\n"), EW2)

cases = []
def pb_case(name, text, patches=None, expect=r"", exit=2, note=""):
    d = R / "playbook" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "playbook.yaml").write_text(text)
    for fn, data in (patches or {}).items():
        (d / fn).write_bytes(data)
    cases.append({"name": "playbook/" + name, "kind": "playbook", "file": f"playbook/{name}/playbook.yaml",
                  "exit": exit, "expect": expect, "note": note})

def inv_case(name, text, expect, exit=2, note=""):
    d = R / "inventory"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(text)
    cases.append({"name": "inventory/" + name, "kind": "inventory", "file": f"inventory/{name}.yaml",
                  "exit": exit, "expect": expect, "note": note})

def pb(files, version="0.5.9", extra=""):
    lines = ["name: bad-input", "versions:", f'  "{version}":', "    files:"]
    for path, patch, sha in files:
        lines += [f"      - path: {path}", f"        patch: {patch}", f"        sha256: {sha}"]
    return "\n".join(lines) + "\n" + extra

# ---- playbooks
pb_case("malformed", "name: x\nversions:\n  \"0.5.9\":\n    files: [\n      - path: a\n", expect=r"playbook\.yaml:\d+: malformed YAML")
pb_case("unknown_key", "name: x\nversion:\n  \"0.5.9\": {files: []}\n", expect=r"playbook\.yaml:2: version: unknown key \(remove 'version'")
pb_case("misspelt_file_key", pb([(EW2, "p.diff", s9)]).replace("        patch:", "        pach:"), {"p.diff": good9},
        expect=r"playbook\.yaml:6: versions\.0\.5\.9\.files\.0\.pach: unknown key")
pb_case("wrong_type_files", "name: x\nversions:\n  \"0.5.9\":\n    files: just-a-string\n", expect=r"playbook\.yaml:4: versions\.0\.5\.9\.files: .*list")
pb_case("wrong_type_port", pb([(EW2, "p.diff", s9)], extra="launch:\n  port: eighty\n"), {"p.diff": good9},
        expect=r"playbook\.yaml:9: launch\.port: .*integer")
pb_case("missing_patch", pb([(EW2, "nope.diff", s9)]), expect=r"playbook\.yaml:6: versions\.0\.5\.9\.files\[0\]\.patch: cannot read nope\.diff")
pb_case("escape_path", pb([("../../../etc/passwd", "p.diff", s9)]), {"p.diff": good9}, expect=r"playbook\.yaml:5: .*escapes the package dir")
pb_case("absolute_path", pb([("/etc/passwd", "p.diff", s9)]), {"p.diff": good9}, expect=r"playbook\.yaml:5: .*escapes the package dir")
pb_case("tilde_path", pb([("~root/.bashrc", "p.diff", s9)]), {"p.diff": good9}, expect=r"playbook\.yaml:5: .*escapes the package dir")
pb_case("bad_sha", pb([(EW2, "p.diff", "abc123")]), {"p.diff": good9}, expect=r"playbook\.yaml:7: versions\.0\.5\.9\.files\.0\.sha256: .*pattern")
pb_case("not_a_release", pb([(EW2, "p.diff", s9)], version="latest"), {"p.diff": good9}, expect=r"playbook\.yaml:2: versions: version 'latest' is not an exact release")
pb_case("no_versions", "name: x\nversions: {}\n", expect=r"playbook\.yaml:2: versions: the playbook names no SGLang version")
pb_case("no_files", "name: x\nversions:\n  \"0.5.9\": {files: []}\n", expect=r"playbook\.yaml:3: versions\.0\.5\.9\.files: a version needs at least one file")
pb_case("wrong_package", pb([(EW2, "p.diff", s9)], extra="package: vllm\n"), {"p.diff": good9}, expect=r"playbook\.yaml:8: package: only package 'sglang'")
pb_case("duplicate_file", pb([(EW2, "p.diff", s9), (EW2, "p.diff", s9)]), {"p.diff": good9}, expect=r"playbook\.yaml:4: versions\.0\.5\.9\.files: file .* is listed twice")
pb_case("duplicate_key", pb([(EW2, "p.diff", s9)]).replace("name: bad-input\n", "name: bad-input\nname: again\n"), {"p.diff": good9},
        expect=r"playbook\.yaml:2: duplicate key 'name'")
pb_case("missing_name", pb([(EW2, "p.diff", s9)]).replace("name: bad-input\n", ""), {"p.diff": good9}, expect=r"playbook\.yaml:1: name: missing")
pb_case("top_level_list", "- name: x\n", expect=r"playbook\.yaml:1: playbook must be a YAML mapping")
pb_case("empty_patch", pb([(EW2, "p.diff", s9)]), {"p.diff": b""}, expect=r"p\.diff: .*the patch is empty")
pb_case("garbage_patch", pb([(EW2, "p.diff", s9)]), {"p.diff": b"this is not a diff\n\x00\xff\xfe garbage\n"}, expect=r"p\.diff: .*not a unified diff")
pb_case("truncated_patch", pb([(EW2, "p.diff", s9)]), {"p.diff": good9[: len(good9) // 2 + 1].rsplit(b"\n", 2)[0] + b"\n"},
        expect=r"p\.diff: .*(truncated|ends early|not followed by a hunk)")
pb_case("other_version_sha", pb([(EW2, "p.diff", s14)]), {"p.diff": p14}, expect=r"p\.diff: sha256 63d578964925.* does not match the real sglang 0\.5\.9 file")
pb_case("other_version_hunks", pb([(EW2, "p.diff", s9)]), {"p.diff": p14}, expect=r"p\.diff: .*(does not apply|not found|context)")
pb_case("other_file_patch", pb([(EW2, "p.diff", s9)]), {"p.diff": psa}, expect=r"p\.diff: .*(does not apply|not found|context|server_args)")
pb_case("breaks_syntax", pb([(EW2, "p.diff", s9)]), {"p.diff": pbreak}, expect=r"p\.diff: patched .* does not compile")

# ---- inventories (validation fails before any host is contacted; 127.0.0.1:1 is never dialled)
H = "hosts:\n  h01: {address: 127.0.0.1, port: 1}\n"
inv_case("malformed", "hosts:\n  h01: {address: 127.0.0.1, port: 1\n", r"malformed\.yaml:\d+: malformed YAML")
inv_case("tab_indent", "hosts:\n\th01: {address: 127.0.0.1}\n", r"tab_indent\.yaml:\d+: malformed YAML")
inv_case("unknown_key", "hosts:\n  h01:\n    address: 127.0.0.1\n    gpu: 8\n", r"unknown_key\.yaml:4: hosts\.h01\.gpu: unknown key \(remove 'gpu'")
inv_case("unknown_top_key", "host:\n  h01: {address: 127.0.0.1}\n", r"unknown_top_key\.yaml:1: host: unknown key")
inv_case("wrong_type_port", "hosts:\n  h01:\n    address: 127.0.0.1\n    port: twenty-two\n", r"wrong_type_port\.yaml:4: hosts\.h01\.port: .*integer")
inv_case("port_out_of_range", "hosts:\n  h01:\n    address: 127.0.0.1\n    port: 70000\n", r"port_out_of_range\.yaml:4: hosts\.h01\.port: .*65535")
inv_case("wrong_type_env", "hosts:\n  h01:\n    address: 127.0.0.1\n    env: [A, B]\n", r"wrong_type_env\.yaml:4: hosts\.h01\.env: not a mapping")
inv_case("bad_env_name", "hosts:\n  h01:\n    address: 127.0.0.1\n    env: {\"A-B\": 1}\n", r"bad_env_name\.yaml:4: hosts\.h01\.env: environment variable name 'A-B'")
inv_case("bad_flag_name", "hosts:\n  h01:\n    address: 127.0.0.1\n    flags: {speculative: 1}\n", r"bad_flag_name\.yaml:4: hosts\.h01\.flags: flag 'speculative' must look like --some-flag")
inv_case("bad_host_name", "hosts:\n  \"h01;touch x\": {address: 127.0.0.1}\n", r'bad_host_name\.yaml:2: hosts\."h01;touch x"\.\[key\]: not a valid name')
inv_case("duplicate_gpus", "hosts:\n  h01:\n    address: 127.0.0.1\n    gpus: [0, 0]\n", r"duplicate_gpus\.yaml:4: hosts\.h01\.gpus: .*distinct")
inv_case("negative_timeout", "hosts:\n  h01:\n    address: 127.0.0.1\n    command_timeout: -1\n", r"negative_timeout\.yaml:4: hosts\.h01\.command_timeout: .*greater than 0")
inv_case("missing_address", "hosts:\n  h01: {port: 22}\n", r"missing_address\.yaml:2: hosts\.h01\.address: missing")
inv_case("no_hosts", "hosts: {}\n", r"no_hosts\.yaml:1: hosts: the inventory names no host")
inv_case("missing_hosts", "defaults: {user: root}\n", r"missing_hosts\.yaml:1: hosts: missing")
inv_case("empty", "", r"empty\.yaml:1: hosts: missing")
inv_case("top_level_list", "- h01\n- h02\n", r"top_level_list\.yaml:1: inventory must be a YAML mapping")
inv_case("duplicate_host", H + "  h01: {address: 127.0.0.9, port: 1}\n", r"duplicate_host\.yaml:3: duplicate key 'h01'")
inv_case("missing_ssh_config", "ssh_config: ./no-such-ssh_config\n" + H, r"no-such-ssh_config: ssh_config file not found")
inv_case("missing_identity_file", "defaults: {identity_file: ./no-such-key}\n" + H, r"missing_identity_file\.yaml:1: defaults\.identity_file: .*no-such-key.* does not exist")
inv_case("secret_not_a_string", "hosts:\n  h01:\n    address: 127.0.0.1\n    env: {TOKEN: {value: [1], secret: true}}\n", r"secret_not_a_string\.yaml:4: hosts\.h01\.env")
(R / "inventory" / "not_utf8.yaml").write_bytes(b"hosts:\n  h01: {address: \xff\xfe}\n")
cases.append({"name": "inventory/not_utf8", "kind": "inventory", "file": "inventory/not_utf8.yaml", "exit": 2,
              "expect": r"not_utf8\.yaml: cannot read inventory: UnicodeDecodeError", "note": ""})
(R / "cases.yaml").write_text("# generated by the test author; each case: the file, the exit code and a regex the one error line must match\n"
                              + yaml.safe_dump(cases, sort_keys=False, width=200))
print(len(cases))
