"""pyinfra's version of the bench job (run by bench.py: `pyinfra INVENTORY.py pyinfra_deploy.py -y`).

Per host: for each intended file of the host's SGLang version, back the current file up (a
`cp -p` to `<file>.bench-bak`, only when its sha256 differs: `files.put` has no backup of its
own, pyinfra#510), `files.put` it (pyinfra compares the remote SHA1 and skips an identical file),
then one `sha256sum -c` of every file.
"""

from pyinfra import host
from pyinfra.facts.files import Sha256File
from pyinfra.operations import files, server

checks = []
for item in host.data.bench_files:
    dest = item["dest"]
    if host.get_fact(Sha256File, path=dest) != item["sha256"]:
        server.shell(name=f"backup {item['rel']}", commands=[f"cp -p -- '{dest}' '{dest}.bench-bak'"])
    files.put(name=f"put {item['rel']}", src=item["src"], dest=dest)
    checks.append(f"'{item['sha256']}  {dest}'")

server.shell(name="verify sha256", commands=[f"printf '%s\\n' {' '.join(checks)} | sha256sum -c --quiet -"])
