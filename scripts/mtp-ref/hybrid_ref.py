"""Plain-PyTorch reference of the Qwen3 hybrid text models (qwen3_next, qwen3_5) and their MTP
head, in float64 on the CPU, for cairn's MTP fixtures (see make_fixtures.py and README.md).

The target model follows Hugging Face transformers' Qwen3Next / Qwen3_5 eager code: zero-centred
RMSNorm y = norm(x) * (1 + w); Gated DeltaNet layers (qwen3_next packs in_proj_qkvz / in_proj_ba
per key head, qwen3_5 has separate in_proj_qkv / z / b / a; depthwise causal conv1d + SiLU over
q|k|v; l2-normed q, k; the gated delta rule, run here in its recurrent form token by token; the
gated RMSNorm norm(o) * w * silu(z)); gated full attention (q_proj yields query and a per-head
sigmoid gate, q/k norm, partial rotary on the first head_dim * partial_rotary_factor dims, rotate_half
layout); FFN: MoE with a sigmoid-gated shared expert (qwen3_next: softmax router, top-k, renormed
when norm_topk_prob) or dense SwiGLU (qwen3_5).

The MTP head follows vLLM's vllm/model_executor/models/qwen3_next_mtp.py (Qwen3NextMultiTokenPredictor
.forward) and qwen3_5_mtp.py, which are the same computation:
    e = pre_fc_norm_embedding(embed(token))          (the token AFTER position p)
    h = pre_fc_norm_hidden(hidden)                   (the target's hidden at p, AFTER its final norm:
                                                      Qwen3NextModel.forward returns norm(x), and
                                                      vllm/v1/spec_decode/eagle.py feeds that)
    x = fc(cat([e, h], -1))                          (embedding first, then hidden)
    x = decoder layer mtp.layers.0 (full attention of the model's kind: gated, partial rope at
        position p, its own KV cache over positions 0..p; MoE for qwen3_next, dense for qwen3_5)
    g = norm(x)  (mtp.norm, zero-centred)            -> logits = lm_head(g) predict token p + 2
Chaining (eagle.py, method "mtp"): the next draft step runs at position p + 1 with the drafted token
and g (the head's own normed output) as its hidden; each step appends to the head's KV cache.
All norms of the head are the zero-centred (Gemma-style, 1 + w) ones.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "demo-model"))
from qwen3_min import load_safetensors, save_safetensors  # noqa: E402,F401


def load_checkpoint(folder):
    """Every tensor of a checkpoint folder: model.safetensors, or the shards that
    model.safetensors.index.json names."""
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        return load_safetensors(os.path.join(folder, "model.safetensors"))[0]
    with open(index) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    raw = {}
    for shard in shards:
        raw.update(load_safetensors(os.path.join(folder, shard))[0])
    return raw

DT = torch.float64


def zc_norm(x, w, eps):
    """Zero-centred RMSNorm (Qwen3NextRMSNorm / Qwen3_5RMSNorm): norm(x) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Hybrid:
    def __init__(self, folder):
        with open(os.path.join(folder, "config.json")) as f:
            self.cfg = json.load(f)
        raw = load_checkpoint(folder)
        self.w = {k: v.to(DT) for k, v in raw.items()}
        c = self.cfg
        self.eps = c["rms_norm_eps"]
        self.next = c["model_type"] == "qwen3_next"
        self.hd = c["head_dim"]
        rp = c.get("rope_parameters") or {}
        prf = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", 1.0))
        theta = rp.get("rope_theta", c.get("rope_theta", 10000.0))
        self.rot = int(self.hd * prf)
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.rot, 2, dtype=DT) / self.rot))
        self.n_mtp = c.get("mtp_num_hidden_layers", c.get("num_nextn_predict_layers", 0))

    def lin(self, name, x):
        return x @ self.w[name + ".weight"].T

    # ---- blocks (x: [T, hidden])

    def attn(self, p, x, pos, kv):
        """Gated full attention at positions pos [T]; kv: dict with the layer's past K, V (appended)."""
        c, hd = self.cfg, self.hd
        nh, nkv, T = c["num_attention_heads"], c["num_key_value_heads"], x.shape[0]
        qg = self.lin(p + ".q_proj", x).view(T, nh, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(T, nh * hd)
        k = self.lin(p + ".k_proj", x).view(T, nkv, hd)
        v = self.lin(p + ".v_proj", x).view(T, nkv, hd)
        q = zc_norm(q, self.w[p + ".q_norm.weight"], self.eps)
        k = zc_norm(k, self.w[p + ".k_norm.weight"], self.eps)
        fr = torch.outer(pos.to(DT), self.inv_freq)
        emb = torch.cat((fr, fr), -1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        r = self.rot

        def rope(t):
            tr, tp = t[..., :r], t[..., r:]
            return torch.cat((tr * cos + rotate_half(tr) * sin, tp), -1)

        q, k = rope(q), rope(k)
        kv["k"] = k if kv.get("k") is None else torch.cat((kv["k"], k), 0)
        kv["v"] = v if kv.get("v") is None else torch.cat((kv["v"], v), 0)
        K, V = kv["k"], kv["v"]
        S = K.shape[0]
        rep = nh // nkv
        K = K.repeat_interleave(rep, dim=1)
        V = V.repeat_interleave(rep, dim=1)
        att = torch.einsum("thd,shd->hts", q, K) / math.sqrt(hd)
        # causal: query t sits at absolute position S - T + t
        qpos = torch.arange(S - T, S)[:, None]
        kpos = torch.arange(S)[None, :]
        att = att.masked_fill((kpos > qpos)[None], float("-inf"))
        o = torch.einsum("hts,shd->thd", torch.softmax(att, -1), V).reshape(T, nh * hd)
        o = o * torch.sigmoid(gate)
        return self.lin(p + ".o_proj", o)

    def gdn(self, p, x, st):
        """Gated DeltaNet over T tokens; st: dict with conv window and recurrent memory (updated)."""
        c = self.cfg
        nk, nv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
        T, r = x.shape[0], nv // nk
        if self.next:
            qkvz = self.lin(p + ".in_proj_qkvz", x).view(T, nk, 2 * dk + 2 * r * dv)
            ba = self.lin(p + ".in_proj_ba", x).view(T, nk, 2 * r)
            q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
            v = qkvz[..., 2 * dk:2 * dk + r * dv].reshape(T, nv * dv)
            z = qkvz[..., 2 * dk + r * dv:].reshape(T, nv, dv)
            b, a = ba[..., :r].reshape(T, nv), ba[..., r:].reshape(T, nv)
            mixed = torch.cat((q.reshape(T, -1), k.reshape(T, -1), v), -1)
        else:
            mixed = self.lin(p + ".in_proj_qkv", x)
            z = self.lin(p + ".in_proj_z", x).view(T, nv, dv)
            b, a = self.lin(p + ".in_proj_b", x), self.lin(p + ".in_proj_a", x)
        C = mixed.shape[1]
        cw = self.w[p + ".conv1d.weight"].view(C, K)
        win = st.get("conv")
        if win is None:
            win = torch.zeros(K - 1, C, dtype=DT)
        full = torch.cat((win, mixed), 0)  # [K-1+T, C]
        conv = torch.stack([(full[t:t + K] * cw.T).sum(0) for t in range(T)], 0)
        st["conv"] = full[-(K - 1):]
        conv = F.silu(conv)
        kd = nk * dk
        q = conv[:, :kd].view(T, nk, dk)
        k = conv[:, kd:2 * kd].view(T, nk, dk)
        v = conv[:, 2 * kd:].view(T, nv, dv)
        beta = torch.sigmoid(b)
        g = -self.w[p + ".A_log"].exp() * F.softplus(a + self.w[p + ".dt_bias"])
        q = q.repeat_interleave(r, dim=1)
        k = k.repeat_interleave(r, dim=1)
        q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        q = q / math.sqrt(dk)
        S = st.get("mem")
        if S is None:
            S = torch.zeros(nv, dk, dv, dtype=DT)
        outs = []
        for t in range(T):
            S = S * g[t].exp()[:, None, None]
            mem = (S * k[t][:, :, None]).sum(1)
            delta = (v[t] - mem) * beta[t][:, None]
            S = S + k[t][:, :, None] * delta[:, None, :]
            outs.append((S * q[t][:, :, None]).sum(1))
        st["mem"] = S
        o = torch.stack(outs, 0)  # [T, nv, dv]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps) * self.w[p + ".norm.weight"]
        o = o * F.silu(z)
        return self.lin(p + ".out_proj", o.reshape(T, nv * dv))

    def mlp(self, p, x):
        return self.lin(p + ".down_proj", F.silu(self.lin(p + ".gate_proj", x)) * self.lin(p + ".up_proj", x))

    def ffn(self, p, x):
        if not self.next:
            return self.mlp(p + ".mlp", x)
        c = self.cfg
        probs = torch.softmax(self.lin(p + ".mlp.gate", x), -1)
        top, idx = torch.topk(probs, c["num_experts_per_tok"], -1)
        if c.get("norm_topk_prob", True):
            top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(idx.shape[1]):
                out[t] += top[t, j] * self.mlp(f"{p}.mlp.experts.{int(idx[t, j])}", x[t:t + 1])[0]
        sh = self.mlp(p + ".mlp.shared_expert", x)
        return out + torch.sigmoid(self.lin(p + ".mlp.shared_expert_gate", x)) * sh

    def layer(self, p, kind, x, pos, cache):
        h = zc_norm(x, self.w[p + ".input_layernorm.weight"], self.eps)
        if kind == "full_attention":
            x = x + self.attn(p + ".self_attn", h, pos, cache)
        else:
            x = x + self.gdn(p + ".linear_attn", h, cache)
        h = zc_norm(x, self.w[p + ".post_attention_layernorm.weight"], self.eps)
        return x + self.ffn(p, h)

    # ---- the target model, incremental: caches is a list of per-layer dicts

    def new_caches(self):
        return [dict() for _ in range(self.cfg["num_hidden_layers"])]

    def forward(self, ids, pos0, caches):
        """ids [T] at positions pos0..: returns (logits [T, V], hidden [T, H] after the final norm)."""
        x = self.w["model.embed_tokens.weight"][ids]
        pos = torch.arange(pos0, pos0 + len(ids))
        for i, kind in enumerate(self.cfg["layer_types"]):
            x = self.layer(f"model.layers.{i}", kind, x, pos, caches[i])
        hid = zc_norm(x, self.w["model.norm.weight"], self.eps)
        return self.lin("lm_head", hid), hid

    # ---- the MTP head

    def mtp(self, ids, hidden, pos0, cache):
        """ids [T]: token after each position; hidden [T, H] at positions pos0..; cache: the head's
        KV (dict, appended). Returns (logits [T, V], g [T, H] the head's normed output)."""
        e = zc_norm(self.w["model.embed_tokens.weight"][ids], self.w["mtp.pre_fc_norm_embedding.weight"], self.eps)
        h = zc_norm(hidden, self.w["mtp.pre_fc_norm_hidden.weight"], self.eps)
        x = self.lin("mtp.fc", torch.cat((e, h), -1))
        pos = torch.arange(pos0, pos0 + len(ids))
        x = self.layer("mtp.layers.0", "full_attention", x, pos, cache)
        g = zc_norm(x, self.w["mtp.norm.weight"], self.eps)
        return self.lin("lm_head", g), g
