"""Rebuild carry/patches/<release>/ from a checkout's playbook (diffs, PINS.json, pre-patched copies).
  python3 refresh_patches.py REL MAIN SITE   (SITE: a pristine site dir holding sglang/)"""
import hashlib, json, os, re, shutil, subprocess, sys, tempfile
rel, main, site = sys.argv[1:]
here = os.path.dirname(os.path.abspath(__file__))
pdir = os.path.join(here, "carry", "patches", rel)
shutil.rmtree(pdir, ignore_errors=True); os.makedirs(os.path.join(pdir, "patched"))
src = os.path.join(main, "playbooks/dynamic-spec-disable/patches", rel)
for f in os.listdir(src):
    shutil.copy(os.path.join(src, f), pdir)
text = open(os.path.join(main, "playbooks/dynamic-spec-disable/playbook.yaml")).read()
block = text.split(f'  "{rel}":', 1)[1].split("\n  \"", 1)[0]
tmp = tempfile.mkdtemp()
tree = os.path.join(tmp, "sglang")
shutil.copytree(os.path.join(site, "sglang", "srt"), os.path.join(tree, "srt"))
pins = {}
for path, diff, pristine in re.findall(r"- path: (\S+)\n\s+patch: (\S+)\n\s+sha256: (\w+)", block):
    target = os.path.join(tree, path)
    assert hashlib.sha256(open(target, "rb").read()).hexdigest() == pristine, path
    subprocess.run(["patch", "-p1", "-s", "-i", os.path.join(pdir, os.path.basename(diff))], cwd=tree, check=True)
    patched = hashlib.sha256(open(target, "rb").read()).hexdigest()
    shutil.copyfile(target, os.path.join(pdir, "patched", path.replace("/", "__")))
    pins[path] = {"diff": os.path.basename(diff), "pristine_sha256": pristine, "patched_sha256": patched}
json.dump(pins, open(os.path.join(pdir, "PINS.json"), "w"), indent=1)
shutil.rmtree(tmp)
print(rel, {k: v["patched_sha256"][:12] for k, v in pins.items()})
