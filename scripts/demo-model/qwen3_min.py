"""Minimal Qwen3ForCausalLM in plain PyTorch (no transformers needed), plus safetensors I/O.

It mirrors Hugging Face's Qwen3 eager implementation: RMSNorm (computed in float32), per-head
q_norm/k_norm before RoPE (rotate_half layout), grouped-query attention, SwiGLU MLP, tied
embeddings. Tensor names match HF so save_safetensors() writes a checkpoint that
transformers / cairn load as-is. check_oracle.py verifies it against the HF oracle fixtures.

Optionally an MTP head (mtp.*, cfg["num_nextn_predict_layers"] = 1), laid out as Qwen3-Next's
(vLLM qwen3_next_mtp.py) with this family's plain norms: at position p it reads the final-normed
hidden state h[p] and the embedding of token p + 1 and predicts token p + 2:
    x = fc(cat(pre_fc_norm_embedding(embed(tok[p + 1])), pre_fc_norm_hidden(h[p])))
    x = layers.0(x) at position p (causal over the head's own positions); logits = lm_head(norm(x))
Its decoder layer is a Qwen3 layer whose MLP may be narrower (mtp_intermediate). HF transformers
ignores mtp.* (it warns about unused weights); cairn loads and drafts with it.
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dt)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hd = cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        H = cfg["hidden_size"]
        self.q_proj = nn.Linear(H, self.nh * hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, H, bias=False)
        self.q_norm = RMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = RMSNorm(hd, cfg["rms_norm_eps"])

    def forward(self, x, cos, sin, mask):
        """mask None: causal attention through fused SDPA (training on the GPU)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.nh, self.hd)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if mask is None:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-1, -2)) * (self.hd ** -0.5)
            att = att + mask
            att = torch.softmax(att.float(), dim=-1).to(q.dtype)
            o = torch.matmul(att, v)
        o = o.transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg, inter=None):
        super().__init__()
        H, I = cfg["hidden_size"], inter or cfg["intermediate_size"]
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg, inter=None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg, inter)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([Layer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class MTP(nn.Module):
    """The MTP head's own tensors (embeddings and lm_head are the target's)."""

    def __init__(self, cfg, inter):
        super().__init__()
        H, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = RMSNorm(H, eps)
        self.pre_fc_norm_hidden = RMSNorm(H, eps)
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.layers = nn.ModuleList([Layer(cfg, inter)])
        self.norm = RMSNorm(H, eps)


def rope_theta(cfg):
    if "rope_parameters" in cfg and cfg["rope_parameters"]:
        return cfg["rope_parameters"]["rope_theta"]
    return cfg.get("rope_theta", 10000.0)


class Qwen3(nn.Module):
    def __init__(self, cfg, mtp_intermediate=None):
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg)
        if cfg.get("num_nextn_predict_layers", 0):
            self.mtp = MTP(cfg, mtp_intermediate)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg.get("tie_word_embeddings", True):
            self.lm_head.weight = self.model.embed_tokens.weight
        hd = cfg["head_dim"]
        inv = 1.0 / (rope_theta(cfg) ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
        self.register_buffer("inv_freq", inv, persistent=False)

    def init_weights(self, std=0.02):
        n = self.cfg["num_hidden_layers"]
        for name, p in self.named_parameters():
            if p.dim() == 2:
                s = std / math.sqrt(2 * n) if name.endswith(("o_proj.weight", "down_proj.weight")) else std
                nn.init.normal_(p, 0.0, s)

    def _rope_mask(self, T, x, fused):
        pos = torch.arange(T, dtype=torch.float32, device=x.device)
        freqs = torch.outer(pos, self.inv_freq.to(x.device))
        emb = torch.cat((freqs, freqs), dim=-1)
        mask = None if fused else torch.full((T, T), float("-inf"), device=x.device).triu(1).to(x.dtype)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype), mask

    def forward(self, ids, dtype=None, fused=False, hidden=False):
        """Logits [B, T, V]; with hidden=True also the final-normed hidden states [B, T, H]."""
        B, T = ids.shape
        x = self.model.embed_tokens(ids)
        if dtype is not None:
            x = x.to(dtype)
        cos, sin, mask = self._rope_mask(T, x, fused)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        x = self.model.norm(x)
        return (self.lm_head(x), x) if hidden else self.lm_head(x)

    def mtp_forward(self, next_ids, h, fused=False, shared_grad=True):
        """The MTP head at positions 0..T-1: next_ids [B, T] (the token after each position), h
        [B, T, H] (the target's final-normed hidden, or the head's own output when chaining).
        Returns (logits [B, T, V], the head's normed output [B, T, H]). shared_grad=False keeps
        gradients out of the shared embeddings and lm_head (training the head alone)."""
        W = self.model.embed_tokens.weight
        if not shared_grad:
            W = W.detach()
        e = F.embedding(next_ids, W).to(h.dtype)
        hd = self.mtp
        x = hd.fc(torch.cat((hd.pre_fc_norm_embedding(e), hd.pre_fc_norm_hidden(h)), dim=-1))
        cos, sin, mask = self._rope_mask(next_ids.shape[1], x, fused)
        x = hd.layers[0](x, cos, sin, mask)
        out = hd.norm(x)
        Wl = self.lm_head.weight if shared_grad else self.lm_head.weight.detach()
        return F.linear(out, Wl), out


# ---- safetensors (tiny reader/writer; the format is an 8-byte header length, JSON, raw data)

_DT = {"F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "I32": (torch.int32, 4), "U32": (torch.int32, 4),
       "F16": (torch.float16, 2), "I64": (torch.int64, 8)}
_NAME = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int32: "I32", torch.float16: "F16",
         torch.int64: "I64"}


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        dt, sz = _DT[v["dtype"]]
        a, b = v["data_offsets"]
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=dt) if b > a else torch.empty(0, dtype=dt)
        out[k] = t.reshape(v["shape"]).clone()
    return out, hdr.get("__metadata__", {})


def save_safetensors(path, tensors, metadata=None):
    """Packed MLX weights (names ending in .weight next to a .scales) are int32 here, U32 on disk."""
    hdr = {}
    blobs = []
    off = 0
    for k in sorted(tensors):
        t = tensors[k].contiguous()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        dt = _NAME[t.dtype]
        if dt == "I32" and k.endswith(".weight") and k[:-len("weight")] + "scales" in tensors:
            dt = "U32"
        hdr[k] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    if metadata:
        hdr["__metadata__"] = metadata
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- MLX affine quantization: per group of `group` inputs, w = q * scale + bias with q unsigned
# `bits` wide, packed little-end first into uint32 words; scales and biases stored in bf16.

def quantize_mlx(w, bits=8, group=64):
    """(packed int32 [O, I*bits/32], scales bf16 [O, I/group], biases bf16 [O, I/group])."""
    O, I = w.shape
    g = w.detach().float().reshape(O, I // group, group)
    lo, hi = g.min(-1).values, g.max(-1).values
    n = (1 << bits) - 1
    scale = ((hi - lo) / n).clamp(min=1e-8).to(torch.bfloat16)
    bias = lo.to(torch.bfloat16)
    q = ((g - bias.float()[..., None]) / scale.float()[..., None]).round().clamp(0, n).to(torch.int64)
    per = 32 // bits
    q = q.reshape(O, I // per, per)
    word = torch.zeros(O, I // per, dtype=torch.int64)
    for j in range(per):
        word |= q[..., j] << (bits * j)
    word = torch.where(word >= 1 << 31, word - (1 << 32), word)  # uint32 bits in an int32
    return word.to(torch.int32), scale, bias


def dequantize_mlx(word, scale, bias, bits, group):
    O = word.shape[0]
    per = 32 // bits
    w = word.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(w >> (bits * j)) & ((1 << bits) - 1) for j in range(per)], dim=-1).reshape(O, -1)
    q = q.float().reshape(O, scale.shape[1], group)
    return (q * scale.float()[..., None] + bias.float()[..., None]).reshape(O, -1)


def quantized_state(model, bits=8, group=64):
    """export_state() with every Linear/Embedding weight quantized as mlx_lm does (norms stay bf16)."""
    out = {}
    for k, v in export_state(model).items():
        if v.dim() == 2 and v.shape[1] % group == 0:
            base = k[:-len("weight")]
            out[k], out[base + "scales"], out[base + "biases"] = quantize_mlx(v, bits, group)
        else:
            out[k] = v
    return out


def dequantized(sd, bits, group):
    out = {}
    for k, v in sd.items():
        if k.endswith((".scales", ".biases")):
            continue
        base = k[:-len("weight")]
        if base + "scales" in sd:
            v = dequantize_mlx(v, sd[base + "scales"], sd[base + "biases"], bits, group)
        out[k] = v
    return out


def load_model(folder, dtype=torch.float32):
    cfg = json.load(open(f"{folder}/config.json"))
    sd, _ = load_safetensors(f"{folder}/model.safetensors")
    g = sd.get("mtp.layers.0.mlp.gate_proj.weight")
    m = Qwen3(cfg, g.shape[0] if g is not None else None)
    if "quantization" in cfg:
        sd = dequantized(sd, cfg["quantization"]["bits"], cfg["quantization"]["group_size"])
    sd = {k: v.to(dtype) for k, v in sd.items()}
    if "lm_head.weight" not in sd and cfg.get("tie_word_embeddings", True):
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    m.load_state_dict(sd, strict=True)
    return m.to(dtype), cfg


def export_state(model):
    """State dict with HF names, bf16, tied lm_head dropped (as save_pretrained does)."""
    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    if model.cfg.get("tie_word_embeddings", True):
        sd.pop("lm_head.weight", None)
    return sd
