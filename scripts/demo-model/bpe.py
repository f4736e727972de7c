"""Byte-level BPE (Qwen2-style pre-tokenizer) trainer and encoder, writing HF tokenizer.json.

Written from scratch because the HF `tokenizers` package is not available on the machine
that trains the demo model. The output has the same structure as Qwen3's tokenizer.json:
NFC normalizer, Split(regex, Isolated) + ByteLevel(use_regex=false) pre-tokenizer,
BPE model with merges as pairs, ByteLevel decoder, added tokens after the learned vocab.
encode() reproduces what `tokenizers` does for such a file (checked by check_bpe.py
against the oracle cases for the real Qwen3 tokenizer).
"""
import collections
import json
import unicodedata

import regex

PRETOK = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE = regex.compile(PRETOK)


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def pretokenize(text):
    text = unicodedata.normalize("NFC", text)
    return ["".join(B2U[b] for b in w.encode("utf-8")) for w in _PRE.findall(text)]


def train(word_counts, vocab_size, n_added):
    """word_counts: {byte-level word: count}. Returns (vocab dict, merges list)."""
    base = [B2U[b] for b in sorted(B2U)]
    # Order base symbols as GPT-2 / Qwen do: by the unicode code point of their byte symbol
    # for printable bytes first, i.e. the order bytes_to_unicode() builds them.
    base = list(bytes_to_unicode().values())
    vocab = {s: i for i, s in enumerate(base)}
    target = vocab_size - n_added
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    pair_cnt = collections.Counter()
    where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pair_cnt[(a, b)] += counts[wi]
            where[(a, b)].add(wi)
    merges = []
    import heapq
    heap = [(-c, p) for p, c in pair_cnt.items()]
    heapq.heapify(heap)
    while len(vocab) < target and heap:
        negc, p = heapq.heappop(heap)
        c = pair_cnt.get(p, 0)
        if c <= 0:
            continue
        if -negc != c:
            heapq.heappush(heap, (-c, p))
            continue
        if c < 2:
            break
        a, b = p
        new = a + b
        merges.append([a, b])
        if new not in vocab:
            vocab[new] = len(vocab)
        changed = set()
        for wi in list(where[p]):
            w = words[wi]
            cnt = counts[wi]
            for x, y in zip(w, w[1:]):
                pair_cnt[(x, y)] -= cnt
                changed.add((x, y))
            i = 0
            nw = []
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    nw.append(new)
                    i += 2
                else:
                    nw.append(w[i])
                    i += 1
            words[wi] = nw
            for x, y in zip(nw, nw[1:]):
                pair_cnt[(x, y)] += cnt
                where[(x, y)].add(wi)
                changed.add((x, y))
        del where[p]
        pair_cnt.pop(p, None)
        for q in changed:
            if pair_cnt.get(q, 0) > 0:
                heapq.heappush(heap, (-pair_cnt[q], q))
    return vocab, merges


def tokenizer_json(vocab, merges, added):
    """added: list of (content, special) appended after vocab."""
    n = len(vocab)
    added_tokens = []
    for i, (content, special) in enumerate(added):
        added_tokens.append({"id": n + i, "content": content, "single_word": False, "lstrip": False,
                             "rstrip": False, "normalized": False, "special": special})
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOK}, "behavior": "Isolated", "invert": False},
            bl]},
        "post_processor": bl, "decoder": bl,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }


class Encoder:
    def __init__(self, tok):
        m = tok["model"]
        self.vocab = m["vocab"]
        merges = [tuple(x.split(" ")) if isinstance(x, str) else tuple(x) for x in m["merges"]]
        self.rank = {p: i for i, p in enumerate(merges)}
        self.ignore_merges = m.get("ignore_merges", False)
        self.added = {t["content"]: t["id"] for t in tok["added_tokens"]}
        self.special = {t["id"] for t in tok["added_tokens"] if t["special"]}
        self.id2tok = {v: k for k, v in self.vocab.items()}
        for k, v in self.added.items():
            self.id2tok[v] = k
        self.added_re = regex.compile("|".join(regex.escape(a) for a in
                                               sorted(self.added, key=len, reverse=True)))
        self.cache = {}

    def _bpe(self, w):
        if w in self.cache:
            return self.cache[w]
        if self.ignore_merges and w in self.vocab:
            return [self.vocab[w]]
        parts = list(w)
        while len(parts) > 1:
            best = None
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best[0]):
                    best = (r, i)
            if best is None:
                break
            a, b = parts[best[1]], parts[best[1] + 1]
            out = []
            i = 0
            while i < len(parts):
                if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(parts[i])
                    i += 1
            parts = out
        ids = [self.vocab[p] for p in parts]
        self.cache[w] = ids
        return ids

    def encode(self, text):
        ids = []
        pos = 0
        for m in self.added_re.finditer(text):
            for w in pretokenize(text[pos:m.start()]):
                ids.extend(self._bpe(w))
            ids.append(self.added[m.group(0)])
            pos = m.end()
        for w in pretokenize(text[pos:]):
            ids.extend(self._bpe(w))
        return ids

    def decode(self, ids, skip_special=False):
        out = []
        buf = []
        for i in ids:
            t = self.id2tok[i]
            if i in self.added.values() and t in self.added:
                if buf:
                    out.append(bytes(buf).decode("utf-8", "replace"))
                    buf = []
                if not (skip_special and i in self.special):
                    out.append(t)
            else:
                buf.extend(U2B[c] for c in t)
        if buf:
            out.append(bytes(buf).decode("utf-8", "replace"))
        return "".join(out)
