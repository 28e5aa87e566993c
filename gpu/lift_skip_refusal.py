"""Plan 014x only (run in the device's patched copy, never on the playbook's diffs): lift the payload's
refusal of SGLang's experimental SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND, to measure a skipped step
without its draft extend."""
import pathlib

p = pathlib.Path("sglang/srt/speculative/eagle_worker_v2.py")
s = p.read_text()
old = "if envs.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND.get():\n                raise ValueError("
assert s.count(old) == 1, "refusal not found"
p.write_text(s.replace(old, "if False:  # lifted for plan 014x\n                raise ValueError(", 1))
print("lifted the SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND refusal in", p)
