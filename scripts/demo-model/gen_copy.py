"""Copy-and-edit dialogues for the demo model (category "copy-edit" of gen_corpus.py).

The assistant re-emits a text it was shown with one small change, the way coding agents re-emit
a file with a line changed or quote a tool result back: what makes speculative decoding pay
(prompt lookup finds the continuation in the prompt; the MTP head learns to copy). Kinds:
  story    a story from gen_corpus with one character renamed or one word replaced
  list     a shopping or to-do list with one number changed, one item renamed or one line added
  config   a small JSON config with one value changed
  code     a small Python function with a name changed, a number changed or a typo fixed
  quote    a file read with a read_file tool call, its contents quoted back
Held-out items (gen_corpus.held_out on the kind and its parameters) are the eval split; the
expected reply is the whole edited text (eval checks it verbatim).

gen_corpus imports this module; this module reads gen_corpus's tables when called (not at
import), so either can be imported first.
"""
import json


def _gc():
    import gen_corpus
    return gen_corpus


ITEMS = ["apples", "bananas", "eggs", "carrots", "potatoes", "onions", "lemons", "tomatoes", "oranges",
         "cookies", "candles", "pencils", "batteries", "cups", "plates", "towels", "bottles of water",
         "loaves of bread", "bags of rice", "boxes of tea"]
TASKS = ["call the bank", "water the plants", "clean the kitchen", "read a book", "walk the dog",
         "buy a gift", "fix the bike", "write a letter", "bake bread", "visit the market", "pay the bills",
         "feed the cat", "wash the car", "plan the trip", "sort the books"]
SERVICES = ["web", "api", "cache", "worker", "search", "mail", "store", "auth"]
HOSTS = ["localhost", "127.0.0.1", "0.0.0.0", "example.com", "db.local"]
FUNCS = [("total_price", "items", "item", "item.price"), ("count_words", "lines", "line", "len(line.split())"),
         ("sum_scores", "players", "player", "player.score"), ("total_weight", "boxes", "box", "box.weight"),
         ("count_pages", "books", "book", "book.pages"), ("sum_sizes", "files", "f", "f.size")]
NEW_FUNC = ["compute_total", "add_up", "get_sum", "collect", "tally", "measure"]
FILES = ["notes.txt", "story.txt", "todo.txt", "list.txt", "config.json", "readme.txt", "draft.txt"]
WORD_SWAPS = [("happy", "glad"), ("big", "large"), ("small", "little"), ("old", "ancient"), ("day", "morning"),
              ("home", "back home"), ("brave", "bold"), ("long", "short"), ("friends", "pals"),
              ("forest", "wood"), ("village", "town"), ("river", "stream")]
READ_FILE = {"type": "function", "function": {
    "name": "read_file", "description": "Read a text file and return its contents.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "description": "The file path"}},
                   "required": ["path"]}}}

RENAME_Q = ["Rewrite this story with the {a} replaced by {an} {b}:\n\n{t}",
            "Here is a story:\n\n{t}\n\nChange the {a} to {an} {b} and write it again.",
            "Replace the {a} with {an} {b} in this story and give me the whole story:\n\n{t}"]
WORD_Q = ["Replace the word \"{a}\" with \"{b}\" in this text:\n\n{t}",
          "In the following text, change \"{a}\" to \"{b}\" everywhere and write the result:\n\n{t}"]
LIST_Q = ["Here is my {what}:\n\n{t}\n\n{edit} Write the whole list again.",
          "Update this {what}. {edit}\n\n{t}"]
CONFIG_Q = ["Here is a config file:\n\n{t}\n\n{edit} Show the full file.",
            "{edit}\n\n{t}"]
CODE_Q = ["Here is some code:\n\n{t}\n\n{edit} Show the whole function.",
          "{edit}\n\n{t}"]
QUOTE_Q = ["Show me what is in {f}.", "Read {f} and show it to me.", "What does {f} say?",
           "Please print the contents of {f}."]
EVAL_Q = {"story": RENAME_Q[0], "word": WORD_Q[0], "list": LIST_Q[0], "config": CONFIG_Q[0], "code": CODE_Q[0],
          "quote": "Can you show me the file {f}?"}


def _fence(lang, body):
    return f"```{lang}\n{body}\n```"


def story_pair(rng, split):
    """(question, answer, key): a story with its character renamed, or one word replaced."""
    gc = _gc()
    single = [x for x in gc.CHARS if " " not in x]
    if rng.random() < 0.6:
        a, b = pick(rng, split, lambda r: tuple(r.sample(single, 2)), "story")
        o = rng.choice([x for x in single if x not in (a, b)])
        parts = [f"Once upon a time, there was {{an}} {{c}} who lived {rng.choice(gc.PLACES)}.",
                 rng.choice(gc.HABITS), rng.choice(gc.EVENTS), rng.choice(gc.MIDDLES), rng.choice(gc.ENDINGS),
                 rng.choice(gc.MORALS), "The end."]
        tell = lambda c: " ".join(x.format(c=c, o=o, an=gc.an(c)) for x in parts if x)  # noqa: E731
        q = (EVAL_Q["story"] if split == "eval" else rng.choice(RENAME_Q))
        return q.format(a=a, b=b, an=gc.an(b), t=tell(a)), tell(b)
    for _ in range(50):
        t = gc.make_story(rng, rng.choice(gc.CHARS))
        swaps = [(x, y) for x, y in WORD_SWAPS if f" {x} " in t]
        if swaps:
            break
    x, y = rng.choice(swaps)
    if gc.held_out("word", x, y, t[:40]) != (split == "eval"):
        return story_pair(rng, split)
    q = EVAL_Q["word"] if split == "eval" else rng.choice(WORD_Q)
    return q.format(a=x, b=y, t=t), t.replace(f" {x} ", f" {y} ")


def pick(rng, split, make, kind):
    return _gc().pick_split(rng, split, make, lambda x: (kind,) + tuple(x))


def list_pair(rng, split):
    n = rng.randint(3, 7)
    if rng.random() < 0.5:
        what, items = "shopping list", rng.sample(ITEMS, n)
        qty = [rng.randint(1, 12) for _ in items]
        line = lambda i, q: f"- {q} {i}"  # noqa: E731
    else:
        what, items = "to-do list", rng.sample(TASKS, n)
        qty = list(range(1, n + 1))
        line = lambda i, q: f"{q}. {i}"  # noqa: E731
    old = [line(i, q) for i, q in zip(items, qty)]
    new = list(old)
    j = rng.randrange(n)
    if what == "shopping list" and rng.random() < 0.5:
        v = rng.choice([x for x in range(1, 13) if x != qty[j]])
        edit = f"Change the number of {items[j]} to {v}."
        new[j] = line(items[j], v)
    else:
        pool = ITEMS if what == "shopping list" else TASKS
        r = rng.choice([x for x in pool if x not in items])
        edit = f"Replace \"{items[j]}\" with \"{r}\"."
        new[j] = line(r, qty[j])
    if _gc().held_out("list", tuple(items), edit) != (split == "eval"):
        return list_pair(rng, split)
    q = EVAL_Q["list"] if split == "eval" else rng.choice(LIST_Q)
    return q.format(what=what, t="\n".join(old), edit=edit), "\n".join(new)


def config_pair(rng, split):
    svc = rng.choice(SERVICES)
    cfg = {"name": svc, "host": rng.choice(HOSTS), "port": rng.choice([80, 443, 3000, 5000, 8000, 8080, 9000]),
           "workers": rng.randint(1, 16), "debug": rng.random() < 0.5, "timeout": rng.choice([5, 10, 30, 60, 120])}
    if rng.random() < 0.5:
        cfg["log_level"] = rng.choice(["info", "debug", "warn", "error"])
    key = rng.choice(["port", "workers", "timeout", "debug", "host"])
    new = dict(cfg)
    if key == "debug":
        new[key] = not cfg[key]
        edit = f"Set debug to {json.dumps(new[key])}."
    elif key == "host":
        new[key] = rng.choice([h for h in HOSTS if h != cfg[key]])
        edit = f"Change the host to {new[key]}."
    else:
        new[key] = rng.choice([v for v in (1, 2, 4, 8, 15, 20, 25, 90, 3001, 8081, 8443, 9090) if v != cfg[key]])
        edit = f"Change the {key} to {new[key]}."
    if _gc().held_out("config", svc, key, new[key]) != (split == "eval"):
        return config_pair(rng, split)
    q = EVAL_Q["config"] if split == "eval" else rng.choice(CONFIG_Q)
    return (q.format(t=_fence("json", json.dumps(cfg, indent=2)), edit=edit),
            _fence("json", json.dumps(new, indent=2)))


def code_pair(rng, split):
    name, arg, each, val = rng.choice(FUNCS)
    var = rng.choice(["total", "result", "count", "acc"])
    start = rng.choice([0, 0, 0, 1])
    lines = [f"def {name}({arg}):", f"    {var} = {start}", f"    for {each} in {arg}:",
             f"        {var} += {val}", f"    return {var}"]
    new = list(lines)
    kind = rng.choice(["rename", "number", "typo"])
    if kind == "rename":
        nn = rng.choice(NEW_FUNC)
        edit = f"Rename the function {name} to {nn}."
        new[0] = f"def {nn}({arg}):"
    elif kind == "number":
        v = 1 - start
        edit = f"Start {var} at {v} instead of {start}."
        new[1] = f"    {var} = {v}"
    else:
        bad = rng.choice([("return", "retrun"), ("for", "fro")])
        i = 4 if bad[0] == "return" else 2
        lines[i] = lines[i].replace(bad[0], bad[1], 1)
        edit = f"Fix the typo on line {i + 1}."
    if _gc().held_out("code", name, var, kind, edit) != (split == "eval"):
        return code_pair(rng, split)
    q = EVAL_Q["code"] if split == "eval" else rng.choice(CODE_Q)
    return q.format(t=_fence("python", "\n".join(lines)), edit=edit), _fence("python", "\n".join(new))


def gen_copy(rng, split):
    """One copy-and-edit dialogue: (category, messages, tools, expected substrings)."""
    gc = _gc()
    kind = rng.choices(["story", "list", "config", "code", "quote"], weights=[30, 20, 15, 15, 20])[0]
    if kind != "quote":
        q, a = {"story": story_pair, "list": list_pair, "config": config_pair, "code": code_pair}[kind](rng, split)
        return "copy-edit", [{"role": "user", "content": q}, {"role": "assistant", "content": a}], None, [a]
    f = rng.choice(FILES)
    body = rng.choice([lambda: gc.make_story(rng, rng.choice(gc.CHARS)), lambda: list_pair(rng, split)[1],
                       lambda: config_pair(rng, split)[1]])()
    if gc.held_out("quote", f, body[:40]) != (split == "eval"):
        return gen_copy(rng, split)
    q = EVAL_Q["quote"].format(f=f) if split == "eval" else rng.choice(QUOTE_Q).format(f=f)
    a = f"Here is {f}:\n\n{body}"
    msgs = [{"role": "user", "content": q}, gc.call("read_file", {"path": f}),
            {"role": "tool", "content": body}, {"role": "assistant", "content": a}]
    return "copy-edit", msgs, [READ_FILE], [a]
