"""Makes cairn's MTP fixtures: copies of the tiny hybrid oracle checkpoints with random mtp.*
tensors, and the reference MTP logits of hybrid_ref.py for a few prompts.

    python3 scripts/mtp-ref/make_fixtures.py      (from the repository root; CPU, ~1 min)

For each of qwen3_5-tiny and qwen3next-tiny (tests/data/oracle/models/<name>) it writes
tests/data/mtp/<name>/: config.json (+ "mtp_num_hidden_layers": 1), a sharded checkpoint
(model.safetensors.index.json; shard 1 a symlink to the oracle's model.safetensors, shard 2 the
mtp.* tensors in bf16) and expected_mtp.safetensors:
    case<i>.tokens        I32 [T]     the prompt (random ids, seeded)
    case<i>.next          I32 [1]     the target's greedy token after the prompt
    case<i>.mtp_logits    F32 [T, V]  k = 1: the head at every prompt position p, fed token p + 1
                                      (the next one for the last) and the target's hidden at p
    case<i>.chain_tokens  I32 [3]     chained drafts d1, d2, d3 (argmax of chain_logits)
    case<i>.chain_logits  F32 [3, V]  row 0 = the last mtp_logits row; row j: the head at
                                      position T - 1 + j fed d_j and its own output of step j - 1
    case<i>.chain_margins F32 [3]     top-1 minus top-2 of each chain row
All in float64 math (stored f32), from the bf16 weights as stored.

Random tensors: linears N(0, 0.02) (HF's initializer_range), norm weights N(0, 0.1) around the
zero-centred 0 (so the 1 + w of each norm matters). Seeded: the output is the same on every run.
A random head almost never drafts what the random target then emits (accept_rate() prints it:
0 and 1 of 48), so cairn's engine tests script acceptance on top of the real MTP drafts."""
import json
import os

import torch

from hybrid_ref import Hybrid, load_safetensors, save_safetensors

PROMPT_LENS = [5, 37, 70]
CHAIN = 3


def mtp_tensors(cfg, gen):
    H, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def lin(o, i):
        return torch.randn(o, i, generator=gen) * 0.02

    def vec(n):
        return torch.randn(n, generator=gen) * 0.1

    p = "mtp.layers.0"
    t = {
        "mtp.pre_fc_norm_embedding.weight": vec(H),
        "mtp.pre_fc_norm_hidden.weight": vec(H),
        "mtp.norm.weight": vec(H),
        f"{p}.input_layernorm.weight": vec(H),
        f"{p}.post_attention_layernorm.weight": vec(H),
        f"{p}.self_attn.q_proj.weight": lin(2 * nh * hd, H),
        f"{p}.self_attn.k_proj.weight": lin(nkv * hd, H),
        f"{p}.self_attn.v_proj.weight": lin(nkv * hd, H),
        f"{p}.self_attn.o_proj.weight": lin(H, nh * hd),
        f"{p}.self_attn.q_norm.weight": vec(hd),
        f"{p}.self_attn.k_norm.weight": vec(hd),
    }
    t["mtp.fc.weight"] = lin(H, 2 * H)
    if cfg["model_type"] == "qwen3_next":
        E, I, S = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        t[f"{p}.mlp.gate.weight"] = lin(E, H)
        for e in range(E):
            t[f"{p}.mlp.experts.{e}.gate_proj.weight"] = lin(I, H)
            t[f"{p}.mlp.experts.{e}.up_proj.weight"] = lin(I, H)
            t[f"{p}.mlp.experts.{e}.down_proj.weight"] = lin(H, I)
        t[f"{p}.mlp.shared_expert.gate_proj.weight"] = lin(S, H)
        t[f"{p}.mlp.shared_expert.up_proj.weight"] = lin(S, H)
        t[f"{p}.mlp.shared_expert.down_proj.weight"] = lin(H, S)
        t[f"{p}.mlp.shared_expert_gate.weight"] = lin(1, H)
    else:
        I = cfg["intermediate_size"]
        t[f"{p}.mlp.gate_proj.weight"] = lin(I, H)
        t[f"{p}.mlp.up_proj.weight"] = lin(I, H)
        t[f"{p}.mlp.down_proj.weight"] = lin(H, I)
    return {k: v.to(torch.bfloat16) for k, v in t.items()}


def margin(row):
    top = torch.topk(row, 2).values
    return (top[0] - top[1]).item()


def make(name, seed):
    src = f"tests/data/oracle/models/{name}"
    dst = f"tests/data/mtp/{name}"
    os.makedirs(dst, exist_ok=True)
    with open(f"{src}/config.json") as f:
        cfg = json.load(f)
    cfg["mtp_num_hidden_layers"] = 1
    with open(f"{dst}/config.json", "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    gen = torch.Generator().manual_seed(seed)
    # Two shards: the oracle's own file (a symlink: the target's tensors stay bit for bit and
    # the repository holds them once) and the head's tensors.
    target, _ = load_safetensors(f"{src}/model.safetensors")
    head = mtp_tensors(cfg, gen)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    for stale in ("model.safetensors", shard1):
        if os.path.lexists(f"{dst}/{stale}"):
            os.remove(f"{dst}/{stale}")
    os.symlink(os.path.relpath(f"{src}/model.safetensors", dst), f"{dst}/{shard1}")
    save_safetensors(f"{dst}/{shard2}", head, None)
    weight_map = {k: shard1 for k in target} | {k: shard2 for k in head}
    with open(f"{dst}/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=1)
        f.write("\n")

    m = Hybrid(dst)
    V = cfg["vocab_size"]
    out, cases = {}, []
    for i, T in enumerate(PROMPT_LENS):
        toks = torch.randint(0, V, (T,), generator=gen)
        with torch.no_grad():
            lg, hid = m.forward(toks, 0, m.new_caches())
            nxt = int(lg[-1].argmax())
            ids = torch.cat((toks[1:], torch.tensor([nxt])))
            cache = {}
            mlg, g = m.mtp(ids, hid, 0, cache)
            rows, drafts = [mlg[-1]], [int(mlg[-1].argmax())]
            g_last = g[-1:]
            for j in range(1, CHAIN):
                clg, g_last = m.mtp(torch.tensor([drafts[-1]]), g_last, T - 1 + j, cache)
                rows.append(clg[0])
                drafts.append(int(clg[0].argmax()))
        out[f"case{i}.tokens"] = toks.to(torch.int32)
        out[f"case{i}.next"] = torch.tensor([nxt], dtype=torch.int32)
        out[f"case{i}.mtp_logits"] = mlg.to(torch.float32)
        out[f"case{i}.chain_tokens"] = torch.tensor(drafts, dtype=torch.int32)
        out[f"case{i}.chain_logits"] = torch.stack(rows).to(torch.float32)
        out[f"case{i}.chain_margins"] = torch.tensor([margin(r) for r in rows], dtype=torch.float32)
        cases.append({"case": i, "prompt_len": T, "chain": CHAIN})
        print(f"{name} case{i}: T={T} next={nxt} drafts={drafts} margins="
              f"{[round(margin(r), 4) for r in rows]}")
    save_safetensors(f"{dst}/expected_mtp.safetensors", out,
                     {"cases": json.dumps(cases),
                      "note": "hybrid_ref.py in float64 (stored f32); see scripts/mtp-ref/make_fixtures.py"})


def accept_rate(name, n_gen=48):
    """Greedy generation with the target; how often the head's k = 1 draft equals the next token."""
    m = Hybrid(f"tests/data/mtp/{name}")
    gen = torch.Generator().manual_seed(7)
    toks = torch.randint(0, m.cfg["vocab_size"], (12,), generator=gen)
    with torch.no_grad():
        caches, cache = m.new_caches(), {}
        lg, hid = m.forward(toks, 0, caches)
        seq = toks.tolist() + [int(lg[-1].argmax())]
        ok = 0
        mlg, _ = m.mtp(torch.tensor(seq[1:]), hid, 0, cache)
        for _ in range(n_gen):
            draft = int(mlg[-1].argmax())
            p = len(seq) - 1
            lg, hid = m.forward(torch.tensor([seq[-1]]), p, caches)
            seq.append(int(lg[-1].argmax()))
            ok += draft == seq[-1]
            mlg, _ = m.mtp(torch.tensor([seq[-1]]), hid, p, cache)
    print(f"{name}: k = 1 drafts accepted {ok}/{n_gen}; output {seq[12:]}")


if __name__ == "__main__":
    for name, seed in (("qwen3_5-tiny", 1234), ("qwen3next-tiny", 5678)):
        make(name, seed)
        accept_rate(name)
