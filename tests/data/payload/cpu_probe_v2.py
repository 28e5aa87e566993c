"""Opt-in CPU probe of the patched EAGLEWorkerV2 of 0.5.11 / 0.5.12 / 0.5.12.post1 (run by
tests/test_payload.py when FLEETCTL_SGLANG_PYTHON names an interpreter with SGLang's import-time
dependencies, e.g. fleetctl's CPU venv, fleetctl/sandbox/cpu_venv.py). Not run in CI.

usage: python cpu_probe_v2.py SITE_DIR VERSION
SITE_DIR holds the patched `sglang/` package. Prints one JSON object.

What it runs, all on CPU, with the real (patched) module imported as SGLang imports it:
- skipped decode steps through the real `forward_batch_generation` -> `_dsd_skipped_step` -> `verify`
  (`_dsd_prepare_decode`, the release's own `EagleVerifyInput.sample`, `GenerationBatchResult`),
  with the target model faked (its forward records the batch it is given), then the real deferred
  draft extend (`_dsd_defer_draft_extend`, `_dsd_catch_up`) through the release's own
  `prepare_for_extend_to_fill_draft_kvcache`, with the draft model faked the same way;
- a drafting step after skipped ones: the real catch-up before drafting, then `draft` (faked).
ForwardBatch.init_new is replaced by a recorder (it reads GPU-only pieces), and the three GPU kernels
reached (the cache-location writer, the one-node greedy verify, the bonus-token filler) by small
torch stand-ins. What is checked: the DECODE forward's tokens, KV slots, lengths and hidden-state
mode; the result's stride and accept lengths; what the future map gets (new seq_lens and the
verify_done event the scheduler waits for: recorded before the step's target forward, after a catch-up); the kept tokens, positions
and KV slots of each catch-up; the draft input the catch-up leaves.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_probe import _Stubs  # the same stubs of native modules as the v1 probe


def probe(version: str) -> dict:
    import sglang.srt.speculative.eagle_info_v2 as eiv2
    import sglang.srt.speculative.eagle_worker_v2 as m
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.server_args import ServerArgs

    with contextlib.suppress(Exception):
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))

    old = version == "0.5.11"  # verified_id / num_accepted_*; the scheduler reads the worker's stride
    bonus_field = "verified_id" if old else "bonus_tokens"
    bs, rows, hidden_t, hidden_d, vocab, nd = 3, 4, 12, 4, 32, 4
    rec: dict = {"init_new": [], "target": [], "draft": [], "attn_init": []}

    # --- GPU kernels reached, as torch stand-ins
    def assign_locs(req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num, device):
        return torch.cat([req_to_token[int(r), int(s):int(e)]
                          for r, s, e in zip(req_pool_indices, start_offset, end_offset, strict=True)])

    def verify_one_node(predicts, accept_index, accept_token_num, candidates, retrieve_index,
                        retrieve_next_token, retrieve_next_sibling, target_predict, topk=-1):
        assert bool((retrieve_next_token == -1).all()) and candidates.shape[1] == 1, "one-node trees only"
        root = retrieve_index[:, 0]
        accept_index[:, 0] = root.to(accept_index.dtype)
        predicts[root] = target_predict[:, 0].to(predicts.dtype)
        accept_token_num.zero_()
        return predicts, accept_index, accept_token_num

    class Filler:
        def __getitem__(self, grid):
            def fill(tokens, accept_lens, out, stride):
                for i in range(grid[0]):
                    out[i] = tokens.reshape(-1)[stride * i + int(accept_lens[i]) - 1]
            return fill

    m.assign_extend_cache_locs_func = assign_locs
    eiv2.verify_tree_greedy_func = verify_one_node
    setattr(m, "fill_new_verified_id" if old else "fill_bonus_tokens", Filler())

    def init_new(batch, runner):
        mode = batch.forward_mode
        entry = {"runner": runner.name, "mode": mode.name, "seq_lens": batch.seq_lens.tolist(),
                 "input_ids": batch.input_ids.tolist(), "out_cache_loc": batch.out_cache_loc.tolist(),
                 "capture": batch.capture_hidden_mode.name, "spec_info_none": batch.spec_info is None}
        if mode == ForwardMode.DECODE:
            entry["positions"] = (batch.seq_lens - 1).tolist()
            entry["seq_lens_cpu"] = batch.seq_lens_cpu.tolist()
            entry["seq_lens_sum"] = batch.seq_lens_sum
        else:
            entry["extend_prefix_lens"] = list(batch.extend_prefix_lens)
            entry["extend_seq_lens"] = list(batch.extend_seq_lens)
            entry["hidden_rows"] = int(batch.spec_info.hidden_states.shape[0])
            entry["hidden_first_col"] = batch.spec_info.hidden_states[:, 0].tolist()
        rec["init_new"].append(entry)
        return types.SimpleNamespace(forward_mode=mode, input_ids=batch.input_ids, seq_lens=batch.seq_lens,
                                     extend_prefix_lens=getattr(batch, "extend_prefix_lens", None),
                                     batch_size=len(batch.seq_lens), spec_info=batch.spec_info,
                                     capture_hidden_mode=batch.capture_hidden_mode, return_logprob=False)

    torch.Tensor.record_stream = lambda self, stream: None  # a CUDA-stream bookkeeping call
    m.ForwardBatch.init_new = staticmethod(init_new)
    eiv2.ForwardBatch.init_new = staticmethod(init_new)

    step = {"t": 0}

    class Graphs:
        """The DECODE graph runner of skipped steps (can run every batch size here)."""

        def __init__(self, name):
            self.name = name

        def can_run(self, fb):
            return fb.forward_mode == ForwardMode.DECODE and fb.capture_hidden_mode == CaptureHiddenMode.FULL

        def replay_prepare(self, fb):
            rec["attn_init"].append((self.name, fb.forward_mode.name))

        def __repr__(self):
            return self.name

    class TargetRunner:
        name = "target"
        hybrid_gdn_config = mamba2_config = None
        graph_runner = Graphs("verify-graphs")
        attn_backend = types.SimpleNamespace(
            init_forward_metadata=lambda fb: rec["attn_init"].append(("target", fb.forward_mode.name)))

    class Target:
        model_runner = TargetRunner()

        def forward_batch_generation(self, model_worker_batch=None, forward_batch=None, is_verify=False,
                                     skip_attn_backend_init=False):
            fb = forward_batch
            n = len(fb.input_ids)
            rec["target"].append({"mode": fb.forward_mode.name, "tokens": n, "is_verify": is_verify,
                                  "skip_attn_backend_init": skip_attn_backend_init,
                                  "graph_runner": repr(self.model_runner.graph_runner)})
            # the target's next token: input + 1; its hidden state: 100 * step + row
            logits = torch.full((n, vocab), -10.0)
            logits[torch.arange(n), (fb.input_ids.long() + 1) % vocab] = 10.0
            hid = (100.0 * step["t"] + torch.arange(n, dtype=torch.float32))[:, None].repeat(1, hidden_t)
            lo = types.SimpleNamespace(next_token_logits=logits, hidden_states=hid, next_token_logprobs=None)
            return types.SimpleNamespace(logits_output=lo, can_run_cuda_graph=False, routed_experts_output=None,
                                         indexer_topk_output=None)

    class DraftRunner:
        name = "draft"
        tp_group = None
        model_config = types.SimpleNamespace(vocab_size=vocab)
        spec_algorithm = types.SimpleNamespace(is_standalone=lambda: False)
        attn_backend = types.SimpleNamespace(
            init_forward_metadata=lambda fb: rec["attn_init"].append(("draft", fb.forward_mode.name)))

        def forward(self, fb, skip_attn_backend_init=False):
            n = len(fb.input_ids)
            rec["draft"].append({"mode": fb.forward_mode.name, "tokens": n,
                                 "skip_attn_backend_init": skip_attn_backend_init})
            # the draft's guess after token t: t + 2; its hidden state: the token id
            logits = torch.full((n, vocab), -10.0)
            logits[torch.arange(n), (fb.input_ids.long() + 2) % vocab] = 10.0
            hid = fb.input_ids.float()[:, None].repeat(1, hidden_d)
            return types.SimpleNamespace(logits_output=types.SimpleNamespace(next_token_logits=logits,
                                                                             hidden_states=hid))

    drafted = []

    class Drafted(Exception):
        pass

    def draft(mwb):  # what the drafting step starts from; the probe stops there
        drafted.append({"topk_index": mwb.spec_info.topk_index.tolist(),
                        "hidden_first_col": mwb.spec_info.hidden_states[:, 0].tolist()})
        raise Drafted

    dw = types.SimpleNamespace(draft_runner=DraftRunner(), hot_token_id=None, draft=draft,
                               draft_tp_context=lambda group: contextlib.nullcontext())
    req_to_token = torch.arange(rows * 64, dtype=torch.int64).reshape(rows, 64) + 1000
    worker = object.__new__(m.EAGLEWorkerV2)
    worker.__dict__.update(
        server_args=types.SimpleNamespace(chunked_prefill_size=9, enable_dp_attention=False),
        topk=1, speculative_num_steps=3, speculative_num_draft_tokens=nd, device="cpu", page_size=1,
        _target_worker=Target(), _draft_worker=dw, plan_stream=None, plan_stream_ctx=contextlib.nullcontext(),
        req_to_token_pool=types.SimpleNamespace(req_to_token=req_to_token),
        speculative_algorithm=types.SimpleNamespace(is_standalone=lambda: False),
        _dsd_threshold=2, _dsd_graph_runner=Graphs("decode-graphs"),
        _dsd_pend_n=torch.zeros((rows,), dtype=torch.int32), _dsd_pend_n_cpu=[0] * rows)

    class Req:
        def __init__(self, i):
            self.req_pool_idx, self.grammar = i, None

    class Sampling:
        is_all_greedy = True
        acc_additive_penalties = acc_scaling_penalties = logit_bias = None

    pool = [2, 0, 3]  # request-pool rows of the 3 running requests
    seq = [10, 20, 30]
    bonus = [7, 8, 9]
    results = []

    def decode_batch():
        spec = m.EagleDraftInput(**{bonus_field: torch.tensor(bonus, dtype=torch.int32)},
                                 topk_p=torch.ones(bs, 1), topk_index=torch.full((bs, 1), 5),
                                 hidden_states=torch.full((bs, hidden_d), -1.0))
        return types.SimpleNamespace(
            forward_mode=ForwardMode.DECODE, is_extend_in_batch=False, spec_info=spec,
            seq_lens=torch.tensor(seq), seq_lens_cpu=torch.tensor(seq), seq_lens_sum=sum(seq),
            orig_seq_lens=None, req_pool_indices=torch.tensor(pool), reqs=[Req(i) for i in pool],
            input_ids=None, out_cache_loc=None, capture_hidden_mode=CaptureHiddenMode.NULL,
            sampling_info=Sampling(), has_grammar=False, return_logprob=False, extend_seq_lens=None,
            extend_prefix_lens=None, extend_num_tokens=None)

    class Event:
        """A device event: what had run (target forwards, draft forwards) when it was recorded."""

        def record(self, stream=None):
            self.at = [len(rec["target"]), len(rec["draft"])]

        def synchronize(self):
            pass

    torch.cpu.Event = Event  # torch.get_device_module("cpu").Event

    m._DSD_CATCH_UP_TOKENS = 8  # a catch-up of the 4-row pool: max(8, chunk 9) // 4 rows = a window of 2
    for t in range(3):  # three skipped steps (3 running > threshold 2): a catch-up after the 2nd
        step["t"] = t
        mwb = decode_batch()
        res = worker.forward_batch_generation(mwb)
        nxt = res.next_draft_input
        results.append({
            "next_token_ids": res.next_token_ids.tolist(), "accept_lens": res.accept_lens.tolist(),
            "result_stride": getattr(res, "speculative_num_draft_tokens", None),
            "bonus": getattr(nxt, bonus_field).tolist(), "new_seq_lens": nxt.new_seq_lens.tolist(),
            "verify_done_at": nxt.verify_done.at,
            "future_topk_index": nxt.topk_index.tolist(), "future_hidden_first_col": nxt.hidden_states[:, 0].tolist(),
            "pend_n": worker._dsd_pend_n.tolist(), "pend_n_cpu": list(worker._dsd_pend_n_cpu),
            "since": worker._dsd_since_catch_up, "window": worker._dsd_window,
            "restored": [worker.speculative_num_steps, worker.speculative_num_draft_tokens,
                         repr(worker._target_worker.model_runner.graph_runner), worker._dsd_skipping]})
        bonus = [b + 1 for b in bonus]
        seq = [s + 1 for s in seq]
    pend_tok = worker._dsd_pend_tok.tolist()

    # one drafting step: 2 running requests (<= 2); the catch-up before drafting runs first
    pool, seq, bonus = pool[:2], seq[:2], bonus[:2]
    bs = 2
    mwb = decode_batch()
    try:
        worker.forward_batch_generation(mwb)
    except Drafted:
        pass
    return {"results": results, "init_new": rec["init_new"], "target": rec["target"], "draft": rec["draft"],
            "attn_init": rec["attn_init"], "drafted": drafted, "pend_tok_after_3": pend_tok,
            "pend_n_end": worker._dsd_pend_n.tolist(), "pend_n_cpu_end": worker._dsd_pend_n_cpu,
            "since_end": worker._dsd_since_catch_up}


class _AnyModule(types.ModuleType):
    """A stub of a grammar package whose names appear in pydantic models' annotations (protocol.py):
    each name is typing.Any there, which pydantic accepts (a MagicMock it cannot build a schema of)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        import typing

        return typing.Any


class _AnyStubs(_Stubs):
    def find_spec(self, name, path, target=None):
        spec = super().find_spec(name, path, target)
        return spec if spec is not None and name.split(".")[0] == "xgrammar" else None

    def create_module(self, spec):
        m = _AnyModule(spec.name)
        m.__path__, m.__spec__ = [], spec
        return m


def main() -> None:
    site, version = sys.argv[1], sys.argv[2]
    sys.meta_path.insert(0, _Stubs())
    sys.meta_path.insert(0, _AnyStubs())
    sys.path.insert(0, site)
    import warnings

    warnings.simplefilter("ignore")
    import torch

    # module-level device queries of the import chain (no GPU here; nothing runs on one)
    torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
        name="NVIDIA H200", major=9, minor=0, total_memory=1 << 37, multi_processor_count=132)
    with contextlib.suppress(ImportError):  # a newer transformers than the release's pin knows some of
        import transformers  # its config names already; registering them again is harmless here

        register = transformers.AutoConfig.register
        transformers.AutoConfig.register = lambda key, cfg, exist_ok=False: register(key, cfg, exist_ok=True)
        register_model = transformers.AutoModel.register
        transformers.AutoModel.register = lambda cfg, model, exist_ok=False: register_model(cfg, model, exist_ok=True)
    print(json.dumps({"version": version, **probe(version)}, default=str))


if __name__ == "__main__":
    main()
