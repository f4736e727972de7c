"""Builds cairn's demo chat model end to end: corpus -> tokenizer -> training -> eval -> export.

  python3 train.py prep   --work DIR            corpus, tokenizer.json, encoded data (DIR/data.pt)
  python3 train.py train  --work DIR --minutes M   train a Qwen3ForCausalLM for M minutes of wall time
  python3 train.py eval   --work DIR            greedy eval on held-out prompts, per category
  python3 train.py export --work DIR --out models/demo --expected tests/data/demo/expected.safetensors

Needs torch, regex and jinja2 (Debian: python3-torch python3-regex python3-jinja2; with
libopenblas0-pthread for usable CPU speed). The HF `transformers` / `tokenizers` packages are
not needed: qwen3_min.py and bpe.py implement the exact same model and tokenizer formats.
"""
import argparse
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gen_corpus as gc  # noqa: E402
from qwen3_min import Qwen3, export_state, save_safetensors, load_safetensors  # noqa: E402

ADDED = [("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<tool_call>", False),
         ("</tool_call>", False), ("<tool_response>", False), ("</tool_response>", False),
         ("<think>", False), ("</think>", False)]
MODEL = dict(hidden_size=256, num_hidden_layers=6, intermediate_size=768, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6, rope_theta=10000.0,
             tie_word_embeddings=True, max_position_embeddings=2048)
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


def cmd_prep(args):
    os.makedirs(args.work, exist_ok=True)
    rng = random.Random(args.seed)
    log("generating", args.dialogues, "dialogues")
    texts = []
    for _ in range(args.dialogues):
        cat, msgs, tools, _ = gc.sample(rng, "train")
        texts.append(gc.render(msgs, tools))
    log("counting words")
    specials = bpe.regex.compile("|".join(bpe.regex.escape(a) for a, _ in ADDED))
    counts = {}
    for t in texts[:80000]:
        for piece in specials.split(t):
            for w in bpe.pretokenize(piece):
                counts[w] = counts.get(w, 0) + 1
    log("unique words", len(counts), "- training BPE to", args.vocab)
    vocab, merges = bpe.train(counts, args.vocab, len(ADDED))
    tok = bpe.tokenizer_json(vocab, merges, ADDED)
    json.dump(tok, open(f"{args.work}/tokenizer.json", "w"), ensure_ascii=False, indent=2)
    log("vocab", len(vocab), "+", len(ADDED), "added; merges", len(merges))
    enc = bpe.Encoder(tok)
    for t in texts[:300]:
        ids, mask = encode_dialogue(enc, t)
        assert ids == enc.encode(t), "segment-wise encoding differs from whole encoding"
        assert enc.decode(ids) == t
    data, ntok, nloss = [], 0, 0
    for i, t in enumerate(texts):
        ids, mask = encode_dialogue(enc, t)
        if len(ids) > MAX_LEN:
            continue
        data.append((torch.tensor(ids, dtype=torch.int16), torch.tensor(mask, dtype=torch.bool)))
        ntok += len(ids)
        nloss += sum(mask)
        if i % 50000 == 0:
            log("encoded", i)
    torch.save(data, f"{args.work}/data.pt")
    log(f"{len(data)} dialogues, {ntok} tokens ({ntok / len(data):.1f}/dialogue), {nloss} loss tokens")


def batches(data, tokens_per_batch, rng):
    order = sorted(range(len(data)), key=lambda i: (len(data[i][0]), rng.random()))
    out, cur, curmax = [], [], 0
    for i in order:
        n = len(data[i][0])
        if cur and max(curmax, n) * (len(cur) + 1) > tokens_per_batch:
            out.append(cur)
            cur, curmax = [], 0
        cur.append(i)
        curmax = max(curmax, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(data, idx):
    T = max(len(data[i][0]) for i in idx)
    ids = torch.zeros(len(idx), T, dtype=torch.long)
    tgt = torch.full((len(idx), T), -100, dtype=torch.long)
    for r, i in enumerate(idx):
        x, m = data[i]
        x = x.long()
        ids[r, :len(x)] = x
        t = x.clone()
        t[~m] = -100
        tgt[r, :len(x) - 1] = t[1:]
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


def cmd_train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    tok = json.load(open(f"{args.work}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    V = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    cfg = model_config(V, enc.added["<|im_end|>"], enc.added["<|endoftext|>"])
    data = torch.load(f"{args.work}/data.pt")
    model = Qwen3(cfg)
    model.init_weights()
    if args.resume:
        ck = torch.load(f"{args.work}/ckpt.pt")
        model.load_state_dict(ck["state"])
        log(f"resumed from step {ck['step']}")
    nparam = sum(p.numel() for p in model.parameters())
    log(f"params {nparam / 1e6:.2f}M, vocab {V}, dialogues {len(data)}")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2]
    other = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    rng = random.Random(args.seed)
    budget = args.minutes * 60
    t0 = time.time()
    step, seen, loss_acc, n_acc = 0, 0, 0.0, 0
    epoch = 0
    done = False
    while not done:
        epoch += 1
        for idx in batches(data, args.batch_tokens, rng):
            frac = (time.time() - t0) / budget
            if frac >= 1.0 or (args.max_steps and step >= args.max_steps):
                done = True
                break
            warm = min(1.0, (step + 1) / args.warmup)
            lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))
            for g in opt.param_groups:
                g["lr"] = lr
            ids, tgt = collate(data, idx)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(ids)
            loss = F.cross_entropy(logits.float().view(-1, V), tgt.view(-1), ignore_index=-100)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            seen += ids.numel()
            loss_acc += loss.item()
            n_acc += 1
            if step % args.log_every == 0:
                el = time.time() - t0
                log(f"step {step} epoch {epoch} loss {loss_acc / n_acc:.4f} lr {lr:.2e} "
                    f"tok/s {seen / el:.0f} seen {seen / 1e6:.2f}M elapsed {el / 60:.1f}m")
                loss_acc, n_acc = 0.0, 0
            if step % 500 == 0:
                torch.save({"cfg": cfg, "state": model.state_dict(), "step": step}, f"{args.work}/ckpt.pt")
    el = time.time() - t0
    torch.save({"cfg": cfg, "state": model.state_dict(), "step": step, "seconds": el, "tokens": seen,
                "params": nparam}, f"{args.work}/ckpt.pt")
    log(f"done: {step} steps, {seen / 1e6:.2f}M tokens, {el / 60:.1f} min")


def load_ckpt(work, dtype=torch.float32):
    ck = torch.load(f"{work}/ckpt.pt")
    m = Qwen3(ck["cfg"])
    m.load_state_dict(ck["state"])
    # round weights to bf16 exactly as exported
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m.to(dtype).eval(), ck


@torch.no_grad()
def greedy(model, ids, stop, max_new=96, autocast=True):
    ids = list(ids)
    out = []
    for _ in range(max_new):
        x = torch.tensor([ids])
        if autocast:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                lg = model(x)[0, -1]
        else:
            lg = model(x)[0, -1]
        t = int(lg.float().argmax())
        ids.append(t)
        out.append(t)
        if t == stop:
            break
    return out


def cmd_eval(args):
    torch.set_num_threads(args.threads)
    tok = json.load(open(f"{args.work}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    stop = enc.added["<|im_end|>"]
    model, ck = load_ckpt(args.work)
    rng = random.Random(12345)
    per = {}
    shown = {}
    gens = {"arithmetic": gc.gen_arith, "units": gc.gen_units, "dates": gc.gen_dates, "facts": gc.gen_facts,
            "identity": gc.gen_chat, "stories": gc.gen_story, "tools": gc.gen_tools, "multi-turn": gc.gen_multi}
    for cat, g in gens.items():
        if args.cats and cat not in args.cats.split(","):
            continue
        ok = 0
        for i in range(args.n):
            _, msgs, tools, expect = g(rng, "eval")
            prompt = gc.render(msgs[:-1], tools, add_generation_prompt=True)
            out = enc.decode(greedy(model, enc.encode(prompt), stop), skip_special=False)
            good = all(e in out for e in expect) and out.endswith("<|im_end|>")
            ok += good
            if not good and shown.get(cat, 0) < args.show:
                shown[cat] = shown.get(cat, 0) + 1
                print(f"  [{cat}] FAIL  Q={msgs[-2]['content'][:70]!r}\n      got={out[:160]!r}\n      want={expect}")
        per[cat] = ok / args.n
        log(f"{cat:12s} {ok}/{args.n} = {100 * ok / args.n:.0f}%")
    if not args.cats:
        json.dump(per, open(f"{args.work}/eval.json", "w"), indent=1)
    log("overall", f"{100 * sum(per.values()) / len(per):.1f}%")


def cmd_export(args):
    tok = json.load(open(f"{args.work}/tokenizer.json"))
    enc = bpe.Encoder(tok)
    model, ck = load_ckpt(args.work)
    cfg = ck["cfg"]
    os.makedirs(args.out, exist_ok=True)
    json.dump(cfg, open(f"{args.out}/config.json", "w"), indent=2)
    json.dump(tok, open(f"{args.out}/tokenizer.json", "w"), ensure_ascii=False, indent=2)
    save_safetensors(f"{args.out}/model.safetensors", export_state(model), {"format": "pt"})
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
    # expected logits, float32 math on the exported bf16 weights
    cases = [([{"role": "user", "content": "What is 12 + 44?"}], None),
             ([{"role": "system", "content": "You are a helpful assistant."},
               {"role": "user", "content": "What is the capital of France?"}], None),
             ([{"role": "user", "content": "What's the weather in Paris?"}], [gc.TOOL_DEFS["get_weather"]])]
    tensors, meta = {}, []
    for i, (msgs, tools) in enumerate(cases):
        prompt = enc.encode(gc.render(msgs, tools, add_generation_prompt=True))
        cont = greedy(model, prompt, im_end, max_new=20, autocast=False)
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
    save_safetensors(args.expected, tensors, {"note": "logits in float32 math on the bf16 weights "
                                              "(scripts/demo-model/qwen3_min.py, eager attention)",
                                              "cases": json.dumps(meta)})
    log("wrote", args.out, args.expected)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["prep", "train", "eval", "export"])
    ap.add_argument("--work", default="/tmp/demo-work")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dialogues", type=int, default=300000)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--minutes", type=float, default=45)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="start from the weights in WORK/ckpt.pt")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--show", type=int, default=3)
    ap.add_argument("--cats", default="", help="comma-separated categories to evaluate (default: all)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--out", default="models/demo")
    ap.add_argument("--expected", default="tests/data/demo/expected.safetensors")
    args = ap.parse_args()
    {"prep": cmd_prep, "train": cmd_train, "eval": cmd_eval, "export": cmd_export}[args.cmd](args)


if __name__ == "__main__":
    main()
