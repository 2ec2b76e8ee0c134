"""Training prompts for the distilled drafters, made on the spot: no hub, no download.

Every domain's prompts come from templates filled with random names, numbers and topics (and,
for code, snippets of Python's own standard library), so any fresh machine rebuilds the same set
from a seed. The target then answers them (on-policy distillation, see metasd/training/train.py).
None of these prompts is a Spec-Bench prompt: `drop_benchmark_prompts` removes any exact match.
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from collections.abc import Callable
from pathlib import Path

from metasd.training.code_tasks import code_task
from metasd.training.word_problems import word_problem

NAMES = ["Ava", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jamal", "Kai", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara", "Umar", "Vera", "Wen", "Yusuf", "Zoe"]
ITEMS = ["apples", "marbles", "stickers", "books", "cookies", "pencils", "stamps", "shells", "cards", "cupcakes",
         "oranges", "balloons", "toy cars", "eggs", "flowers", "coins"]
PLACES = ["the market", "school", "the bakery", "the library", "the park", "the farm", "the toy store", "the fair"]
TOPICS = ["volcanoes", "the water cycle", "black holes", "photosynthesis", "the Roman Empire", "honeybees",
          "electric cars", "the human heart", "coral reefs", "the printing press", "rainforests", "glaciers",
          "vaccines", "solar panels", "the Silk Road", "octopuses", "jazz music", "the Moon landing",
          "recycling", "sleep", "chess", "the stock market", "earthquakes", "bread baking", "meditation",
          "the Olympic Games", "penguins", "cloud computing", "renewable energy", "ancient Egypt"]
ACTIVITIES = ["learning a new language", "running a first marathon", "starting a vegetable garden", "saving money",
              "working from home", "preparing for a job interview", "traveling on a budget", "studying for exams",
              "cooking healthy meals", "getting better sleep", "public speaking", "learning to draw",
              "adopting a dog", "moving to a new city", "reducing screen time", "making new friends"]
PEOPLE = ["a colleague", "a landlord", "a teacher", "a customer", "a neighbour", "a team manager", "a friend"]
FORMS = ["a short poem", "a haiku", "a limerick", "a short story", "a product description", "a tweet",
         "a diary entry", "a motivational speech", "a dialogue between two friends", "a news headline and lead"]
AUDIENCES = ["a five-year-old", "a high-school student", "a busy executive", "a grandparent", "a beginner"]

CODE_TASKS = [
    "returns the {k}-th largest number in a list", "checks whether a string is a palindrome",
    "counts the vowels in a string", "merges two sorted lists into one sorted list",
    "removes duplicates from a list while keeping the order", "computes the greatest common divisor of two integers",
    "converts a temperature from Celsius to Fahrenheit", "returns the first {k} prime numbers",
    "flattens a nested list", "reverses the words in a sentence", "computes the factorial of n iteratively",
    "finds the most frequent word in a text", "checks whether two strings are anagrams",
    "returns the n-th Fibonacci number using memoization", "groups a list of words by their first letter",
    "parses a CSV line into a list of fields", "computes the running average of a list of numbers",
    "validates an email address with a regular expression", "rotates a list by {k} positions",
    "returns the transpose of a matrix", "counts how many times each character appears in a string",
    "implements binary search on a sorted list", "sorts a list of dictionaries by the key '{key}'",
    "chunks a list into pieces of size {k}", "reads a text file and returns its number of lines",
    "converts a Roman numeral to an integer", "checks whether a number is a perfect square",
    "returns the sum of the digits of an integer", "implements a stack class with push, pop and peek",
    "implements a queue using two stacks", "computes the dot product of two vectors",
    "finds the longest common prefix of a list of strings", "returns all subsets of a list",
    "implements bubble sort", "converts a decimal number to binary", "capitalizes every word in a string",
]
CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C++", "Java", "Go", "Rust"]
CODE_TEMPLATES = [
    "Write a {lang} function that {task}.",
    "Implement a function in {lang} that {task}. Include a short example.",
    "Can you write {lang} code that {task}?",
    "Write a {lang} function named `{fname}` that {task}, with a docstring and comments.",
    "Show me how to write a {lang} function that {task}, and explain its time complexity.",
]
SNIPPET_TEMPLATES = [
    "Explain what the following Python code does:\n\n```python\n{code}\n```",
    "Add comments to this Python code:\n\n```python\n{code}\n```",
    "Rewrite this Python code to make it more readable:\n\n```python\n{code}\n```",
    "Is there a bug in this Python code? Explain.\n\n```python\n{code}\n```",
    "Write a unit test for this Python function:\n\n```python\n{code}\n```",
]

QA_TEMPLATES = [
    "Explain {topic} to {audience}.", "What are the most important facts about {topic}?",
    "Write {form} about {topic}.", "Give me five tips for {activity}.",
    "What are the pros and cons of {activity}?", "Write a polite email to {person} about {activity}.",
    "Why is {topic} important? Answer in a few sentences.", "Compare {topic} and {topic2}.",
    "Describe a typical day for someone who is {activity}.", "What is the history of {topic}?",
    "Write {form} for {audience} about {activity}.", "How can I get started with {activity}?",
    "Answer briefly: what is {topic}?", "Give three interesting questions someone might ask about {topic}, "
    "and answer them.", "Summarize the main ideas behind {topic} in a short paragraph.",
    "Pretend you are a tour guide and describe {topic}.", "Write a short blog post about {activity}.",
]


def _fill(rng: random.Random, template: str) -> str:
    t1, t2 = rng.sample(TOPICS, 2)
    return template.format(topic=t1, topic2=t2, audience=rng.choice(AUDIENCES), form=rng.choice(FORMS),
                           activity=rng.choice(ACTIVITIES), person=rng.choice(PEOPLE))


def stdlib_files() -> list[Path]:
    """Python's standard-library sources: code text that every Python installation has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip", "pydoc_data")
    files = [p for p in sorted(root.rglob("*.py")) if not any(part in skip for part in p.relative_to(root).parts)]
    return files


_DEF = re.compile(r"^(def |class )", re.M)


def stdlib_snippets(rng: random.Random, n: int, max_lines: int = 24) -> list[str]:
    """Top-level functions from the standard library, cut to at most max_lines lines."""
    files = stdlib_files()
    out: list[str] = []
    tries = 0
    while len(out) < n and tries < 50 * n and files:
        tries += 1
        try:
            text = rng.choice(files).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        starts = [m.start() for m in _DEF.finditer(text)]
        if not starts:
            continue
        i = rng.randrange(len(starts))
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        lines = text[starts[i] : end].rstrip().splitlines()[:max_lines]
        if len(lines) >= 4:
            out.append("\n".join(lines))
    return out


def stdlib_chunks(rng: random.Random, n: int, chars: int = 1200) -> list[str]:
    """Raw stretches of standard-library source (no chat template): the code domain's plain text."""
    files = stdlib_files()
    out: list[str] = []
    while len(out) < n and files:
        try:
            text = rng.choice(files).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if len(text) < chars:
            continue
        start = rng.randrange(len(text) - chars + 1)
        start = text.find("\n", start) + 1 or start
        out.append(text[start : start + chars])
    return out


CODE_PROMPTS_VERSION = 2  # 1: one small function or a stdlib snippet; 2: two in three composed tasks (code_tasks.py)


def code_prompts(rng: random.Random, n: int) -> list[str]:
    snippets = stdlib_snippets(rng, n // 6)
    out = [rng.choice(SNIPPET_TEMPLATES).format(code=s) for s in snippets]
    out += [code_task(rng) for _ in range(n - len(out) - n // 6)]
    while len(out) < n:
        task = rng.choice(CODE_TASKS).format(k=rng.randint(2, 9), key=rng.choice(["age", "name", "price", "score"]))
        fname = f"{rng.choice(['get', 'find', 'compute', 'make', 'check'])}_{rng.choice(['items', 'value', 'total', 'words'])}"
        out.append(rng.choice(CODE_TEMPLATES).format(lang=rng.choice(CODE_LANGS), task=task, fname=fname))
    rng.shuffle(out)
    return out


def _word_problem(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 40), rng.randint(2, 12)
    n1, n2 = rng.sample(NAMES, 2)
    item, place = rng.choice(ITEMS), rng.choice(PLACES)
    price = rng.choice([0.5, 0.75, 1.25, 2, 3, 4.5, 5, 8, 12])
    pct = rng.choice([10, 15, 20, 25, 30, 40, 50])
    kind = rng.randrange(12)
    if kind == 0:
        return f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} gives away {c}. How many {item} does {n1} have now?"
    if kind == 1:
        return f"{n1} buys {c} {item} at {place} for ${price} each. How much does {n1} spend in total?"
    if kind == 2:
        return f"A shop sells {item} for ${a} each. During a sale the price drops by {pct}%. What is the sale price?"
    if kind == 3:
        return f"{n1} reads {c} pages every day. How many days does it take to finish a book of {a * c + b} pages?"
    if kind == 4:
        return (f"A train travels at {a + 30} km per hour for {c} hours, then at {b + 20} km per hour for "
                f"{rng.randint(1, 5)} hours. How far does it travel in total?")
    if kind == 5:
        return f"{n1} is {c} years older than {n2}. Together their ages add up to {2 * a + c}. How old is each of them?"
    if kind == 6:
        return (f"There are {a + b} students in a class. {pct}% of them walk to school and the rest take the bus. "
                f"How many students take the bus?")
    if kind == 7:
        return f"Solve for x: {c}x + {a} = {c * b + a}. Show your steps."
    if kind == 8:
        return f"A rectangle is {a} cm long and {b} cm wide. What are its area and its perimeter?"
    if kind == 9:
        return (f"{n1} saves ${c} each week. {n2} already has ${a} and saves ${max(1, c - 2)} each week. "
                f"After how many weeks will they have saved the same amount, if {n1} starts with ${a + b}?")
    if kind == 10:
        return (f"A recipe needs {c} cups of flour for {b} cookies. How many cups of flour are needed for "
                f"{b * rng.randint(2, 5)} cookies?")
    return f"What is {a * c} divided by {c}, plus {b} times {rng.randint(2, 9)}? Explain step by step."


MATH_PROMPTS_VERSION = 2  # 1: the twelve one-step templates alone; 2: three in four composed multi-step problems


def math_prompts(rng: random.Random, n: int) -> list[str]:
    suffixes = ["", "", " Explain your reasoning step by step.", " Show your work.", " Think step by step."]
    return [(word_problem(rng) if rng.random() < 0.75 else _word_problem(rng)) + rng.choice(suffixes)
            for _ in range(n)]


def chat_prompts(rng: random.Random, n: int) -> list[str]:
    return [_fill(rng, rng.choice(QA_TEMPLATES)) for _ in range(n)]


DOMAINS: dict[str, Callable[[random.Random, int], list[str]]] = {
    "code": code_prompts, "math": math_prompts, "chat": chat_prompts,
}
SPECBENCH = Path("/work/shared/specbench/question.jsonl")


def benchmark_prompts(path: Path = SPECBENCH) -> set[str]:
    """Every turn of the benchmark's questions, where the file exists (it is never copied here)."""
    if not path.exists():
        return set()
    out: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for line in f:
            out.update(t.strip() for t in json.loads(line).get("turns", []))
    return out


def drop_benchmark_prompts(prompts: list[str], path: Path = SPECBENCH) -> list[str]:
    bench = benchmark_prompts(path)
    return [p for p in prompts if p.strip() not in bench]


def domain_prompts(domain: str, n: int, seed: int = 0) -> list[str]:
    """n distinct prompts of one domain, reproducible from the seed, none of them a benchmark prompt."""
    rng = random.Random(f"{domain}:{seed}")
    seen: dict[str, None] = {}
    for _ in range(20):
        for p in DOMAINS[domain](rng, n):
            seen.setdefault(p, None)
        if len(seen) >= n:
            break
    return drop_benchmark_prompts(list(seen))[:n]
