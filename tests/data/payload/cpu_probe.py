"""Opt-in CPU probe of a patched SGLang tree (run by tests/test_payload.py when
FLEETCTL_SGLANG_PYTHON names an interpreter with SGLang's import-time dependencies: torch,
transformers, xgrammar, ...). Not run in CI.

usage: python cpu_probe.py SITE_DIR VERSION
SITE_DIR holds the patched `sglang/` package. Prints one JSON object.

What it runs, all on CPU, with the real (patched) SGLang modules:
- the real `ServerArgs.add_cli_args` parser: accepts/rejects --speculative-disable-batch-threshold;
- the real dataclass repr (the `server_args=ServerArgs(...)` startup dump) and
  `check_speculative_disable_batch_threshold` on ServerArgs built with a dummy model path;
- v1 (EAGLEWorker): one skipped decode step through the real `_dsd_skip_draft`, `verify`,
  `_dsd_forward_target_decode` and `EagleVerifyInput.verify`, with the target model faked and the
  three GPU kernels it reaches replaced by small torch stand-ins (one-node greedy verify, the
  req_to_token slot writer, the slot allocator). The draft model is not run.
Native modules that are not installed (sgl_kernel, flashinfer, ...) are stubbed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import sys
import types
from unittest import mock

STUB = ("sgl_kernel", "flashinfer", "xgrammar", "llguidance", "outlines", "decord", "vllm", "deep_gemm",
        "torch_memory_saver", "quack", "cutlass", "tvm_ffi", "apache_tvm_ffi", "triton_kernels", "mooncake",
        "sgl_kernel_npu", "torch_npu", "aiter", "nvtx", "pynvml", "compressed_tensors", "partial_json_parser",
        "openai_harmony", "smg_grpc_proto", "grpc", "gguf", "modelscope", "soundfile", "torchao",
        "hf_transfer", "blobfile", "anthropic", "msgspec", "pybase64", "setproctitle", "uvloop", "zmq",
        "interegular", "tiktoken", "sentencepiece", "einops", "orjson", "IPython", "psutil",
        "prometheus_client", "openai", "fastapi", "uvicorn", "starlette", "multipart", "aiohttp", "requests",
        "jit_kernel", "tokenspeed", "nixl", "mlx", "deepep", "deep_ep", "mori", "kt_kernel", "st_attn", "vsa",
        "cache_dit", "diffusers", "numba", "ray", "xxhash")


class _Stubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A MagicMock module for each listed top-level package that is not installed."""

    def find_spec(self, name, path, target=None):
        top = name.split(".")[0]
        if top not in STUB:
            return None
        if top != "sgl_kernel" and importlib.machinery.PathFinder.find_spec(top) is not None:
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name)
        m.__path__, m.__spec__, m.__name__, m.__version__ = [], spec, spec.name, "0.0.0"
        return m

    def exec_module(self, module):
        pass


FLAG = "--speculative-disable-batch-threshold"


def probe_parser(out: dict) -> None:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="launch_server")
    ServerArgs.add_cli_args(parser)
    out["parsed_8"] = parser.parse_args(["--model-path", "m", FLAG, "8"]).speculative_disable_batch_threshold
    out["parsed_default"] = parser.parse_args(["--model-path", "m"]).speculative_disable_batch_threshold
    out["rejected"] = {}
    for bad in ("0", "-1"):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.suppress(SystemExit):
            parser.parse_args(["--model-path", "m", f"{FLAG}={bad}"])
        out["rejected"][bad] = err.getvalue().strip().splitlines()[-1]

    def args(**over):
        base = dict(model_path="dummy", speculative_disable_batch_threshold=16, speculative_algorithm="EAGLE3",
                    speculative_eagle_topk=1, disable_overlap_schedule=out["version"] != "0.5.14")
        base.update(over)
        return ServerArgs(**base)

    out["repr_has_field"] = "speculative_disable_batch_threshold=16" in repr(args())
    out["checks"] = {}
    cases = {"ok": {}, "zero": {"speculative_disable_batch_threshold": 0},
             "standalone": {"speculative_algorithm": "STANDALONE"}, "dp": {"enable_dp_attention": True},
             "overlap": {"disable_overlap_schedule": False}}
    for label, over in cases.items():
        try:
            args(**over).check_speculative_disable_batch_threshold()
            out["checks"][label] = "ok"
        except ValueError as e:
            out["checks"][label] = f"ValueError: {e}"


def probe_v1_skip_step(out: dict) -> None:
    import sglang.srt.speculative.eagle_info as ei
    import sglang.srt.speculative.eagle_worker as ew
    import torch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.server_args import ServerArgs

    with contextlib.suppress(Exception):
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(ServerArgs(model_path="dummy"))

    # GPU kernels reached by a one-node verify, as torch stand-ins
    def verify_one_node(predicts, accept_index, accept_token_num, candidates, retrive_index,
                        retrive_next_token, retrive_next_sibling, target_predict, topk=-1):
        assert bool((retrive_next_token == -1).all()) and candidates.shape[1] == 1, "one-node trees only"
        root = retrive_index[:, 0]
        accept_index[:, 0] = root.to(accept_index.dtype)
        predicts[root] = target_predict[:, 0].to(predicts.dtype)
        accept_token_num.zero_()
        return predicts, accept_index, accept_token_num

    def assign_slots(req_pool_indices, req_to_token, start, end, out_cache_loc, bs):
        off = 0
        for i in range(bs):
            n = int(end[i] - start[i])
            req_to_token[req_pool_indices[i], int(start[i]):int(end[i])] = out_cache_loc[off:off + n]
            off += n

    ei.verify_tree_greedy_func = verify_one_node
    ei.assign_req_to_token_pool_func = assign_slots
    ei.alloc_token_slots = lambda tree_cache, n, backup_state=False: torch.arange(500, 500 + n)

    bs, hidden, vocab = 3, 8, 32
    next_tokens = torch.tensor([11, 12, 13])

    class Req:
        def __init__(self, i):
            self.output_ids, self.grammar, self.i = [1], None, i
            self.kv_committed_len = self.kv_allocated_len = 10 * (i + 1)
            self.spec_verify_ct = self.spec_accepted_tokens = 0
            self.decode_batch_idx = 0

        def check_finished(self, *a, **k):
            pass

        def finished(self):
            return False

        def update_spec_acceptance_histogram(self, n):
            pass

    class Sampling:
        is_all_greedy, has_custom_logit_processor, logit_bias, vocab_size = True, False, None, vocab
        penalizer_orchestrator = types.SimpleNamespace(is_required=False)

        def __len__(self):
            return bs

    seen: dict = {}

    class Batch:
        def __init__(self):
            self.reqs = [Req(i) for i in range(bs)]
            self.forward_mode = ForwardMode.DECODE
            self.seq_lens = torch.tensor([10, 20, 30])
            self.seq_lens_cpu = self.seq_lens.clone()
            self.seq_lens_sum = 0
            self.req_pool_indices = torch.tensor([0, 1, 2])
            self.req_to_token_pool = types.SimpleNamespace(req_to_token=torch.zeros((3, 64), dtype=torch.int64))
            self.tree_cache = None
            self.sampling_info = Sampling()
            self.has_grammar = self.return_logprob = self.return_hidden_states = False
            self.device = "cpu"
            self.input_ids = self.out_cache_loc = None
            self.spec_info = ei.EagleDraftInput(verified_id=torch.tensor([7, 8, 9], dtype=torch.int32),
                                                hidden_states=torch.zeros(bs, hidden))
            self.evicted = 0

        def batch_size(self):
            return len(self.reqs)

        def maybe_evict_swa(self):
            self.evicted += 1

        def get_model_worker_batch(self, seq_lens_cpu_cache=None):
            return types.SimpleNamespace(
                forward_mode=self.forward_mode, spec_info=self.spec_info, seq_lens=self.seq_lens.clone(),
                seq_lens_cpu=self.seq_lens_cpu.clone(), seq_lens_sum=self.seq_lens_sum,
                input_ids=self.input_ids, out_cache_loc=self.out_cache_loc,
                capture_hidden_mode=getattr(self.spec_info, "capture_hidden_mode", CaptureHiddenMode.NULL)
                if self.spec_info is not None else CaptureHiddenMode.NULL)

    class Target:
        model_runner = types.SimpleNamespace(hybrid_gdn_config=None, mamba2_config=None,
                                             hybrid_lightning_config=None)

        def forward_batch_generation(self, mwb, is_verify=False):
            seen.update(mode=mwb.forward_mode.name, spec_info_none=mwb.spec_info is None,
                        seq_lens=mwb.seq_lens.tolist(), seq_lens_sum=mwb.seq_lens_sum,
                        input_ids=mwb.input_ids.tolist(), out_cache_loc=mwb.out_cache_loc.tolist(),
                        capture=mwb.capture_hidden_mode.name, is_verify=is_verify)
            logits = torch.full((len(mwb.input_ids), vocab), -10.0)
            logits[torch.arange(len(mwb.input_ids)), next_tokens] = 10.0
            lo = types.SimpleNamespace(next_token_logits=logits, hidden_states=torch.randn(bs, hidden))
            return types.SimpleNamespace(logits_output=lo, can_run_cuda_graph=False)

    freed = []
    worker = object.__new__(ew.EAGLEWorker)
    worker.__dict__.update(
        _dsd_threshold=2, page_size=1, speculative_num_steps=3, enable_nan_detection=False,
        target_worker=Target(), server_args=types.SimpleNamespace(enable_dp_attention=False),
        token_to_kv_pool_allocator=types.SimpleNamespace(free=lambda x: freed.append(x.tolist())))

    batch = Batch()
    assert not ew._dsd_should_speculate(batch.batch_size(), worker._dsd_threshold)
    spec_info = worker._dsd_skip_draft(batch)
    out["verify_input"] = {k: getattr(spec_info, k) for k in ("spec_steps", "topk", "draft_token_num")}
    out["evicted_swa"] = batch.evicted
    saved = (batch.seq_lens, batch.seq_lens_cpu)
    logits_output, res, _, can_graph = worker.verify(batch, spec_info)
    out["target_forward"] = seen
    out["after"] = {
        "forward_mode": batch.forward_mode.name,
        "seq_lens": batch.seq_lens.tolist(),
        "seq_lens_restored_objects": batch.seq_lens is saved[0] and batch.seq_lens_cpu is saved[1],
        "output_ids": [r.output_ids for r in batch.reqs],
        "verified_id": res.verified_id.tolist(),
        "accept_length_per_req_cpu": res.accept_length_per_req_cpu,
        "draft_input_type": type(batch.spec_info).__name__,
        "draft_input_accept_length": batch.spec_info.accept_length.tolist(),
        "draft_input_hidden_rows": int(batch.spec_info.hidden_states.shape[0]),
        "req_to_token_new_slots": [int(batch.req_to_token_pool.req_to_token[i, s]) for i, s in
                                   enumerate((10, 20, 30))],
        "freed": freed,
        "logits_rows": int(logits_output.next_token_logits.shape[0]),
        "can_run_cuda_graph": can_graph,
    }


def probe_graph_guard(out: dict) -> None:
    """The target's CUDA-graph runner refuses a LAST-hidden-state batch when its graphs were captured
    for TARGET_VERIFY with FULL hidden states: the real CudaGraphRunner.can_run on a stand-in self."""
    from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = types.SimpleNamespace(
        require_mlp_tp_gather=False, require_mlp_sync=False, enable_pdmux=False, disable_padding=False,
        graphs={}, max_bs=256, is_encoder_decoder=False, enable_two_batch_overlap=False,
        capture_hidden_mode=CaptureHiddenMode.FULL, num_tokens_per_bs=4,
        model_runner=types.SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string("EAGLE3")))

    def can_run(mode):
        fb = types.SimpleNamespace(batch_size=24, capture_hidden_mode=mode, spec_info=None,
                                   can_run_dp_cuda_graph=True, can_run_tbo=True)
        return CudaGraphRunner.can_run(runner, fb)

    out["graph_can_run"] = {"LAST": can_run(CaptureHiddenMode.LAST), "FULL": can_run(CaptureHiddenMode.FULL)}


def probe_v2_states(out: dict) -> None:
    """0.5.14 EAGLEWorkerV2: the real _dsd_init_runtime_states keeps the current state and asks the
    real build_adaptive_runtime_state signature for steps=0 with graphs only above the threshold;
    the per-step choice then hands the right state to apply_runtime_state."""
    import sglang.srt.speculative.eagle_worker_v2 as m

    calls = []
    dw = types.SimpleNamespace(draft_attn_backend="d_attn", cuda_graph_runner="d_graph",
                               draft_extend_attn_backend="x_attn", cuda_graph_runner_for_draft_extend="x_graph",
                               draft_runner=types.SimpleNamespace(tp_group=None),
                               draft_tp_context=lambda group: contextlib.nullcontext())
    worker = object.__new__(m.EAGLEWorkerV2)
    worker.__dict__.update(
        _dsd_threshold=16, speculative_num_steps=3, speculative_num_draft_tokens=4, _draft_worker=dw,
        _target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
            attn_backend="t_attn", decode_cuda_graph_runner="t_graph")),
        server_args=types.SimpleNamespace(disable_cuda_graph=False, cuda_graph_bs_decode=[1, 2, 4, 8, 16, 24, 32]),
    )
    worker.build_adaptive_runtime_state = lambda steps, tokens, cuda_graph_bs=None: (
        calls.append((steps, tokens, cuda_graph_bs)) or "steps0-state")
    worker._dsd_init_runtime_states()
    regular = worker._dsd_states[True]
    out["v2_states"] = {
        "build_calls": calls,
        "regular": [regular.speculative_num_steps, regular.speculative_num_draft_tokens,
                    regular.target_attn_backend, regular.target_graph_runner, regular.cuda_graph_runner],
        "skip": worker._dsd_states[False],
        "pick": {bs: worker._dsd_states[m._dsd_should_speculate(bs, 16)] == "steps0-state"
                 for bs in (0, 1, 16, 17, 64)},
    }


def main() -> None:
    site, version = sys.argv[1], sys.argv[2]
    sys.meta_path.insert(0, _Stubs())
    sys.path.insert(0, site)
    import warnings

    warnings.simplefilter("ignore")
    out: dict = {"version": version}
    probe_parser(out)
    if version != "0.5.14":
        probe_graph_guard(out)
        probe_v1_skip_step(out)
    else:
        probe_v2_states(out)
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
