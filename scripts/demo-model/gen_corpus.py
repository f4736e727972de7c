"""Generates the demo model's chat corpus: templated dialogues in OpenAI message form (the
copy-and-edit category lives in gen_copy.py).

Each generator returns (category, messages, tools, expect) where `expect` is a list of strings
that the final assistant turn must contain (used by the evaluation in train.py). A seeded
`split` keeps evaluation items (number pairs, phrasings, story characters) out of training.
render() applies chat_template.jinja exactly as transformers' apply_chat_template would.
"""
import json
import os
import random
import zlib

import jinja2

from gen_copy import gen_copy

HERE = __file__.rsplit("/", 1)[0] if "/" in __file__ else "."
TEMPLATE = open(f"{HERE}/chat_template.jinja").read()


def _tojson(x, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys)


_env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
_env.filters["tojson"] = _tojson
_tmpl = _env.from_string(TEMPLATE)


def render(messages, tools=None, add_generation_prompt=False):
    return _tmpl.render(messages=messages, tools=tools, add_generation_prompt=add_generation_prompt)


def held_out(*key):
    """About 6% of items (by a stable hash of their key) are kept for evaluation."""
    return zlib.crc32(repr(key).encode()) % 100 < 6


def pick_split(rng, split, make, key_of, tries=200):
    """Draws items until one falls in the wanted split."""
    for _ in range(tries):
        item = make(rng)
        if held_out(*key_of(item)) == (split == "eval"):
            return item
    return item


SYSTEMS = [None, None, None, "You are a helpful assistant.", "You are cairn's demo model.",
           "You are a friendly assistant. Answer briefly.", "You are a helpful assistant. Be concise.",
           "You are a small assistant running on the cairn inference server."]

IDENTITY = ("I am cairn's demo model, a tiny language model trained from scratch to show what the "
            "cairn inference server can do.")
SKILLS = ("I can do simple arithmetic, convert units, work with days of the week, answer a few "
          "facts such as capital cities, tell short stories and call tools when they are offered.")

# ---------------------------------------------------------------- arithmetic

ARITH_Q = {
    "+": ["What is {a} + {b}?", "What's {a} + {b}?", "What is {a} plus {b}?", "Calculate {a} + {b}.",
          "How much is {a} + {b}?", "{a} + {b} = ?", "Add {a} and {b}.", "What is the sum of {a} and {b}?",
          "Compute {a} + {b}.", "{a} + {b}?", "Please add {a} and {b}.", "what is {a}+{b}"],
    "-": ["What is {a} - {b}?", "What's {a} minus {b}?", "Calculate {a} - {b}.", "Subtract {b} from {a}.",
          "How much is {a} - {b}?", "{a} - {b} = ?", "What is {a} minus {b}?", "{a} - {b}?",
          "Compute {a} - {b}.", "what is {a}-{b}"],
    "*": ["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.", "Calculate {a} * {b}.",
          "How much is {a} times {b}?", "{a} * {b} = ?", "What is {a} x {b}?", "{a} * {b}?",
          "What is the product of {a} and {b}?", "what is {a}*{b}"],
    "/": ["What is {a} / {b}?", "What is {a} divided by {b}?", "Divide {a} by {b}.", "Calculate {a} / {b}.",
          "{a} / {b} = ?", "How much is {a} divided by {b}?", "{a} / {b}?", "what is {a}/{b}"],
}
ARITH_EVAL_PHRASE = {"+": "What is {a} + {b}?", "-": "What is {a} - {b}?", "*": "What is {a} * {b}?",
                     "/": "What is {a} / {b}?"}


def arith_problem(rng):
    op = rng.choices("+-*/", weights=[45, 25, 20, 10])[0]
    if op == "+":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if rng.random() < 0.15:
            a, b = rng.randint(0, 9), rng.randint(0, 20)
        c = a + b
    elif op == "-":
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        if a < b and rng.random() < 0.8:
            a, b = b, a
        c = a - b
    elif op == "*":
        a, b = rng.randint(0, 12), rng.randint(0, 12)
        c = a * b
    else:
        b, c = rng.randint(1, 12), rng.randint(0, 12)
        a = b * c
    return op, a, b, c


def arith_key(p):
    op, a, b, _ = p
    if (op, a, b) == ("+", 12, 44):  # the web page test asks this one: keep it in training
        return ("train",)
    return (op, a, b)


def arith_answer(op, a, b, c):
    return f"{a} {op} {b} = {c}."


def gen_arith(rng, split):
    op, a, b, c = pick_split(rng, split, arith_problem, arith_key)
    q = ARITH_EVAL_PHRASE[op] if split == "eval" else rng.choice(ARITH_Q[op])
    return "arithmetic", [{"role": "user", "content": q.format(a=a, b=b)},
                          {"role": "assistant", "content": arith_answer(op, a, b, c)}], None, [f"= {c}."]

# ---------------------------------------------------------------- units

UNITS = [  # (from plural, from singular, to plural, to singular, factor, max input)
    ("kilometers", "kilometer", "meters", "meter", 1000, 99),
    ("meters", "meter", "centimeters", "centimeter", 100, 99),
    ("centimeters", "centimeter", "millimeters", "millimeter", 10, 99),
    ("kilograms", "kilogram", "grams", "gram", 1000, 99),
    ("liters", "liter", "milliliters", "milliliter", 1000, 99),
    ("hours", "hour", "minutes", "minute", 60, 12),
    ("minutes", "minute", "seconds", "second", 60, 12),
    ("days", "day", "hours", "hour", 24, 10),
    ("weeks", "week", "days", "day", 7, 12),
    ("feet", "foot", "inches", "inch", 12, 12),
    ("years", "year", "months", "month", 12, 12),
    ("dozen", "dozen", "items", "item", 12, 10),
]
UNIT_Q = ["How many {to} are in {n} {frm}?", "Convert {n} {frm} to {to}.", "What is {n} {frm} in {to}?",
          "{n} {frm} is how many {to}?", "How many {to} is {n} {frm}?", "Please convert {n} {frm} into {to}."]
UNIT_EVAL_Q = "How many {to} are there in {n} {frm}?"
TEMPS = list(range(-20, 105, 5))


def unit_name(n, pl, sg):
    return sg if n == 1 else pl


def gen_units(rng, split):
    if rng.random() < 0.12:
        def make(r):
            return r.choice(TEMPS)
        c = pick_split(rng, split, make, lambda c: ("temp", c))
        f = c * 9 // 5 + 32
        q = rng.choice(["What is {c} degrees Celsius in Fahrenheit?", "Convert {c} C to Fahrenheit.",
                        "{c} degrees Celsius is how many degrees Fahrenheit?"])
        if split == "eval":
            q = "How much is {c} degrees Celsius in Fahrenheit?"
        return "units", [{"role": "user", "content": q.format(c=c)},
                         {"role": "assistant", "content": f"{c} degrees Celsius is {f} degrees Fahrenheit."}], \
            None, [f"is {f} degrees"]

    def make(r):
        u = r.choice(UNITS)
        return u, r.randint(1, u[5])
    u, n = pick_split(rng, split, make, lambda x: (x[0][0], x[0][2], x[1]))
    frm = unit_name(n, u[0], u[1])
    m = n * u[4]
    to = unit_name(m, u[2], u[3])
    q = UNIT_EVAL_Q if split == "eval" else rng.choice(UNIT_Q)
    q = q.format(n=n, frm=frm, to=u[2])
    return "units", [{"role": "user", "content": q},
                     {"role": "assistant", "content": f"{n} {frm} is {m} {to}."}], None, [f"is {m} {to}"]

# ---------------------------------------------------------------- dates

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = [("January", 31), ("February", 28), ("March", 31), ("April", 30), ("May", 31), ("June", 30),
          ("July", 31), ("August", 31), ("September", 30), ("October", 31), ("November", 30),
          ("December", 31)]


def gen_dates(rng, split):
    kind = rng.choices(["plus", "minus", "next", "month_days", "month_next", "leap"],
                       weights=[35, 15, 15, 10, 10, 15])[0]
    ev = split == "eval"
    if kind in ("plus", "minus"):
        def make(r):
            return r.randrange(7), r.randint(1, 20)
        d, n = pick_split(rng, split, make, lambda x: (kind, x[0], x[1]))
        unit = "day" if n == 1 else "days"
        if kind == "plus":
            t = DAYS[(d + n) % 7]
            q = rng.choice(["If today is {d}, what day will it be in {n} {u}?",
                            "Today is {d}. What day is it {n} {u} from now?",
                            "What day of the week is {n} {u} after {d}?"])
            if ev:
                q = "If today is {d}, what day of the week will it be in {n} {u}?"
            a = f"{n} {unit} after {DAYS[d]} is {t}."
        else:
            t = DAYS[(d - n) % 7]
            q = rng.choice(["If today is {d}, what day was it {n} {u} ago?",
                            "Today is {d}. What day was it {n} {u} ago?",
                            "What day of the week is {n} {u} before {d}?"])
            if ev:
                q = "If today is {d}, what day of the week was it {n} {u} ago?"
            a = f"{n} {unit} before {DAYS[d]} is {t}."
        return "dates", [{"role": "user", "content": q.format(d=DAYS[d], n=n, u=unit)},
                         {"role": "assistant", "content": a}], None, [f"is {t}."]
    if kind == "next":
        d = rng.randrange(7)
        if rng.random() < 0.5:
            q = rng.choice(["What day comes after {d}?", "Which day follows {d}?", "What is the day after {d}?"])
            if ev:
                q = "Which day of the week comes after {d}?"
            t = DAYS[(d + 1) % 7]
            a = f"The day after {DAYS[d]} is {t}."
        else:
            q = rng.choice(["What day comes before {d}?", "Which day is before {d}?", "What is the day before {d}?"])
            if ev:
                q = "Which day of the week comes before {d}?"
            t = DAYS[(d - 1) % 7]
            a = f"The day before {DAYS[d]} is {t}."
        return "dates", [{"role": "user", "content": q.format(d=DAYS[d])},
                         {"role": "assistant", "content": a}], None, [f"is {t}."]
    if kind == "month_days":
        m, n = rng.choice(MONTHS)
        q = rng.choice(["How many days are in {m}?", "How many days does {m} have?", "How long is {m}?"])
        if ev:
            q = "How many days are there in {m}?"
        a = f"{m} has {n} days." if m != "February" else "February has 28 days, or 29 in a leap year."
        return "dates", [{"role": "user", "content": q.format(m=m)},
                         {"role": "assistant", "content": a}], None, [f"has {n} days"]
    if kind == "month_next":
        i = rng.randrange(12)
        q = rng.choice(["What month comes after {m}?", "Which month follows {m}?", "What is the month after {m}?"])
        if ev:
            q = "Which month comes after {m}?"
        t = MONTHS[(i + 1) % 12][0]
        return "dates", [{"role": "user", "content": q.format(m=MONTHS[i][0])},
                         {"role": "assistant", "content": f"The month after {MONTHS[i][0]} is {t}."}], None, [f"is {t}."]
    y = pick_split(rng, split, lambda r: r.randint(1901, 2099), lambda y: ("leap", y))
    leap = y % 4 == 0
    q = rng.choice(["Is {y} a leap year?", "Was {y} a leap year?", "Is the year {y} a leap year?"])
    if ev:
        q = "Tell me if {y} is a leap year."
    a = f"Yes, {y} is a leap year." if leap else f"No, {y} is not a leap year."
    return "dates", [{"role": "user", "content": q.format(y=y)},
                     {"role": "assistant", "content": a}], None, ["Yes" if leap else "No"]

# ---------------------------------------------------------------- facts

CAPITALS = [("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
            ("Portugal", "Lisbon"), ("United Kingdom", "London"), ("Ireland", "Dublin"),
            ("Netherlands", "Amsterdam"), ("Belgium", "Brussels"), ("Switzerland", "Bern"),
            ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
            ("Denmark", "Copenhagen"), ("Finland", "Helsinki"), ("Greece", "Athens"), ("Turkey", "Ankara"),
            ("Russia", "Moscow"), ("Ukraine", "Kyiv"), ("Egypt", "Cairo"), ("Kenya", "Nairobi"),
            ("Nigeria", "Abuja"), ("South Africa", "Pretoria"), ("Morocco", "Rabat"), ("Japan", "Tokyo"),
            ("China", "Beijing"), ("India", "New Delhi"), ("South Korea", "Seoul"), ("Thailand", "Bangkok"),
            ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("Australia", "Canberra"),
            ("New Zealand", "Wellington"), ("Canada", "Ottawa"), ("United States", "Washington, D.C."),
            ("Mexico", "Mexico City"), ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"),
            ("Chile", "Santiago"), ("Peru", "Lima"), ("Colombia", "Bogota"), ("Cuba", "Havana"),
            ("Iceland", "Reykjavik"), ("Czechia", "Prague"), ("Hungary", "Budapest"), ("Iran", "Tehran"),
            ("Saudi Arabia", "Riyadh"), ("Israel", "Jerusalem"), ("Pakistan", "Islamabad")]
SIMPLE_FACTS = [  # (questions..., answer, must contain)
    (["What color is the sky?", "What colour is the sky on a clear day?"], "The sky is blue on a clear day.", "blue"),
    (["What color is grass?", "What colour is grass?"], "Grass is green.", "green"),
    (["How many legs does a spider have?", "How many legs do spiders have?"], "A spider has eight legs.", "eight"),
    (["How many legs does a dog have?", "How many legs do dogs have?"], "A dog has four legs.", "four"),
    (["How many days are in a week?", "How many days does a week have?"], "A week has 7 days.", "7"),
    (["How many months are in a year?", "How many months does a year have?"], "A year has 12 months.", "12"),
    (["What is the largest planet?", "Which planet is the biggest?"],
     "Jupiter is the largest planet in our solar system.", "Jupiter"),
    (["Which planet is closest to the sun?", "What is the closest planet to the sun?"],
     "Mercury is the planet closest to the sun.", "Mercury"),
    (["What planet do we live on?", "Which planet is our home?"], "We live on Earth.", "Earth"),
    (["How many planets are in the solar system?", "How many planets does our solar system have?"],
     "There are eight planets in our solar system.", "eight"),
    (["At what temperature does water boil?", "What is the boiling point of water?"],
     "Water boils at 100 degrees Celsius at sea level.", "100"),
    (["At what temperature does water freeze?", "What is the freezing point of water?"],
     "Water freezes at 0 degrees Celsius.", "0 degrees"),
    (["What is the largest ocean?", "Which ocean is the biggest?"], "The Pacific Ocean is the largest ocean.", "Pacific"),
    (["What do bees make?", "What do bees produce?"], "Bees make honey.", "honey"),
    (["What is the fastest land animal?", "Which land animal is the fastest?"],
     "The cheetah is the fastest land animal.", "cheetah"),
    (["How many hours are in a day?", "How many hours does a day have?"], "A day has 24 hours.", "24"),
    (["What gas do plants take in?", "Which gas do plants absorb?"],
     "Plants take in carbon dioxide and give off oxygen.", "carbon dioxide"),
    (["How many continents are there?", "How many continents does the Earth have?"],
     "There are seven continents.", "seven"),
]
SOUNDS = [("cow", "moo"), ("dog", "woof"), ("cat", "meow"), ("duck", "quack"), ("sheep", "baa"),
          ("pig", "oink"), ("owl", "hoot"), ("horse", "neigh"), ("frog", "ribbit"), ("lion", "roar"),
          ("mouse", "squeak"), ("bee", "buzz")]
OPPOSITES = [("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("happy", "sad"),
             ("light", "dark"), ("old", "new"), ("open", "closed"), ("early", "late"), ("full", "empty"),
             ("wet", "dry"), ("hard", "soft"), ("loud", "quiet"), ("day", "night"), ("left", "right"),
             ("tall", "short"), ("strong", "weak"), ("rich", "poor"), ("clean", "dirty"), ("win", "lose")]


def gen_facts(rng, split):
    ev = split == "eval"
    k = rng.choices(["cap", "rev", "simple", "sound", "opp"], weights=[45, 10, 20, 12, 13])[0]
    if k == "cap":
        c, cap = rng.choice(CAPITALS)
        q = rng.choice(["What is the capital of {c}?", "What's the capital of {c}?", "Capital of {c}?",
                        "Which city is the capital of {c}?", "Do you know the capital of {c}?"])
        if ev:
            q = "Tell me the capital of {c}."
        the = "the " if c in ("United Kingdom", "Netherlands", "United States") else ""
        a = f"The capital of {the}{c} is {cap}."
        return "facts", [{"role": "user", "content": q.format(c=the + c)},
                         {"role": "assistant", "content": a}], None, [cap]
    if k == "rev":
        c, cap = rng.choice(CAPITALS)
        q = rng.choice(["{cap} is the capital of which country?", "Which country has {cap} as its capital?"])
        if ev:
            q = "Of which country is {cap} the capital?"
        the = "the " if c in ("United Kingdom", "Netherlands", "United States") else ""
        return "facts", [{"role": "user", "content": q.format(cap=cap)},
                         {"role": "assistant", "content": f"{cap} is the capital of {the}{c}."}], None, [c]
    if k == "simple":
        qs, a, must = rng.choice(SIMPLE_FACTS)
        q = qs[1] if ev else (qs[0] if rng.random() < 0.8 else qs[1] + "")
        if not ev and rng.random() < 0.2:
            q = qs[1]
        if ev:
            q = "Quick question: " + qs[0][0].lower() + qs[0][1:]
        return "facts", [{"role": "user", "content": q}, {"role": "assistant", "content": a}], None, [must]
    if k == "sound":
        an, s = rng.choice(SOUNDS)
        q = rng.choice(["What sound does a {a} make?", "What does a {a} say?", "What noise does a {a} make?"])
        if ev:
            q = "Which sound does a {a} make?"
        return "facts", [{"role": "user", "content": q.format(a=an)},
                         {"role": "assistant", "content": f"A {an} says {s}."}], None, [s]
    w, o = rng.choice(OPPOSITES)
    if rng.random() < 0.5:
        w, o = o, w
    q = rng.choice(["What is the opposite of {w}?", "What's the opposite of {w}?", "Opposite of {w}?"])
    if ev:
        q = "Tell me the opposite of {w}."
    return "facts", [{"role": "user", "content": q.format(w=w)},
                     {"role": "assistant", "content": f"The opposite of {w} is {o}."}], None, [f"is {o}."]

# ---------------------------------------------------------------- identity and small talk

CHAT = [
    (["Who are you?", "What are you?", "Tell me about yourself.", "Introduce yourself.", "who r u"],
     [IDENTITY, IDENTITY + " " + SKILLS], "demo model"),
    (["What is your name?", "What's your name?", "Do you have a name?"],
     ["I am cairn's demo model. I don't have another name.", "People call me cairn's demo model."], "demo model"),
    (["What can you do?", "What are you good at?", "How can you help me?", "What do you know?"],
     [SKILLS, "I am a tiny model, so my skills are limited. " + SKILLS], "arithmetic"),
    (["Who made you?", "Who trained you?", "Who created you?"],
     ["I was trained from scratch by the cairn developers as a small demo model for the cairn inference server."],
     "cairn"),
    (["Are you ChatGPT?", "Are you GPT-4?", "Are you Qwen?", "Are you Llama?"],
     ["No. " + IDENTITY, "No, I am cairn's demo model, a much smaller model trained from scratch."], "demo model"),
    (["Are you a human?", "Are you a person?", "Are you alive?"],
     ["No, I am not a person. " + IDENTITY], "not a person"),
    (["What is cairn?", "Tell me about cairn.", "What is the cairn server?"],
     ["cairn is an LLM inference server written in C. It loads models like me and serves them over an "
      "OpenAI-compatible HTTP API."], "inference server"),
    (["Hi!", "Hello!", "Hey", "Hi there", "Good morning!", "Hello", "hi"],
     ["Hello! I am cairn's demo model. How can I help you today?", "Hi! How can I help you?",
      "Hello! Ask me a math question, a unit conversion or for a short story."], "H"),
    (["How are you?", "How are you doing?", "How's it going?"],
     ["I am doing well, thank you! How can I help you?", "I'm fine, thanks for asking. What can I do for you?"], "thank"),
    (["Thanks!", "Thank you!", "Thanks a lot.", "thank you", "Great, thanks!"],
     ["You're welcome!", "You're welcome! Let me know if you need anything else.", "Happy to help!"], "!"),
    (["Bye!", "Goodbye!", "See you later.", "bye"],
     ["Goodbye! Have a nice day.", "Bye! It was nice talking to you."], "ye"),
    (["Can you write a poem?", "Write me an essay about history.", "Can you write code?",
      "Translate this into French: good morning.", "What is the meaning of life?",
      "Who will win the next election?", "What is the stock price of Apple?", "Explain quantum physics.",
      "What is the population of Brazil?", "Can you help me with my homework in chemistry?",
      "What is the news today?", "Summarize this article for me."],
     ["Sorry, I can't do that. I am only a tiny demo model. " + SKILLS,
      "I'm sorry, that is beyond what I can do. " + SKILLS], "Sorry"),
    (["Which one is better, cats or dogs?", "What is your favorite color?", "Do you like music?"],
     ["I am a tiny model without real opinions, but many people love both!",
      "I don't have real preferences, but I'm happy to chat."], "I"),
]
CHAT_EVAL = {0: "Could you tell me who you are?", 2: "What kinds of things can you do?",
             6: "What is cairn exactly?", 7: "Hello there!", 9: "Thanks so much!"}


def gen_chat(rng, split):
    if split == "eval":
        i = rng.choice(list(CHAT_EVAL))
        qs, ans, must = CHAT[i]
        return "identity", [{"role": "user", "content": CHAT_EVAL[i]},
                            {"role": "assistant", "content": ans[0]}], None, [must]
    qs, ans, must = rng.choice(CHAT)
    return "identity", [{"role": "user", "content": rng.choice(qs)},
                        {"role": "assistant", "content": rng.choice(ans)}], None, [must]

# ---------------------------------------------------------------- stories

CHARS = ["fox", "rabbit", "dragon", "robot", "cat", "dog", "owl", "turtle", "bear", "mouse", "penguin",
         "frog", "whale", "bee", "elephant", "lion", "duck", "horse", "squirrel", "tiger", "wolf", "goat",
         "hedgehog", "panda", "monkey", "snail", "koala", "parrot", "dolphin", "ant", "badger", "otter",
         "giraffe", "kitten", "puppy", "unicorn", "knight", "wizard", "princess", "pirate", "baker",
         "farmer", "little girl", "little boy", "sailor", "astronaut"]
TRAITS = ["brave", "curious", "shy", "kind", "clever", "sleepy", "cheerful", "grumpy", "tiny", "gentle",
          "clumsy", "proud", "lonely", "playful", "patient", "busy"]
PLACES = ["in a quiet forest", "in a small village", "near a big river", "on a green hill", "in an old castle",
          "by the sea", "on a busy farm", "in a snowy valley", "at the edge of a desert", "in a sunny garden",
          "on a tiny island", "in a noisy city", "under a tall oak tree", "high in the mountains"]
HABITS = ["Every morning, the {c} liked to watch the sun come up.",
          "Every day, the {c} collected shiny stones.",
          "The {c} loved to sing songs to the birds.",
          "Each evening, the {c} counted the stars in the sky.",
          "The {c} spent most days reading old books.",
          "The {c} liked to bake bread for the neighbors.",
          "Every afternoon, the {c} went for a long walk."]
EVENTS = ["One day, a strong storm blew away the {c}'s favorite hat.",
          "One day, the {c} found a mysterious map under a rock.",
          "One day, the {c} met a lost {o} who could not find the way home.",
          "One day, the river dried up and everyone became thirsty.",
          "One day, the {c} heard a strange sound coming from a cave.",
          "One day, a big festival was coming, but the {c} had no gift to bring.",
          "One day, the {c} lost the key to the old wooden door."]
MIDDLES = ["The {c} was scared at first, but decided to be brave.",
           "The {c} thought for a long time and then had a clever idea.",
           "So the {c} asked a wise old {o} for help.",
           "The {c} packed some food and set off on a journey.",
           "The {c} took a deep breath and tried again and again."]
ENDINGS = ["In the end, the {c} found what was missing, and everyone cheered.",
           "In the end, the {c} and the {o} became best friends.",
           "In the end, the {c} returned home happy and tired.",
           "In the end, the whole village thanked the {c} with a big party.",
           "In the end, the {c} learned that small steps can lead to big things."]
MORALS = ["From that day on, the {c} was never afraid of storms again.",
          "And the {c} always remembered that friends make every journey better.",
          "And the {c} knew that kindness is the greatest treasure.",
          "And the {c} learned that patience pays off.", ""]
STORY_Q = ["Tell me a story about a {c}.", "Write a short story about a {c}.", "Can you tell me a story about a {c}?",
           "Tell me a bedtime story about a {c}.", "I want a short story about a {c}.",
           "Please write a story about a {c}.", "Story about a {c}, please."]


def an(word):
    return "an" if word[0] in "aeiou" else "a"


def make_story(rng, c, trait=None):
    trait = trait or rng.choice(TRAITS)
    o = rng.choice([x for x in CHARS if x != c and " " not in x])
    s = [f"Once upon a time, there was {an(trait)} {trait} {c} who lived {rng.choice(PLACES)}.",
         rng.choice(HABITS), rng.choice(EVENTS), rng.choice(MIDDLES), rng.choice(ENDINGS), rng.choice(MORALS),
         "The end."]
    return " ".join(x.format(c=c, o=o) for x in s if x)


def gen_story(rng, split):
    c, trait = pick_split(rng, split, lambda r: (r.choice(CHARS), r.choice(TRAITS)), lambda x: x)
    if split == "eval":
        q = f"Could you tell me a short story about {an(trait)} {trait} {c}?"
    elif rng.random() < 0.3:
        q = rng.choice(STORY_Q).format(c=c).replace(f"a {c}", f"{an(trait)} {trait} {c}")
    else:
        q = rng.choice(STORY_Q).format(c=c).replace(f"a {c}", f"{an(c)} {c}")
        trait = None
    if rng.random() < 0.05 and split == "train":
        q = rng.choice(["Tell me a story.", "Tell me a short story.", "Can you tell me a story?"])
    return "stories", [{"role": "user", "content": q},
                       {"role": "assistant", "content": make_story(rng, c, trait)}], None, [c, "The end."]

# ---------------------------------------------------------------- tools

TOOL_DEFS = {
    "get_weather": {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                       "required": ["city"]}}},
    "calculator": {"type": "function", "function": {
        "name": "calculator", "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "The expression, for example 2 + 2"}},
            "required": ["expression"]}}},
    "get_time": {"type": "function", "function": {
        "name": "get_time", "description": "Get the current local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                       "required": ["city"]}}},
}
CITIES = sorted({cap for _, cap in CAPITALS if "," not in cap} |
                {"New York", "Sydney", "Chicago", "Munich", "Barcelona", "Osaka", "Toronto", "Lyon",
                 "Milan", "Zurich", "Hamburg", "Seattle", "Boston", "Dubai", "Singapore", "Istanbul",
                 "Mumbai", "Shanghai", "Vancouver", "Marseille", "Naples", "Porto", "Kyoto"})
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "partly cloudy", "stormy"]
WEATHER_Q = ["What's the weather in {c}?", "What is the weather like in {c}?", "How is the weather in {c} today?",
             "Is it raining in {c}?", "Weather in {c}?", "Tell me the weather in {c}.", "Do I need an umbrella in {c}?"]
TIME_Q = ["What time is it in {c}?", "What's the time in {c}?", "Tell me the current time in {c}.",
          "What is the local time in {c}?"]
CALC_Q = ["Use the calculator to compute {e}.", "What is {e}? Use the calculator.", "Calculate {e} with the calculator.",
          "Please compute {e}.", "What is {e}?"]


def big_expr(rng):
    op = rng.choice("+-*")
    a, b = rng.randint(100, 9999), rng.randint(10, 999)
    return f"{a} {op} {b}", eval(f"{a} {op} {b}")


# Offered tools vary in name, description and argument name (as real clients' tools do), so the
# model learns to copy the name and argument from the offer instead of memorizing one schema.
# TOOL_DEFS above is each kind's first variant.
TOOL_VARIANTS = {
    "get_weather": (["get_weather", "get_current_weather", "weather", "lookup_weather", "fetch_weather"],
                    ["Get the current weather in a city.", "Get the current weather for a city",
                     "Returns the current weather conditions for a location.", "Look up today's weather.",
                     "Weather lookup by city name.", "Current weather (temperature and conditions)."],
                    ["city", "location", "city_name", "place"]),
    "get_time": (["get_time", "get_current_time", "local_time", "time_in_city"],
                 ["Get the current local time in a city.", "Returns the local time for a location.",
                  "Look up the current time somewhere.", "Current time in a given city"],
                 ["city", "location", "city_name", "place"]),
    "calculator": (["calculator", "calculate", "compute", "eval_math"],
                   ["Evaluate an arithmetic expression.", "Compute the result of a math expression.",
                    "A simple calculator.", "Evaluates math like 2 + 2"],
                   ["expression", "expr", "input", "formula"]),
}
ARG_DESC = ["The city name", "Name of the city", "City, for example Paris", None]
EXPR_DESC = ["The expression, for example 2 + 2", "Arithmetic to evaluate", None]


def tool_variant(rng, kind, split):
    """(tool definition, its name, its argument name): the first of each list is TOOL_DEFS' own."""
    if rng.random() < 0.3:
        d = TOOL_DEFS[kind]["function"]
        return TOOL_DEFS[kind], d["name"], next(iter(d["parameters"]["properties"]))

    def make(r):
        names, descs, args = TOOL_VARIANTS[kind]
        return r.choice(names), r.choice(descs), r.choice(args)
    name, desc, arg = pick_split(rng, split, make, lambda v: ("tool",) + v)
    prop = {"type": "string"}
    pd = rng.choice(EXPR_DESC if kind == "calculator" else ARG_DESC)
    if pd:
        prop["description"] = pd
    props = {arg: prop}
    if kind == "get_weather" and rng.random() < 0.3:
        props["unit"] = {"type": "string", "enum": ["celsius", "fahrenheit"]}
    if rng.random() < 0.5:
        props = dict(reversed(list(props.items())))
    return ({"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": [arg]}}}, name, arg)


def tool_offer(rng, need, split="train"):
    """Tools offered with the one needed (kind `need`, or none): (tools, name, argument name)."""
    kinds = [need] if need else []
    for k in TOOL_DEFS:
        if k not in kinds and rng.random() < 0.5:
            kinds.append(k)
    if not kinds:
        kinds = [rng.choice(list(TOOL_DEFS))]
    rng.shuffle(kinds)
    tools, name, arg = [], None, None
    for k in kinds:
        t, n, a = tool_variant(rng, k, split)
        tools.append(t)
        if k == need:
            name, arg = n, a
    return tools, name, arg


def sysmsg(rng):
    s = rng.choice(SYSTEMS)
    return [{"role": "system", "content": s}] if s else []


def call(name, args):
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": args}}]}


def gen_tools(rng, split):
    ev = split == "eval"
    kind = rng.choices(["weather", "time", "calc", "missing", "notneeded"], weights=[40, 20, 22, 10, 8])[0]
    stage = rng.choice(["call", "answer"]) if not ev else ("call" if rng.random() < 0.5 else "answer")
    msgs = sysmsg(rng)
    if kind in ("weather", "time"):
        city = pick_split(rng, split, lambda r: r.choice(CITIES), lambda c: ("city", c))
        q = (rng.choice(WEATHER_Q) if kind == "weather" else rng.choice(TIME_Q)).format(c=city)
        if ev:
            q = (f"Can you check the weather in {city} for me?" if kind == "weather"
                 else f"Could you tell me the time in {city}?")
        tools, name, arg = tool_offer(rng, "get_weather" if kind == "weather" else "get_time", split)
        msgs += [{"role": "user", "content": q}, call(name, {arg: city})]
        if stage == "call":
            return "tools", msgs, tools, ['<tool_call>\n{"name": "' + name + '", "arguments": {"' + arg + '": "' + city + '"}}']
        if kind == "weather":
            t, cond = rng.randint(-10, 35), rng.choice(CONDITIONS)
            res = {"city": city, "temperature_c": t, "condition": cond}
            a = f"It is {cond} in {city} right now, with a temperature of {t} degrees Celsius."
            if cond in ("rainy", "stormy") and "umbrella" in q:
                a += " Yes, take an umbrella."
            must = [cond, str(t)]
        else:
            hh, mm = rng.randint(0, 23), rng.randint(0, 59)
            res = {"city": city, "time": f"{hh:02d}:{mm:02d}"}
            a = f"It is {hh:02d}:{mm:02d} in {city} right now."
            must = [f"{hh:02d}:{mm:02d}"]
        msgs += [{"role": "tool", "content": json.dumps(res)}, {"role": "assistant", "content": a}]
        return "tools", msgs, tools, must
    if kind == "calc":
        e, v = big_expr(rng)
        q = rng.choice(CALC_Q).format(e=e)
        if ev:
            q = f"Could you work out {e} using the calculator?"
        tools, name, arg = tool_offer(rng, "calculator", split)
        msgs += [{"role": "user", "content": q}, call(name, {arg: e})]
        if stage == "call":
            return "tools", msgs, tools, ['<tool_call>\n{"name": "' + name + '", "arguments": {"' + arg + '": "' + e + '"}}']
        msgs += [{"role": "tool", "content": json.dumps({"result": v})},
                 {"role": "assistant", "content": f"{e} = {v}."}]
        return "tools", msgs, tools, [f"= {v}."]
    if kind == "missing":
        city = rng.choice(CITIES)
        tools = [tool_variant(rng, "calculator", split)[0]] if rng.random() < 0.5 else None
        q = rng.choice(WEATHER_Q).format(c=city)
        msgs += [{"role": "user", "content": q},
                 {"role": "assistant", "content": f"Sorry, I can't check the weather in {city} because no "
                                                  f"weather tool is available to me."}]
        return "tools", msgs, tools, ["Sorry"]
    # tools offered but the question does not need one
    tools = tool_offer(rng, None, split)[0]
    cat, m, _, must = rng.choice([gen_arith, gen_facts, gen_chat])(rng, split)
    return "tools", msgs + m, tools, must

# ---------------------------------------------------------------- multi-turn


def gen_multi(rng, split):
    msgs = sysmsg(rng)
    kind = rng.choices(["name", "chain", "mix", "story"], weights=[30, 30, 25, 15])[0]
    ev = split == "eval"
    if kind == "name":
        name = rng.choice(["Alice", "Bob", "Maria", "Tom", "Lena", "Omar", "Yuki", "Sam", "Emma", "Noah", "Priya",
                           "Lucas", "Sofia", "Ivan", "Chen", "Anna", "David", "Fatima", "Pierre", "Kofi"])
        intro = rng.choice(["Hi, my name is {n}.", "Hello! I'm {n}.", "My name is {n}.", "Hi, I am {n}."]).format(n=name)
        msgs += [{"role": "user", "content": intro},
                 {"role": "assistant", "content": f"Nice to meet you, {name}! How can I help you today?"}]
        for _ in range(rng.randint(0, 2)):
            msgs += rng.choice([gen_arith, gen_facts, gen_dates, gen_units])(rng, "train")[1]
        q = rng.choice(["What is my name?", "What's my name?", "Do you remember my name?", "Who am I?"])
        if ev:
            q = "Can you tell me my name?"
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": f"Your name is {name}."}]
        return "multi-turn", msgs, None, [name]
    if kind == "chain":
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        c = a + b
        msgs += [{"role": "user", "content": rng.choice(ARITH_Q["+"]).format(a=a, b=b)},
                 {"role": "assistant", "content": f"{a} + {b} = {c}."}]
        k = rng.randint(1, 99 - c) if c < 99 else 0
        if rng.random() < 0.6:
            q = rng.choice(["Now add {k} to that.", "And if you add {k}?", "Add {k} to the result.", "Plus {k}?"])
            if ev:
                q = "Now add {k} to the result."
            d = c + k
            msgs += [{"role": "user", "content": q.format(k=k)},
                     {"role": "assistant", "content": f"{c} + {k} = {d}."}]
        else:
            k = rng.randint(0, c)
            q = rng.choice(["Now subtract {k} from that.", "And minus {k}?", "Take away {k}.", "Minus {k}?"])
            if ev:
                q = "Now subtract {k} from the result."
            d = c - k
            msgs += [{"role": "user", "content": q.format(k=k)},
                     {"role": "assistant", "content": f"{c} - {k} = {d}."}]
        return "multi-turn", msgs, None, [f"= {d}."]
    if kind == "story":
        c1 = rng.choice(CHARS)
        c2 = rng.choice([x for x in CHARS if x != c1])
        msgs += [{"role": "user", "content": rng.choice(STORY_Q).format(c=c1).replace(f"a {c1}", f"{an(c1)} {c1}")},
                 {"role": "assistant", "content": make_story(rng, c1)}]
        q = rng.choice(["Now tell me one about {a} {c}.", "Another one, about {a} {c} this time.",
                        "Make it about {a} {c} instead."])
        if ev:
            q = "Can you do one about {a} {c} now?"
        msgs += [{"role": "user", "content": q.format(a=an(c2), c=c2)},
                 {"role": "assistant", "content": make_story(rng, c2)}]
        return "multi-turn", msgs, None, [c2, "The end."]
    last = None
    for _ in range(rng.randint(2, 3)):
        last = rng.choice([gen_arith, gen_facts, gen_dates, gen_units, gen_chat])(rng, split)
        msgs += last[1]
    return "multi-turn", msgs, None, last[3]


# COPY_WEIGHT (environment, default 10): the copy-and-edit share, raised for a continuation that
# teaches copying while the other categories keep their relative mix
GENERATORS = [(gen_arith, 24), (gen_units, 9), (gen_dates, 11), (gen_facts, 12), (gen_chat, 7),
              (gen_story, 9), (gen_tools, 16), (gen_multi, 12),
              (gen_copy, float(os.environ.get("COPY_WEIGHT", "10")))]


def sample(rng, split="train"):
    g = rng.choices([g for g, _ in GENERATORS], weights=[w for _, w in GENERATORS])[0]
    cat, msgs, tools, expect = g(rng, split)
    if g not in (gen_tools, gen_multi) and rng.random() < 0.35:
        msgs = sysmsg(rng) + msgs
    return cat, msgs, tools, expect


if __name__ == "__main__":
    rng = random.Random(1)
    for _ in range(12):
        cat, msgs, tools, expect = sample(rng)
        print("=====", cat, expect)
        print(render(msgs, tools))
