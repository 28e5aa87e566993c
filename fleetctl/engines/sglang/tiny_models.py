"""Run ON the host, under the LAUNCH's interpreter, environment and cwd (`fleetctl gpu-check`): report
what that python's torch sees, and write a tiny Llama-shaped target and an EAGLE-3 draft for it.
(stdlib only, Python >= 3.8 grammar; no `from __future__`; shipped as a string, run as `-c`.)

One JSON request on stdin, one JSON answer on stdout:

    {"make": false}                          -> {"python", "torch", "torch_error", "cuda", "devices",
                                                 "device_name"}
    {"make": true, "dir": D, "seed": N}      -> the same, plus {"target": D/target, "draft": D/draft,
                                                 "bytes": N, "seconds": s}

The weights are made with the standard library alone (no torch, no safetensors package: the file
format is a JSON header and raw little-endian bf16), so what is written does not depend on the
host's packages. The models (made-up weights, nothing downloaded):

  target   LlamaForCausalLM, 8 layers, hidden 256, 4 heads x 64, 2 KV heads, vocab 2048, bf16.
           Every o_proj and down_proj is zero, so the residual stream is the current token's
           embedding e_t in every layer; the final norm keeps it, and lm_head's row perm(t) is e_t:
           the greedy next token is perm(current token) with a margin of ~100 logits (a bigram
           model: the text depends on the prompt, and bf16 noise cannot flip a token).
  draft    an EAGLE-3 draft (LlamaForCausalLMEagle3, one layer): fc averages the target's three
           captured states (= e_t), attention and MLP add nothing, lm_head row perm(perm(t)) = e_t.
           Its first proposal is always right and the later ones are not: accept length ~2 while
           speculating, so speculation on/off shows in the server's log and in tokens/s.
  tokenizer byte-level BPE with no merges (4 special tokens, then the 256 bytes): any prompt
           encodes, any output decodes.
The other weights (q/k/v, gate/up) are small pseudo-random values: they cost what real weights cost
to compute and change no output.
"""

import json
import os
import random
import struct
import sys
import time
from array import array

VOCAB = 2048
HIDDEN = 256
INTER = 512
LAYERS = 8
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 64
AUX_LAYER_IDS = [1, 3, 5]  # target layers whose outputs feed EAGLE-3
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]
N_TOK = len(SPECIALS) + 256  # tokenizer ids 0..259; ids >= N_TOK never win (zero lm_head rows)
BIG_DIMS = 128  # the token embeddings live in dims 0..127 (norm sqrt(128)) ...
BIG_C = 4.0  # ... plus dim 255 = BIG_C for every token: the same RMS for every embedding
ONE = b"\x80\x3f"  # 1.0 in bf16, little-endian
# a pseudo-random byte b -> the high byte of a bf16 value in +-[2^-7, 2^-5): sign from b's top bit
_SMALL_HI = bytes(0x3C | (b & 0x80) for b in range(256))


def byte_chars():
    """The byte-level pre-tokenizer's alphabet: byte -> printable character (the GPT-2 mapping)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tokenizer_json():
    chars = byte_chars()
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[chars[b]] = len(SPECIALS) + b
    added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(SPECIALS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": []},
    }


TOKENIZER_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
    "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 4096, "add_bos_token": False,
    "clean_up_tokenization_spaces": False,
}


def config(**kw):
    cfg = {
        "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "vocab_size": VOCAB, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": "bfloat16", "use_cache": True,
    }
    cfg.update(kw)
    return cfg


def draft_config():
    return config(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=VOCAB,
                  target_hidden_size=HIDDEN,
                  eagle_config={"eagle_aux_hidden_state_layer_ids": AUX_LAYER_IDS, "use_aux_hidden_state": True})


def target_config():
    return config(architectures=["LlamaForCausalLM"], num_hidden_layers=LAYERS)


# ---------------------------------------------------------------------------- bf16 tensors as bytes


class Tensor(object):
    __slots__ = ("data", "shape")

    def __init__(self, shape, data):
        n = 1
        for s in shape:
            n *= s
        assert len(data) == 2 * n, (shape, len(data))
        self.shape = list(shape)
        self.data = data


def zeros(*shape):
    n = 1
    for s in shape:
        n *= s
    return Tensor(shape, bytes(2 * n))


def ones(n):
    return Tensor([n], ONE * n)


def small(rng, *shape):
    n = 1
    for s in shape:
        n *= s
    lo = rng.getrandbits(8 * n).to_bytes(n, "little")
    hi = rng.getrandbits(8 * n).to_bytes(n, "little").translate(_SMALL_HI)
    out = bytearray(2 * n)
    out[0::2] = lo
    out[1::2] = hi
    return Tensor(shape, bytes(out))


def bf16(values):
    """float32 values -> bf16 bytes (truncated), little-endian."""
    a = array("f", values)
    if sys.byteorder != "little":
        a.byteswap()
    raw = a.tobytes()
    out = bytearray(len(raw) // 2)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def rows(nrows, ncols, filled):
    """A (nrows, ncols) tensor, zero but for `filled`: {row: [ncols floats]}."""
    zero_row = bytes(2 * ncols)
    parts = [bf16(filled[r]) if r in filled else zero_row for r in range(nrows)]
    return Tensor([nrows, ncols], b"".join(parts))


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": "BF16", "shape": t.shape, "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    header["__metadata__"] = {"format": "pt"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for name in sorted(tensors):
            f.write(tensors[name].data)
    return 8 + len(text) + offset


# ---------------------------------------------------------------------------- the models


def permutation(seed):
    """The bigram map: a fixed permutation of the byte tokens (the special ids are never produced)."""
    ids = list(range(len(SPECIALS), N_TOK))
    shuffled = list(ids)
    random.Random(seed).shuffle(shuffled)
    perm = dict(zip(ids, shuffled))
    return perm


def embeddings(seed):
    """token -> its embedding (HIDDEN floats): a random direction in dims 0..127 of norm sqrt(128),
    dim 255 = BIG_C."""
    rng = random.Random(seed)
    out = {}
    for t in range(len(SPECIALS), N_TOK):
        v = [rng.gauss(0.0, 1.0) for _ in range(BIG_DIMS)]
        norm = sum(x * x for x in v) ** 0.5
        e = [x / norm * BIG_DIMS ** 0.5 for x in v] + [0.0] * (HIDDEN - BIG_DIMS)
        e[HIDDEN - 1] = BIG_C
        out[t] = e
    return out


def target_tensors(rng, perm, emb):
    t = {"model.embed_tokens.weight": rows(VOCAB, HIDDEN, emb)}
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        t[p + "self_attn.q_proj.weight"] = small(rng, HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.k_proj.weight"] = small(rng, KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.v_proj.weight"] = small(rng, KV_HEADS * HEAD_DIM, HIDDEN)
        t[p + "self_attn.o_proj.weight"] = zeros(HIDDEN, HEADS * HEAD_DIM)
        t[p + "mlp.gate_proj.weight"] = small(rng, INTER, HIDDEN)
        t[p + "mlp.up_proj.weight"] = small(rng, INTER, HIDDEN)
        t[p + "mlp.down_proj.weight"] = zeros(HIDDEN, INTER)
        t[p + "input_layernorm.weight"] = ones(HIDDEN)
        t[p + "post_attention_layernorm.weight"] = ones(HIDDEN)
    t["model.norm.weight"] = ones(HIDDEN)
    t["lm_head.weight"] = rows(VOCAB, HIDDEN, {perm[s]: emb[s] for s in perm})
    return t


def draft_tensors(rng, perm, emb):
    p = "midlayer."
    third = 1.0 / 3
    fc = {r: [0.0] * (3 * HIDDEN) for r in range(HIDDEN)}
    for r in range(HIDDEN):
        for k in range(3):
            fc[r][k * HIDDEN + r] = third
    t = {
        p + "self_attn.q_proj.weight": small(rng, HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.k_proj.weight": small(rng, KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.v_proj.weight": small(rng, KV_HEADS * HEAD_DIM, 2 * HIDDEN),
        p + "self_attn.o_proj.weight": zeros(HIDDEN, HEADS * HEAD_DIM),
        p + "mlp.gate_proj.weight": small(rng, INTER, HIDDEN),
        p + "mlp.up_proj.weight": small(rng, INTER, HIDDEN),
        p + "mlp.down_proj.weight": zeros(HIDDEN, INTER),
        p + "input_layernorm.weight": ones(HIDDEN),
        p + "hidden_norm.weight": ones(HIDDEN),
        p + "post_attention_layernorm.weight": ones(HIDDEN),
        "fc.weight": rows(HIDDEN, 3 * HIDDEN, fc),
        "norm.weight": ones(HIDDEN),
        "lm_head.weight": rows(VOCAB, HIDDEN, {perm[perm[s]]: emb[s] for s in perm}),
    }
    return t


def write_model(d, cfg, tensors):
    os.makedirs(d)
    n = write_safetensors(os.path.join(d, "model.safetensors"), tensors)
    files = {
        "config.json": cfg, "tokenizer.json": tokenizer_json(), "tokenizer_config.json": TOKENIZER_CONFIG,
        "special_tokens_map.json": {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
                                    "pad_token": "<pad>"},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
    }
    for name, doc in files.items():
        with open(os.path.join(d, name), "w") as f:
            json.dump(doc, f, indent=1)
    return n


def make(d, seed):
    rng = random.Random(seed)
    perm, emb = permutation(seed + 1), embeddings(seed + 2)
    n = write_model(os.path.join(d, "target"), target_config(), target_tensors(rng, perm, emb))
    n += write_model(os.path.join(d, "draft"), draft_config(), draft_tensors(rng, perm, emb))
    return n


def torch_facts():
    out = {"python": sys.executable, "torch": None, "torch_error": None, "cuda": None, "devices": None,
           "device_name": None}
    try:
        import torch
    except Exception as e:
        out["torch_error"] = ("%s: %s" % (type(e).__name__, e))[:300]
        return out
    out["torch"] = str(getattr(torch, "__version__", "?"))[:80]
    try:
        out["cuda"] = bool(torch.cuda.is_available())
        out["devices"] = int(torch.cuda.device_count()) if out["cuda"] else 0
        if out["cuda"]:
            out["device_name"] = str(torch.cuda.get_device_name(0))[:120]
    except Exception as e:
        out["cuda"] = False
        out["torch_error"] = ("torch.cuda: %s: %s" % (type(e).__name__, e))[:300]
    return out


def main():
    req = json.loads(sys.stdin.read() or "{}")
    out = torch_facts()
    if req.get("make"):
        t0 = time.time()
        out["bytes"] = make(req["dir"], int(req.get("seed", 1234)))
        out["target"] = os.path.join(req["dir"], "target")
        out["draft"] = os.path.join(req["dir"], "draft")
        out["seconds"] = round(time.time() - t0, 3)
    real = sys.stdout
    real.write(json.dumps(out))
    real.flush()


if __name__ == "__main__":
    main()
