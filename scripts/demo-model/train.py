"""Builds cairn's demo chat model end to end: corpus -> tokenizer -> training -> eval -> export.

  python3 train.py prep   --work DIR            corpus, tokenizer.json, encoded data (DIR/data.pt)
  python3 train.py train  --work DIR --minutes M   train a Qwen3ForCausalLM for M minutes of wall time,
                                                    with its MTP head (qwen3_min.py) trained beside it
  python3 train.py export --work DIR --out models/demo --expected tests/data/demo/expected.safetensors
  python3 train.py eval   --model models/demo   greedy eval of an exported checkpoint on held-out prompts
  python3 train.py verify --model models/demo   the export against HF transformers and tokenizers

Needs torch, regex and jinja2; training uses CUDA when present (the CPU works, slowly). `verify`
needs transformers and tokenizers (present on the GPU machine); nothing else does: qwen3_min.py
and bpe.py implement the same model and tokenizer formats.
"""
import argparse
import json
import math
import multiprocessing
import os
import random
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gen_corpus as gc  # noqa: E402
from qwen3_min import Qwen3, export_state, load_model, quantized_state, save_safetensors  # noqa: E402

ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
MODEL = dict(hidden_size=384, num_hidden_layers=8, intermediate_size=1024, num_attention_heads=6,
             num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=True, max_position_embeddings=2048, num_nextn_predict_layers=1)
# The MTP head's MLP width: narrower than the target's 1024 so that the head adds ~1 MB in q8
# (fc 0.3 M + attention 0.4 M + MLP 0.3 M parameters).
MTP_INTER = 256
QUANT = dict(group_size=64, bits=8)
MAX_LEN = 512


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def encode_dialogue(enc, text):
    """Token ids and a 0/1 mask: 1 on assistant replies (content through <|im_end|>)."""
    ids, mask = [], []
    pos = 0
    head = "<|im_start|>assistant\n"
    while True:
        s = text.find(head, pos)
        if s < 0:
            break
        s += len(head)
        e = text.find("<|im_end|>", s)
        if e < 0:
            break
        e += len("<|im_end|>")
        a = enc.encode(text[pos:s])
        b = enc.encode(text[s:e])
        ids += a + b
        mask += [0] * len(a) + [1] * len(b)
        pos = e
    a = enc.encode(text[pos:])
    ids += a
    mask += [0] * len(a)
    return ids, mask


def _gen_chunk(job):
    """Dialogues seed..seed+count of one chunk: each chunk has its own seeded generator."""
    seed, chunk, count = job
    rng = random.Random(seed * 1_000_003 + chunk)
    return [gc.render(*gc.sample(rng, "train")[1:3]) for _ in range(count)]


_ENC = None


def _enc_init(tok):
    global _ENC
    _ENC = bpe.Encoder(tok)


def _enc_chunk(texts):
    """(token ids, loss mask, lengths) of the chunk's dialogues that fit in MAX_LEN, as arrays."""
    ids, mask, lens = [], [], []
    for t in texts:
        i, m = encode_dialogue(_ENC, t)
        if len(i) <= MAX_LEN:
            ids += i
            mask += m
            lens.append(len(i))
    return np.array(ids, dtype=np.int16), np.array(mask, dtype=np.bool_), np.array(lens, dtype=np.int32)


def cmd_prep(args):
    os.makedirs(args.work, exist_ok=True)
    chunk = 10000
    jobs = [(args.seed, c, min(chunk, args.dialogues - c * chunk)) for c in range((args.dialogues + chunk - 1) // chunk)]
    log("generating", args.dialogues, "dialogues on", args.workers, "processes")
    with multiprocessing.Pool(args.workers) as pool:
        parts = pool.map(_gen_chunk, jobs)
    if args.tokenizer:  # keep an existing vocabulary (to continue training a model made with it)
        tok = json.load(open(args.tokenizer))
        json.dump(tok, open(f"{args.work}/tokenizer.json", "w"), ensure_ascii=False, indent=2)
        log("tokenizer from", args.tokenizer)
    else:
        tok = train_tokenizer(args, parts)
    enc = bpe.Encoder(tok)
    for t in parts[0][:300]:
        ids, mask = encode_dialogue(enc, t)
        assert ids == enc.encode(t), "segment-wise encoding differs from whole encoding"
        assert enc.decode(ids) == t
    with multiprocessing.Pool(args.workers, initializer=_enc_init, initargs=(tok,)) as pool:
        enc_parts = pool.map(_enc_chunk, parts)
    # one flat token array, a loss mask beside it, and each dialogue's start/length
    flat = torch.from_numpy(np.concatenate([p[0] for p in enc_parts]))
    mask = torch.from_numpy(np.concatenate([p[1] for p in enc_parts]))
    lens = torch.from_numpy(np.concatenate([p[2] for p in enc_parts]))
    starts = torch.cumsum(lens, 0) - lens
    torch.save({"ids": flat, "mask": mask, "starts": starts, "lens": lens}, f"{args.work}/data.pt")
    log(f"{len(lens)} dialogues, {len(flat)} tokens ({len(flat) / len(lens):.1f}/dialogue), "
        f"{int(mask.sum())} loss tokens")


def train_tokenizer(args, parts):
    """Byte-level BPE on the words of the first 80k dialogues (deterministic for a seed)."""
    log("counting words")
    specials = bpe.regex.compile("|".join(bpe.regex.escape(a) for a, _ in ADDED))
    counts = {}
    for t in [t for p in parts[:8] for t in p][:80000]:
        for piece in specials.split(t):
            for w in bpe.pretokenize(piece):
                counts[w] = counts.get(w, 0) + 1
    log("unique words", len(counts), "- training BPE to", args.vocab)
    vocab, merges = bpe.train(counts, args.vocab, len(ADDED))
    tok = bpe.tokenizer_json(vocab, merges, ADDED)
    json.dump(tok, open(f"{args.work}/tokenizer.json", "w"), ensure_ascii=False, indent=2)
    log("vocab", len(vocab), "+", len(ADDED), "added; merges", len(merges))
    return tok


def batches(lens, tokens_per_batch, rng):
    """Dialogue indices grouped by length so that little of a batch is padding, in random order."""
    order = sorted(range(len(lens)), key=lambda i: (lens[i], rng.random()))
    out, cur, curmax = [], [], 0
    for i in order:
        n = lens[i]
        if cur and max(curmax, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, curmax = [], 0
        cur.append(i)
        curmax = max(curmax, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(data, idx, dev):
    """Padded inputs and targets (next token where the mask says it is a reply token, else -100)."""
    st = data["starts"][idx].to(dev, non_blocking=True).long()
    ln = data["lens"][idx].to(dev, non_blocking=True).long()
    T = int(ln.max())
    ar = torch.arange(T, device=dev)
    pos = (st[:, None] + ar[None, :]).clamp(max=len(data["ids"]) - 1)
    valid = ar[None, :] < ln[:, None]
    ids = torch.where(valid, data["ids"][pos].long(), 0)
    nxt = (pos + 1).clamp(max=len(data["ids"]) - 1)
    has_next = (ar[None, :] + 1) < ln[:, None]
    tgt = torch.where(has_next & data["mask"][nxt], data["ids"][nxt].long(), -100)
    return ids, tgt


def model_config(vocab_size, eos, pad):
    cfg = {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
           "bos_token_id": None, "dtype": "bfloat16", "eos_token_id": eos, "hidden_act": "silu",
           "initializer_range": 0.02, "max_window_layers": MODEL["num_hidden_layers"], "model_type": "qwen3",
           "pad_token_id": pad, "rope_scaling": None,
           "rope_parameters": {"rope_theta": MODEL["rope_theta"], "rope_type": "default"},
           "sliding_window": None, "use_cache": True, "use_sliding_window": False, "vocab_size": vocab_size,
           "layer_types": ["full_attention"] * MODEL["num_hidden_layers"], "transformers_version": "5.17.0"}
    cfg.update(MODEL)
    return dict(sorted(cfg.items()))


def pick_device(name):
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def cmd_train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    dev = pick_device(args.device)
    tok = json.load(open(f"{args.work}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    V = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    cfg = model_config(V, enc.added["<|im_end|>"], enc.added["<|endoftext|>"])
    data = torch.load(f"{args.work}/data.pt")
    lens = data["lens"].tolist()
    data = {k: v.to(dev) for k, v in data.items()}
    model = Qwen3(cfg, MTP_INTER)
    model.init_weights()
    if args.resume:
        ck = torch.load(f"{args.work}/ckpt.pt")
        model.load_state_dict(ck["state"])
        log(f"resumed from step {ck['step']}")
    if args.init_from:  # continue from an exported checkpoint (dequantized if it is q8)
        m, _ = load_model(args.init_from)
        miss, extra = model.load_state_dict(m.state_dict(), strict=False)
        assert not extra and all(k.startswith("mtp.") for k in miss), (miss, extra)
        log(f"weights from {args.init_from}" + (" (MTP head new)" if miss else ""))
    model.to(dev)
    fused = dev.type == "cuda"  # SDPA needs torch >= 2 (Debian 12 has 1.13)
    nparam = sum(p.numel() for p in model.parameters())
    log(f"params {nparam / 1e6:.2f}M, vocab {V}, dialogues {len(lens)}, device {dev}")
    # The MTP head trains on its own loss with the trunk's hidden states and the shared embeddings
    # and lm_head detached (qwen3_min.Qwen3.mtp_forward, shared_grad=False): it cannot move what
    # the chat model already does. It starts from scratch, so it gets its own (higher) learning
    # rate and its own gradient clipping.
    trunk = [(n, p) for n, p in model.named_parameters() if not n.startswith("mtp.")]
    head = [(n, p) for n, p in model.named_parameters() if n.startswith("mtp.")]
    groups = [{"params": [p for _, p in ps if p.dim() == wd_dim], "weight_decay": wd, "mult": mult}
              for ps, mult in ((trunk, 1.0), (head, args.mtp_lr_mult)) for wd_dim, wd in ((2, 0.1), (1, 0.0))]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = random.Random(args.seed)
    budget = args.minutes * 60
    t0 = time.time()
    step, seen, loss_acc, mtp_acc, n_acc = 0, 0, torch.zeros((), device=dev), torch.zeros((), device=dev), 0
    epoch = 0
    done = False
    while not done:
        epoch += 1
        for idx in batches(lens, args.batch_tokens, rng):
            frac = (time.time() - t0) / budget
            if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
                done = True
                break
            warm = min(1.0, (step + 1) / args.warmup)
            lr = args.lr * warm * (args.final_lr + (1 - args.final_lr) * 0.5 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr * g["mult"]
            ids, tgt = collate(data, torch.tensor(idx), dev)
            # bf16 autocast on the GPU; on the CPU (torch 1.13) bf16 matmuls are far slower than f32
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):
                logits, h = model(ids, fused=fused, hidden=True)
                # head at position t: token t + 1 and hidden t -> token t + 2 (= tgt[t + 1])
                mtp_logits, _ = model.mtp_forward(ids[:, 1:], h[:, :-1].detach(), fused=fused, shared_grad=False)
            loss = F.cross_entropy(logits.float().view(-1, V), tgt.view(-1), ignore_index=-100)
            mtp_loss = F.cross_entropy(mtp_logits.float().reshape(-1, V), tgt[:, 1:].reshape(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            (loss + mtp_loss).backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in trunk], 1.0)
            torch.nn.utils.clip_grad_norm_([p for _, p in head], 1.0)
            opt.step()
            step += 1
            seen += ids.numel()
            loss_acc += loss.detach()
            mtp_acc += mtp_loss.detach()
            n_acc += 1
            if step % args.log_every == 0:
                el = time.time() - t0
                log(f"step {step} epoch {epoch} loss {loss_acc.item() / n_acc:.4f} mtp {mtp_acc.item() / n_acc:.4f} "
                    f"lr {lr:.2e} tok/s {seen / el:.0f} seen {seen / 1e6:.1f}M elapsed {el / 60:.2f}m")
                loss_acc, mtp_acc, n_acc = torch.zeros((), device=dev), torch.zeros((), device=dev), 0
    el = time.time() - t0
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    torch.save({"cfg": cfg, "state": state, "step": step, "seconds": el, "tokens": seen, "epochs": epoch,
                "params": nparam, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"},
               f"{args.work}/ckpt.pt")
    log(f"done: {step} steps, {seen / 1e6:.1f}M tokens (padding included), {el / 60:.1f} min, epoch {epoch}")


@torch.no_grad()
def greedy(model, ids, stop, max_new=96):
    """Greedy continuation in float32 math (no KV cache: the model is small)."""
    dev = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=dev)
    out = []
    for _ in range(max_new):
        t = int(model(x)[0, -1].argmax())
        out.append(t)
        if t == stop:
            break
        x = torch.cat([x, torch.tensor([[t]], device=dev)], dim=1)
    return out


# copy-edit last: the earlier categories draw the same prompts as before it was added
EVAL_GENS = {"arithmetic": gc.gen_arith, "units": gc.gen_units, "dates": gc.gen_dates, "facts": gc.gen_facts,
             "identity": gc.gen_chat, "stories": gc.gen_story, "tools": gc.gen_tools, "multi-turn": gc.gen_multi,
             "copy-edit": gc.gen_copy}


@torch.no_grad()
def mtp_hits(model, ids, n_prompt):
    """(hits, tries): how often the MTP head's k = 1 draft at position p (hidden p, token p + 1)
    equals token p + 2, over the reply tokens p + 2 >= n_prompt + 1 (what decoding would draft)."""
    if not hasattr(model, "mtp") or len(ids) < n_prompt + 2:
        return 0, 0
    dev = next(model.parameters()).device
    x = torch.tensor([list(ids)], device=dev)
    _, h = model(x, hidden=True)
    lg, _ = model.mtp_forward(x[:, 1:], h[:, :-1])
    pred = lg[0].argmax(-1)
    p0 = n_prompt - 1  # first draft: hidden at the last prompt position, fed the first reply token
    hits = (pred[p0:len(ids) - 2] == x[0, p0 + 2:]).sum().item()
    return hits, len(ids) - 2 - p0


def cmd_eval(args):
    """Greedy eval of the exported checkpoint (as cairn will run it: dequantized weights, float32)."""
    torch.set_num_threads(args.threads)
    dev = pick_device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    tok = json.load(open(f"{args.model}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    stop = enc.added["<|im_end|>"]
    model, _ = load_model(args.model)
    model.to(dev).eval()
    rng = random.Random(12345)
    per, shown, mtp = {}, {}, {}
    for cat, g in EVAL_GENS.items():
        if args.cats and cat not in args.cats.split(","):
            continue
        ok, hits, tries = 0, 0, 0
        for i in range(args.n):
            _, msgs, tools, expect = g(rng, "eval")
            prompt = gc.render(msgs[:-1], tools, add_generation_prompt=True)
            p_ids = enc.encode(prompt)
            o_ids = greedy(model, p_ids, stop, max_new=args.max_new)
            h, t = mtp_hits(model, p_ids + o_ids, len(p_ids))
            hits, tries = hits + h, tries + t
            out = enc.decode(o_ids, skip_special=False)
            good = all(e in out for e in expect) and out.endswith("<|im_end|>")
            ok += good
            if not good and shown.get(cat, 0) < args.show:
                shown[cat] = shown.get(cat, 0) + 1
                print(f"  [{cat}] FAIL  Q={msgs[-2]['content'][:70]!r}\n      got={out[:160]!r}\n      want={expect}")
        per[cat] = ok / args.n
        mtp[cat] = hits / tries if tries else 0.0
        log(f"{cat:12s} {ok}/{args.n} = {100 * ok / args.n:.0f}%  MTP k=1 drafts right {hits}/{tries}")
    if args.eval_out:
        json.dump(per, open(args.eval_out, "w"), indent=1)
        if hasattr(model, "mtp"):
            json.dump(mtp, open(args.eval_out.replace(".json", "") + "_mtp.json", "w"), indent=1)
    log("overall", f"{100 * sum(per.values()) / len(per):.1f}%")


EXPECTED_CASES = [([{"role": "user", "content": "What is 12 + 44?"}], None),
                  ([{"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": "What is the capital of France?"}], None),
                  ([{"role": "user", "content": "What's the weather in Paris?"}], ["get_weather"])]


def expected_prompt(enc, msgs, tools):
    """Token ids of an EXPECTED_CASES prompt, rendered for generation."""
    return enc.encode(gc.render(msgs, [gc.TOOL_DEFS[t] for t in tools] if tools else None,
                                add_generation_prompt=True))


def cmd_export(args):
    tok = json.load(open(f"{args.work}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    ck = torch.load(f"{args.work}/ckpt.pt")
    cfg = dict(ck["cfg"])
    g = ck["state"].get("mtp.layers.0.mlp.gate_proj.weight")
    model = Qwen3(cfg, g.shape[0] if g is not None else None)
    model.load_state_dict(ck["state"])
    if args.format == "q8":
        state = quantized_state(model, QUANT["bits"], QUANT["group_size"])
        cfg["quantization"] = dict(QUANT)
        cfg["quantization_config"] = dict(QUANT)
    else:
        state = export_state(model)
    os.makedirs(args.out, exist_ok=True)
    json.dump(cfg, open(f"{args.out}/config.json", "w"), indent=2)
    json.dump(tok, open(f"{args.out}/tokenizer.json", "w"), ensure_ascii=False, indent=2)
    save_safetensors(f"{args.out}/model.safetensors", state, {"format": "mlx" if args.format == "q8" else "pt"})
    im_end, eot = enc.added["<|im_end|>"], enc.added["<|endoftext|>"]
    json.dump({"do_sample": False, "eos_token_id": im_end, "pad_token_id": eot,
               "transformers_version": "5.17.0"}, open(f"{args.out}/generation_config.json", "w"), indent=2)
    tc = {"add_bos_token": False, "add_prefix_space": False,
          "added_tokens_decoder": {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                     "single_word", "special")}
                                   for t in tok["added_tokens"]},
          "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
          "chat_template": gc.TEMPLATE, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
          "errors": "replace", "model_max_length": MAX_LEN * 4, "pad_token": "<|endoftext|>",
          "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None}
    json.dump(tc, open(f"{args.out}/tokenizer_config.json", "w"), ensure_ascii=False, indent=2)
    # expected logits: float32 math on the weights exactly as written (dequantized for q8), on the CPU
    model, _ = load_model(args.out)
    model.eval()
    tensors, meta = {}, []
    for i, (msgs, tools) in enumerate(EXPECTED_CASES):
        prompt = expected_prompt(enc, msgs, tools)
        cont = greedy(model, prompt, im_end, max_new=args.cont)
        toks = prompt + cont
        with torch.no_grad():
            lg = model(torch.tensor([toks]))[0].float()
        top2 = lg.topk(2, dim=-1).values
        K = min(len(toks), args.rows)
        first = len(toks) - K
        tensors[f"case{i}.tokens"] = torch.tensor(toks, dtype=torch.int32)
        tensors[f"case{i}.logits"] = lg[first:].contiguous()
        tensors[f"case{i}.margins"] = (top2[:, 0] - top2[:, 1]).contiguous()
        meta.append({"case": i, "prompt_len": len(prompt), "total_len": len(toks), "first_logit_pos": first})
        log(f"case{i}: prompt {len(prompt)} tokens -> {enc.decode(cont)!r}")
    os.makedirs(os.path.dirname(args.expected), exist_ok=True)
    save_safetensors(args.expected, tensors, {"note": "logits in float32 math on the checkpoint's weights "
                                              "(dequantized where quantized; scripts/demo-model/qwen3_min.py, "
                                              "eager attention)", "cases": json.dumps(meta)})
    log("wrote", args.out, args.expected)
    if args.expected_mtp:
        write_expected_mtp(args, enc)


def margin(row):
    top = torch.topk(row, 2).values
    return (top[0] - top[1]).item()


@torch.no_grad()
def write_expected_mtp(args, enc, chain=3):
    """The MTP head's reference logits for the first two EXPECTED_CASES prompts, in float64 on
    the exported (dequantized) weights, in the layout of tests/data/mtp/*/expected_mtp.safetensors
    (scripts/mtp-ref/make_fixtures.py): k = 1 at every prompt position (fed token p + 1, the
    target's greedy next token for the last) and a chain of `chain` greedy drafts."""
    model, _ = load_model(args.out, torch.float64)
    model.eval()
    out, cases = {}, []
    for i, (msgs, tools) in enumerate(EXPECTED_CASES[:2]):
        toks = torch.tensor([expected_prompt(enc, msgs, tools)])
        lg, h = model(toks, hidden=True)
        nxt = int(lg[0, -1].argmax())
        ids = torch.cat((toks[:, 1:], torch.tensor([[nxt]])), dim=1)
        rows, hs, drafts = None, h, []
        for j in range(chain):  # the head is causal: recomputing the grown sequence = chaining
            mlg, g = model.mtp_forward(ids, hs)
            if j == 0:
                rows = [mlg[0, -1]]
                k1 = mlg[0]
            else:
                rows.append(mlg[0, -1])
            drafts.append(int(mlg[0, -1].argmax()))
            ids = torch.cat((ids, torch.tensor([[drafts[-1]]])), dim=1)
            hs = torch.cat((hs, g[:, -1:]), dim=1)
        T = toks.shape[1]
        out[f"case{i}.tokens"] = toks[0].to(torch.int32)
        out[f"case{i}.next"] = torch.tensor([nxt], dtype=torch.int32)
        out[f"case{i}.mtp_logits"] = k1.to(torch.float32).contiguous()
        out[f"case{i}.chain_tokens"] = torch.tensor(drafts, dtype=torch.int32)
        out[f"case{i}.chain_logits"] = torch.stack(rows).to(torch.float32)
        out[f"case{i}.chain_margins"] = torch.tensor([margin(r) for r in rows], dtype=torch.float32)
        cases.append({"case": i, "prompt_len": T, "chain": chain})
        log(f"mtp case{i}: T={T} next={nxt} drafts={drafts} ({enc.decode(drafts)!r})")
    save_safetensors(args.expected_mtp, out, {"cases": json.dumps(cases), "note": "qwen3_min.py's MTP head in "
                     "float64 on the dequantized export; see scripts/demo-model/train.py write_expected_mtp"})
    log("wrote", args.expected_mtp)


def cmd_verify(args):
    """The exported model, tokenizer and template against HF transformers/tokenizers (the reference)."""
    import transformers
    from tokenizers import Tokenizer
    bad = 0
    enc = bpe.Encoder(json.load(open(f"{args.model}/tokenizer.json")))
    hf_tok = Tokenizer.from_file(f"{args.model}/tokenizer.json")
    rng = random.Random(7)
    texts = [gc.render(*gc.sample(rng, "eval")[1:3]) for _ in range(300)]
    texts += ["héllo wörld ✓ 12345 \n\n  x", "日本語のテキスト", "<|im_start|>user\nhi<|im_end|>", "  a  b\t\tc "]
    for t in texts:
        a, b = enc.encode(t), hf_tok.encode(t, add_special_tokens=False).ids
        if a != b:
            bad += 1
            print("tokenizer mismatch", repr(t[:80]), a[:20], b[:20])
        if hf_tok.decode(b, skip_special_tokens=False) != t:
            bad += 1
            print("decode mismatch", repr(t[:80]))
    log(f"tokenizer: {len(texts)} texts, ids equal to HF tokenizers: {bad == 0}")
    ht = transformers.AutoTokenizer.from_pretrained(args.model)
    for msgs, tools in [(m, t) for _, m, t, _ in (gc.sample(random.Random(s), "eval") for s in range(40))]:
        for gen in (False, True):
            want = gc.render(msgs[:-1] if gen else msgs, tools, add_generation_prompt=gen)
            got = ht.apply_chat_template(msgs[:-1] if gen else msgs, tools=tools, tokenize=False,
                                         add_generation_prompt=gen)
            if got != want:
                bad += 1
                print("template mismatch\n", repr(got[:300]), "\n", repr(want[:300]))
    log("chat template: 80 renders compared with transformers' apply_chat_template")
    mine, cfg = load_model(args.model, torch.float32)
    if "quantization" in cfg:  # transformers cannot read MLX packing: give it the dequantized weights
        tmp = f"{args.work}/hf-dequantized"
        os.makedirs(tmp, exist_ok=True)
        c = {k: v for k, v in cfg.items() if not k.startswith("quantization")}
        json.dump(c, open(f"{tmp}/config.json", "w"))
        save_safetensors(f"{tmp}/model.safetensors", {k: v for k, v in mine.state_dict().items()
                                                       if k != "lm_head.weight"}, {"format": "pt"})
        folder = tmp
    else:
        folder = args.model
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    worst = 0.0
    for msgs, tools in EXPECTED_CASES:
        ids = torch.tensor([expected_prompt(enc, msgs, tools)])
        with torch.no_grad():
            a, b = mine(ids)[0], hf(ids).logits[0]
        worst = max(worst, (a - b).abs().max().item())
    log(f"logits vs transformers {transformers.__version__}: max |diff| {worst:.2e}")
    bad += worst > 1e-3
    sys.exit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["prep", "train", "eval", "export", "verify"])
    ap.add_argument("--work", default="/tmp/demo-work")
    ap.add_argument("--model", default="models/demo", help="exported checkpoint (eval, verify)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dialogues", type=int, default=1500000)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--tokenizer", default="", help="prep: use this tokenizer.json instead of training one")
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="start from the weights in WORK/ckpt.pt")
    ap.add_argument("--init-from", default="", help="start from an exported checkpoint folder")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--mtp-lr-mult", type=float, default=3.0, help="the MTP head's learning rate, times --lr")
    ap.add_argument("--max-new", type=int, default=256, help="eval: greedy tokens per reply at most")
    ap.add_argument("--expected-mtp", default="", help="export: also write the MTP head's reference logits here")
    ap.add_argument("--final-lr", type=float, default=0.05, help="cosine floor, as a fraction of --lr")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--batch-tokens", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--cats", default="", help="comma-separated categories to evaluate (default: all)")
    ap.add_argument("--eval-out", default="", help="write per-category scores here (JSON)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--cont", type=int, default=24, help="greedy tokens after each expected-logits prompt")
    ap.add_argument("--format", choices=["q8", "bf16"], default="q8")
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--expected", default="tests/data/demo/expected.safetensors")
    args = ap.parse_args()
    {"prep": cmd_prep, "train": cmd_train, "eval": cmd_eval, "export": cmd_export,
     "verify": cmd_verify}[args.cmd](args)


if __name__ == "__main__":
    main()
