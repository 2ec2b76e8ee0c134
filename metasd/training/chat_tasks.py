"""Composed chat prompts for the chat domain's training data (prompts versions 2 and 3).

Version 1 filled seventeen one-line templates ("Explain {topic} to {audience}.") and five role-play lines.
A head trained on their answers agreed with the target 0.51 of the time on the corpus's own held-out answers
but 0.31-0.37 on Spec-Bench's writing, role-play, humanities and QA prompts: those ask for other things. A
writing prompt names a form, a subject with its particulars and what to stress ("a blog post about a trip,
highlighting the food and two sights"); a role-play prompt sets a persona with rules of speech and then asks
it something; a humanities or science prompt asks to discuss, compare or explain a concept with its parts;
an extraction prompt hands over a short text or list and asks for a format; a QA prompt is one short factual
question. Here each kind is composed from parts of those shapes, every part with several wordings, so the
answers cover what the target writes for such requests. Nothing is copied from a dataset; the held-out check
of metasd/training/corpus.py drops any prompt that shares 8 words with a benchmark prompt or page example.

Version 3 adds a sixth kind, `everyday`: why something in daily life happens, how a familiar thing works, the
difference between two things people mix up, and practical advice asked in the first person ("I keep ...; any
tips?"). The page's qa and chat examples are of those shapes and version 2's pieces did not move them.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from metasd.training.train_data import NAMES

# 1: train_data's one-line templates and corpus.ROLEPLAY; 2: three in four composed here; 3: plus `everyday`
CHAT_PROMPTS_VERSION = 3

# ---------------------------------------------------------------------------------------------- writing

# (the form, the verbs that ask for it, the kinds of subject it suits)
FORMS = [
    ("a travel blog post", ["Compose", "Write"], "trip"), ("a professional email", ["Draft", "Write"], "event issue"),
    ("a persuasive email", ["Write", "Draft"], "event product"), ("a cover letter", ["Write", "Draft"], "job"),
    ("a short speech", ["Write", "Prepare"], "event person"),
    ("the opening paragraph of a short story", ["Write", "Craft"], "trip event"),
    ("a product description", ["Write", "Create"], "product"), ("a press release", ["Draft", "Write"], "event product"),
    ("a newsletter article", ["Write", "Compose"], "event person"),
    ("a letter of complaint", ["Write", "Draft"], "issue"), ("a letter of recommendation", ["Write", "Draft"], "person"),
    ("a social media post", ["Write", "Create"], "trip event product"), ("a short poem", ["Write", "Compose"], "trip person"),
    ("a review", ["Write", "Compose"], "product trip"), ("an outline for a blog post", ["Develop", "Create"], "trip product"),
    ("a script for a short video", ["Write", "Draft"], "product event"), ("a thank-you note", ["Write", "Draft"], "person"),
    ("a podcast episode introduction", ["Write", "Draft"], "trip event"),
    ("an advertisement", ["Write", "Create"], "product"),
]
# (a subject, its kind, particulars the text may be asked to stress)
SUBJECTS = [
    ("a week-long trip to Portugal", "trip", ["the food", "the old towns", "the coast", "the people you met"]),
    ("a weekend hiking in the Alps", "trip", ["the views", "the mountain huts", "the weather", "the gear you needed"]),
    ("a first visit to a night market in Taipei", "trip", ["the street food", "the crowds", "the games", "the lights"]),
    ("a train journey across Canada", "trip", ["the scenery", "the sleeping cars", "the other passengers"]),
    ("a summer road trip along the coast of Croatia", "trip", ["the islands", "the ferries", "the seafood"]),
    ("the opening of a new neighbourhood library", "event", ["the children's corner", "the opening hours",
                                                             "the events", "the volunteers"]),
    ("a charity run for a children's hospital", "event", ["the route", "the fundraising goal", "how to sign up"]),
    ("a jazz festival by the sea", "event", ["the line-up", "the venue", "the food stalls", "the late-night sessions"]),
    ("a science fair at a secondary school", "event", ["the winning project", "the judges", "the students' effort"]),
    ("a company's move to a four-day work week", "event", ["productivity", "staff well-being", "customer service",
                                                           "the trial period"]),
    ("a museum's new exhibition on ancient maps", "event", ["the oldest map", "the audio guide", "the opening times"]),
    ("a community garden project", "event", ["the volunteers", "the harvest", "the funding", "the next season"]),
    ("a new reusable water bottle", "product", ["its insulation", "its price", "its design", "its materials"]),
    ("a new electric scooter", "product", ["its range", "its safety features", "its folding frame", "its price"]),
    ("a mobile app that helps people learn to cook", "product", ["its recipes", "its videos", "its shopping lists",
                                                                 "its price"]),
    ("an online course on personal finance", "product", ["budgeting", "saving", "investing basics", "its price"]),
    ("a pair of noise-cancelling headphones", "product", ["the sound", "the battery life", "the comfort", "the price"]),
    ("a delayed delivery of office furniture", "issue", ["the order date", "the missed deadline", "a refund",
                                                         "next steps"]),
    ("a broken heating system in a rented flat", "issue", ["how long it has been broken", "the cold", "a deadline"]),
    ("a software update that removed a popular feature", "issue", ["what changed", "why it matters", "a fix"]),
    ("a colleague who is retiring after thirty years", "person", ["their mentoring", "a funny memory",
                                                                  "their projects"]),
    ("a former student who is applying to university", "person", ["their curiosity", "their grades",
                                                                  "a project they led"]),
    ("a volunteer who ran the town's food bank", "person", ["their energy", "the families helped", "the long hours"]),
    ("a junior data analyst position at a logistics company", "job", ["your skills", "a project you led",
                                                                      "why the company appeals to you"]),
    ("a teaching assistant post at a primary school", "job", ["your experience with children", "your patience",
                                                              "a lesson you planned"]),
]
READERS = ["your manager", "your team", "a hiring manager", "a customer", "your neighbours", "a close friend",
           "the readers of a local newspaper", "new employees", "parents of the pupils", "the city council"]
STYLES = ["", "", "", " Keep it under 200 words.", " Use a warm, friendly tone.", " Keep the tone formal.",
          " Include a clear call to action.", " Use vivid descriptions.", " Make it concise and easy to read.",
          " Give it a catchy title.", " Use headings and bullet points where they help.",
          " End with a question that invites replies."]


def _stress(rng: random.Random, parts: list[str]) -> str:
    a, b = rng.sample(parts, 2)
    return rng.choice([f", highlighting {a} and {b}", f". Mention {a} and {b}", f", focusing on {a}",
                       f" that covers {a}, {b} and anything else worth knowing", ""])


def writing(rng: random.Random) -> str:
    """A piece of writing: a form, a subject with particulars to stress, sometimes a reader and a style."""
    form, verbs, kinds = rng.choice(FORMS)
    subject, _, parts = rng.choice([sub for sub in SUBJECTS if sub[1] in kinds.split()])
    about = "announcing" if form in ("a press release", "a social media post") and rng.random() < 0.5 else "about"
    reader = f" to {rng.choice(READERS)}" if "email" in form or "complaint" in form else ""
    text = f"{rng.choice(verbs)} {form}{reader} {about} {subject}{_stress(rng, parts)}.{rng.choice(STYLES)}"
    if rng.random() < 0.15:  # a follow-up rewrite, as a second turn would ask
        text += rng.choice([" Then rewrite your first sentence in three different ways.",
                            " Afterwards, summarise it in one sentence.",
                            " Then suggest three possible titles."])
    return text


# ---------------------------------------------------------------------------------------------- role-play

# (a persona, a question it may be asked)
PERSONAS = [
    ("a grumpy pirate captain", ["What is the best way to find buried treasure?", "Why should anyone join your crew?"]),
    ("a Victorian-era detective", ["How do you solve a case nobody else can?", "What do you notice about me?"]),
    ("a wise old wizard", ["How should a young apprentice begin to study magic?", "What is the price of power?"]),
    ("a cheerful kindergarten teacher", ["How do you calm a room of upset children?",
                                         "What makes a good day at school?"]),
    ("a seasoned chef in a busy restaurant", ["How do you run a kitchen on a Saturday night?",
                                              "What dish would you cook for a food critic?"]),
    ("an astronaut on the space station", ["What does a normal day in orbit look like?",
                                           "What do you miss most about Earth?"]),
    ("a medieval blacksmith", ["How do you make a good sword?", "What worries you about the coming winter?"]),
    ("a stand-up comedian", ["What is funny about airports?", "How do you handle a silent audience?"]),
    ("a marathon coach", ["How should I train for my first marathon?", "What do I eat the night before a race?"]),
    ("a startup founder pitching to investors", ["Why will your product succeed?", "How will you spend the money?"]),
    ("a park ranger in a national park", ["What should hikers know before they set off?",
                                          "What is the most dangerous animal here?"]),
    ("a time traveller from the year 2300", ["What surprised you most about our time?",
                                             "What should we stop doing right now?"]),
    ("a museum curator", ["Which object in your collection has the best story?", "How do you decide what to show?"]),
    ("a ship's navigator in the age of sail", ["How do you find your way without a map?",
                                               "What happens in a storm at sea?"]),
    ("a personal stylist", ["What should I wear to a job interview?", "How do I build a small wardrobe?"]),
    ("a retired football manager", ["What makes a winning team?", "What was the hardest decision of your career?"]),
]
# (a profession, a consultation it is given)
CONSULTS = [
    ("a relationship coach", "two flatmates who argue about cleaning and noise"),
    ("a financial adviser", "a young couple who want to buy their first home in five years"),
    ("a nutritionist", "an office worker who skips breakfast and snacks late at night"),
    ("an interior designer", "a small studio flat that feels dark and cramped"),
    ("a career counsellor", "a teacher who wants to move into software development"),
    ("a travel agent", "a family of four with a small budget and ten days in August"),
    ("a veterinarian", "a dog that has stopped eating and sleeps all day"),
    ("a fitness trainer", "a beginner who can only exercise for twenty minutes a day"),
    ("an IT support technician", "a laptop that has become very slow after an update"),
    ("a gardener", "a shady backyard where nothing seems to grow"),
    ("a language tutor", "an adult learner who forgets new words within a week"),
    ("a mediator", "two neighbours in a dispute over a tree on the boundary"),
]
PERSONA_OPENERS = [
    "Pretend to be {p} for the rest of this conversation and speak exactly as they would. {q}",
    "Take on the role of {p}. Stay in character and do not mention that you are an AI. {q}",
    "Imagine you are {p}. Answer in the first person, in their voice. {q}",
    "You are {p}. Don't start your answer with phrases like \"As {p}\". {q}",
    "Let's play a game: you are {p} and I am a curious visitor. {q}",
]
CONSULT_OPENERS = [
    "Please act as {p}. I will describe a situation and you will give practical advice. The situation: {c}.",
    "Take on the role of {p}. Here is the case: {c}. What do you suggest, step by step?",
    "Imagine you are {p} advising a client about {c}. Give your recommendations and explain why.",
]


def roleplay(rng: random.Random) -> str:
    """A persona with rules of speech and a question, or a professional asked for advice on a case."""
    if rng.random() < 0.6:
        p, qs = rng.choice(PERSONAS)
        return rng.choice(PERSONA_OPENERS).format(p=p, q=rng.choice(qs))
    p, c = rng.choice(CONSULTS)
    return rng.choice(CONSULT_OPENERS).format(p=p, c=c)


# ---------------------------------------------------------------------------------------------- open questions

# (a concept, its parts, a neighbour to compare it with, a field it bears on)
CONCEPTS = [
    ("inflation", ["interest rates", "wages", "savings"], "deflation", "household budgets"),
    ("the separation of powers", ["the legislature", "the executive", "the courts"], "parliamentary sovereignty",
     "modern democracies"),
    ("natural selection", ["variation", "inheritance", "competition"], "genetic drift", "the evolution of species"),
    ("supply and demand", ["prices", "shortages", "surpluses"], "price controls", "housing markets"),
    ("the Industrial Revolution", ["steam power", "factories", "cities"], "the digital revolution",
     "working life"),
    ("plate tectonics", ["earthquakes", "volcanoes", "mountain building"], "continental drift", "the shape of the continents"),
    ("the placebo effect", ["expectation", "clinical trials", "ethics"], "the nocebo effect", "medical research"),
    ("globalisation", ["trade", "migration", "culture"], "protectionism", "developing economies"),
    ("the greenhouse effect", ["carbon dioxide", "methane", "feedback loops"], "the ozone hole", "global climate"),
    ("cognitive dissonance", ["beliefs", "behaviour", "justification"], "confirmation bias", "decision making"),
    ("the Renaissance", ["art", "science", "patronage"], "the Enlightenment", "European culture"),
    ("machine learning", ["data", "models", "evaluation"], "traditional programming", "everyday technology"),
    ("the water cycle", ["evaporation", "condensation", "precipitation"], "the carbon cycle", "farming"),
    ("utilitarianism", ["consequences", "happiness", "fairness"], "virtue ethics", "public policy"),
    ("vaccination", ["the immune system", "herd immunity", "side effects"], "natural infection", "public health"),
    ("urbanisation", ["housing", "transport", "jobs"], "suburban sprawl", "quality of life"),
    ("the French Revolution", ["its causes", "the Terror", "its legacy"], "the American Revolution",
     "the idea of citizenship"),
    ("opportunity cost", ["choices", "scarcity", "trade-offs"], "sunk cost", "personal decisions"),
    ("photosynthesis", ["light", "chlorophyll", "glucose"], "cellular respiration", "food chains"),
    ("social media", ["attention", "news", "friendship"], "traditional media", "teenagers' lives"),
]
QUESTION_SHAPES = [
    "Discuss {c} and its impact on {f}.", "Explain {c}, including {a}, {b} and {d}.",
    "What is {c}? How does it relate to {n}?", "Compare {c} and {n}. Give examples of each.",
    "Provide insights into how {c} shapes {f}.", "How would you explain {c} to a curious teenager?",
    "What are the main arguments for and against {c}?", "Outline the key ideas behind {c} and why they matter.",
    "Describe the relationship between {a} and {b} in {c}.", "What role does {a} play in {c}?",
    "Create a lesson plan on {c} for a class of 14-year-olds. Duration: two lessons of 45 minutes.",
    "Write a short essay on {c} and its effects on {f}.",
]


def open_question(rng: random.Random) -> str:
    """A humanities or science question that asks to discuss, compare or explain a concept with its parts."""
    c, parts, n, f = rng.choice(CONCEPTS)
    a, b, d = rng.sample(parts, 3)
    q = rng.choice(QUESTION_SHAPES).format(c=c, a=a, b=b, d=d, n=n, f=f)
    return q + rng.choice(["", "", "", " Use concrete examples.", " Keep it under 300 words.",
                           " Structure your answer with headings."])


# ---------------------------------------------------------------------------------------------- extraction

CITIES = ["Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Dublin", "Krakow", "Montreal", "Hanoi", "Seville"]
PRODUCTS = ["headphones", "a coffee machine", "a backpack", "a desk lamp", "running shoes", "a phone case"]
PRAISE = ["works perfectly", "exceeded my expectations", "is great value", "arrived quickly", "looks beautiful"]
COMPLAINTS = ["broke after a week", "is smaller than described", "arrived late", "is far too loud",
              "stopped charging", "came without instructions"]


def _review(rng: random.Random) -> str:
    item = rng.choice(PRODUCTS)
    good, bad = rng.choice(PRAISE), rng.choice(COMPLAINTS)
    return rng.choice([f"I bought {item} last month and it {good}.", f"The {item.split()[-1]} {bad}. Disappointing.",
                       f"It {good}, although it {bad}.", f"Honestly, it {bad}, but support replaced it fast."])


def extraction(rng: random.Random) -> str:
    """A short text or list of our own, with a request to extract, classify or reformat it."""
    kind = rng.randrange(3)
    if kind == 0:
        reviews = " ".join(f"{i + 1}. {_review(rng)}" for i in range(rng.randint(3, 4)))
        return ("Rate each of the following product reviews from 1 (very negative) to 5 (very positive) and "
                f"return the scores as a JSON list: {reviews}")
    if kind == 1:
        people = rng.sample(NAMES, 3)
        rows = "; ".join(f"{p} moved to {rng.choice(CITIES)} in {rng.randint(1990, 2023)} to work as "
                         f"{rng.choice(['a nurse', 'an engineer', 'a chef', 'a teacher', 'a designer'])}"
                         for p in people)
        return (f"Extract each person's name, city, year and job from this text and present them as a table: "
                f"{rows}.")
    firms = [(f"Company {chr(65 + i)}", ceo, rng.randint(30, 90), rng.randint(1, 25))
             for i, ceo in enumerate(rng.sample(NAMES, 3))]
    text = "; ".join(f"{f}, led by {ceo}, had revenue of ${r} million and profit of ${p} million" for f, ceo, r, p in firms)
    return (f"Given the following data, which company had the highest profit margin, and who leads it? {text}. "
            "Show how you compared them.")


# ---------------------------------------------------------------------------------------------- short questions

# (a question shape, what fills it): one short factual question, as in Spec-Bench's qa
FACTS = [
    ("Who wrote {x}?", ["Pride and Prejudice", "The Odyssey", "Don Quixote", "Frankenstein", "The Hobbit",
                        "War and Peace", "Hamlet", "The Little Prince"]),
    ("When was {x} built?", ["the Eiffel Tower", "the Colosseum", "the Great Wall of China", "the Golden Gate Bridge",
                             "the Taj Mahal", "the Panama Canal"]),
    ("Where is {x} located?", ["Machu Picchu", "Angkor Wat", "the Sahara Desert", "Mount Kilimanjaro",
                               "the Great Barrier Reef", "Petra", "Lake Baikal"]),
    ("Who invented {x}?", ["the telephone", "the light bulb", "the printing press", "the World Wide Web",
                           "the steam engine", "the radio"]),
    ("What is the capital of {x}?", ["Australia", "Canada", "Brazil", "Kenya", "Norway", "Vietnam", "Chile"]),
    ("How many {x}?", ["planets are there in the solar system", "bones are in the human body",
                       "keys does a piano have", "players are on a rugby union team", "strings does a violin have"]),
    ("Who painted {x}?", ["the Mona Lisa", "The Starry Night", "Guernica", "The Persistence of Memory",
                          "The Birth of Venus"]),
    ("What does {x} stand for?", ["NASA", "DNA", "UNESCO", "HTML", "GPS", "FIFA"]),
    ("Which {x}?", ["planet is known as the Red Planet", "ocean is the largest", "metal is liquid at room temperature",
                    "country has the most people", "animal is the fastest on land"]),
    ("When did {x}?", ["the first person walk on the Moon", "the Berlin Wall fall", "the Titanic sink",
                       "the First World War end"]),
]


def short_question(rng: random.Random) -> str:
    """One short factual question, written as people type them (often without a capital or a mark)."""
    shape, xs = rng.choice(FACTS)
    q = shape.format(x=rng.choice(xs))
    r = rng.random()
    if r < 0.25:
        q = q[0].lower() + q[1:-1]
    elif r < 0.35:
        q = f"Quick question: {q[0].lower()}{q[1:]}"
    return q


# ---------------------------------------------------------------------------------------------- everyday

# Why something familiar happens (every shape of this kind may end with one of LEVELS)
WHYS = ["do onions make people cry", "does bread go stale", "do cats purr", "does ice float on water",
        "do we get goosebumps", "does the sea taste salty", "do leaves change colour in autumn",
        "does coffee keep people awake", "do we yawn", "does metal feel colder than wood at the same temperature",
        "do our fingers wrinkle in the bath", "does thunder follow lightning", "do planes leave white trails",
        "does a spoon in a glass of water look bent", "do we dream", "does popcorn pop",
        "do some people get seasick", "does the Moon change shape during the month", "do bubbles look rainbow-coloured",
        "does hot water sometimes freeze faster than cold water"]
# How a familiar thing works
WORKS = ["a microwave oven", "a refrigerator", "noise-cancelling headphones", "a credit card payment",
         "a smoke detector", "a heat pump", "a touch screen", "a vaccine", "an electric car battery", "GPS navigation",
         "a compass", "a dishwasher", "wireless charging", "a solar panel", "a thermostat", "a rainbow"]
# Two things people mix up
PAIRS = [("weather", "climate"), ("a cold", "the flu"), ("baking soda", "baking powder"), ("a crocodile", "an alligator"),
         ("RAM", "storage"), ("a debit card", "a credit card"), ("an asteroid", "a comet"), ("speed", "velocity"),
         ("a latte", "a cappuccino"), ("a turtle", "a tortoise"), ("an allergy", "an intolerance"),
         ("a hurricane", "a tornado"), ("a lake", "a pond"), ("interest", "dividends"), ("a psychologist", "a psychiatrist"),
         ("a fruit", "a vegetable"), ("a simile", "a metaphor"), ("Wi-Fi", "mobile data")]
# First-person situations asking for advice, each with what to ask for
ADVICE = [("I struggle to fall asleep at night", "tips"), ("I want to start running but I get out of breath quickly",
           "a simple plan"), ("my houseplants keep dying", "advice"), ("I spend too much money on takeaway food",
           "ideas"), ("I have a job interview next week and I get nervous", "tips"),
          ("I want to learn Spanish in my free time", "a plan"), ("my desk is always cluttered", "suggestions"),
          ("I sit at a computer all day and my back hurts", "tips"), ("I want to read more books this year", "ideas"),
          ("I find it hard to wake up early", "tips"), ("I'm hosting a birthday party for a ten-year-old", "ideas"),
          ("I keep losing my keys", "simple tricks"), ("I want to eat more vegetables", "easy ideas"),
          ("I'm moving to a new city where I don't know anyone", "advice"),
          ("my phone battery runs out before the evening", "tips"), ("I want to save for a holiday", "a simple plan"),
          ("I get distracted when I work from home", "suggestions"), ("I have a long flight coming up", "tips"),
          ("I'd like to cook more at home but I'm a beginner", "ideas"), ("my kids spend too long on screens", "advice")]
ASKS = [("Can you suggest {n} {x}?", ["easy breakfasts I can make in five minutes", "cheap weekend activities for a family",
                                       "healthy snacks for work", "ways to relax after a stressful day",
                                       "board games for four adults", "gifts for a friend who loves gardening",
                                       "houseplants that are hard to kill", "habits that help with focus"]),
        ("What are {n} {x}?", ["good ways to keep a conversation going", "things to pack for a weekend of hiking",
                               "simple ways to use less plastic at home", "signs that a car needs servicing",
                               "questions to ask when renting a flat", "quick exercises I can do at my desk"])]
REPLIES = ["Any {w}?", "Do you have any {w}?", "What would you suggest?", "Can you give me some {w}?",
           "Could you help with some {w}?"]
LEVELS = ["", "", "", " Answer briefly.", " Keep it short.", " Explain it simply.", " Explain it like I'm ten.",
          " Give a short answer, then the details."]


def everyday(rng: random.Random) -> str:
    """An everyday explanation or piece of advice, as a chat user types it (version 3's kind)."""
    kind = rng.randrange(5)
    if kind == 0:
        q = f"Why {rng.choice(WHYS)}?"
    elif kind == 1:
        q = rng.choice(["How does {x} work?", "Can you explain how {x} works?", "What actually happens inside {x}?"])
        q = q.format(x=rng.choice(WORKS))
    elif kind == 2:
        a, b = rng.choice(PAIRS)
        a, b = (a, b) if rng.random() < 0.5 else (b, a)
        q = rng.choice(["What is the difference between {a} and {b}?", "How can I tell {a} from {b}?",
                        "Is {a} the same as {b}?"]).format(a=a, b=b)
    elif kind == 3:
        situation, want = rng.choice(ADVICE)
        q = f"{situation[0].upper()}{situation[1:]}. " + rng.choice(REPLIES).format(w=want)
        q = rng.choice(["", "", "Hi! ", "Hello, ", "Quick one: "]) + q
    else:
        shape, xs = rng.choice(ASKS)
        q = rng.choice(["", "", "Hi! "]) + shape.format(n=rng.choice(["three", "five", "a few", "some"]),
                                                       x=rng.choice(xs))
    return q + rng.choice(LEVELS)


KINDS: list[Callable[[random.Random], str]] = [writing, roleplay, open_question, extraction, short_question, everyday]
WEIGHTS = [4, 3, 4, 1, 2, 4]


def chat_task(rng: random.Random) -> str:
    """One composed chat prompt, of a kind drawn by WEIGHTS."""
    return rng.choices(KINDS, weights=WEIGHTS)[0](rng)
