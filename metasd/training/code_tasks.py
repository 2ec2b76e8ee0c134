"""Composed programming tasks for the code domain's training prompts (prompts version 2).

The first code prompts asked for one small function from a list of forty, or for an explanation of a
stretch of standard-library source. Spec-Bench's coding prompts are of other shapes: whole programs that
read, process and report; named algorithms and data structures with a complexity to meet; code to review
for a bug; a small web page. A head trained on the single-function prompts agreed with the target 0.66 of
the time held out but 0.48 on those prompts. Here a task is composed from parts of such shapes (a
program's input, processing and output over a kind of record; a problem and a constraint; a correct
function of our own with one bug put in), each part with several wordings, so that the answers cover the
code the target writes for them. Nothing is copied from any dataset, and the problems Spec-Bench itself
asks are left out (the held-out check of `metasd/training/corpus.py` drops any prompt sharing 8 words
with a benchmark prompt in any case).
"""

from __future__ import annotations

import random
from collections.abc import Callable

# Not train_data.CODE_LANGS, version 1's list: each prompts version keeps its own draw, so that a shard is
# made again from its seed; merging the two would change version 1's prompts.
LANGS = ["Python", "Python", "Python", "Python", "JavaScript", "TypeScript", "Java", "C++", "Go", "Rust", "C#"]

# A kind of record: (plural, its categorical fields, its numeric fields)
RECORDS = [
    ("orders", ["customer", "country", "product"], ["amount", "quantity"]),
    ("students", ["class", "teacher", "school"], ["grade", "attendance"]),
    ("employees", ["department", "office", "role"], ["salary", "years of service"]),
    ("books", ["author", "genre", "publisher"], ["pages", "price", "year"]),
    ("products", ["category", "supplier", "brand"], ["price", "stock"]),
    ("trips", ["city", "driver", "vehicle"], ["distance", "duration"]),
    ("sensor readings", ["sensor", "room", "building"], ["temperature", "humidity"]),
    ("transactions", ["account", "merchant", "currency"], ["amount", "fee"]),
    ("matches", ["team", "stadium", "season"], ["goals", "attendance"]),
    ("songs", ["artist", "album", "genre"], ["length in seconds", "play count"]),
    ("tickets", ["status", "assignee", "priority"], ["hours spent", "age in days"]),
    ("recipes", ["cuisine", "author", "course"], ["calories", "cooking time"]),
]
SOURCES = [
    "reads a CSV file of {recs} (with a header row)", "loads a JSON file holding a list of {recs}",
    "reads {recs} from standard input, one per line as comma-separated values",
    "takes a list of {recs} as dictionaries", "reads {recs} from a SQLite table", "reads a tab-separated file of {recs}",
]
PROCESSES = [
    "computes the total {num} for each {cat}", "finds the {k} {recs} with the highest {num}",
    "keeps only the {recs} whose {num} is above a threshold given as an argument",
    "counts how many {recs} there are for each {cat}", "sorts the {recs} by {num}, highest first",
    "computes the average, minimum and maximum {num} for each {cat}",
    "groups the {recs} by {cat} and finds the one with the lowest {num} in each group",
    "finds duplicate {recs} (same {cat} and {num})", "computes the median {num} of all {recs}",
    "reports each {cat} whose average {num} is more than {k}0% above the overall average",
]
OUTPUTS = [
    "prints the result as a table", "writes the result to a new CSV file", "prints the result as JSON",
    "returns the result as a dictionary", "prints a short report", "saves the result to a file given as an argument",
]
TEXT_SOURCES = ["reads a text file given on the command line", "reads text from standard input",
                "reads a Markdown file", "reads every line of a file named on the command line"]
TEXT_PROCESSES = [
    "counts the lines, words and characters", "finds every line that contains a given keyword, with line numbers",
    "extracts every email address", "finds the longest line and its length",
    "replaces every date written as DD/MM/YYYY with YYYY-MM-DD", "lists the headings with their line numbers",
]
LOG_SOURCES = ["reads a web server's access log", "reads a log file line by line", "follows a log file as it grows"]
LOG_PROCESSES = [
    "counts how often each log level (INFO, WARNING, ERROR) appears", "counts the requests per hour",
    "lists the distinct IP addresses and how often each appears", "finds the slowest {k} requests",
    "reports every minute with more than {k}0 errors",
]
EXTRAS = ["", "", " Handle a missing file and malformed lines with clear error messages.",
          " Use only the standard library.", " Add a main function and command-line arguments.",
          " Include type hints and docstrings.", " Explain how it works after the code.",
          " Keep it under 60 lines.", " Add a few unit tests."]


def program(rng: random.Random) -> str:
    """A program that reads records or text, processes them and reports."""
    lang = rng.choice(LANGS)
    verb = rng.choice(["Write", "Develop", "Create", "Implement", "Write me"])
    if rng.random() < 0.3:
        sources, processes = rng.choice([(TEXT_SOURCES, TEXT_PROCESSES), (LOG_SOURCES, LOG_PROCESSES)])
        task = f"{rng.choice(sources)} and {rng.choice(processes).format(k=rng.randint(2, 9))}"
    else:
        recs, cats, nums = rng.choice(RECORDS)
        fill = {"recs": recs, "cat": rng.choice(cats), "num": rng.choice(nums), "k": rng.randint(2, 9)}
        task = (f"{rng.choice(SOURCES).format(**fill)}, {rng.choice(PROCESSES).format(**fill)} and "
                f"{rng.choice(OUTPUTS)}")
    return f"{verb} a {lang} program that {task}.{rng.choice(EXTRAS)}"


# (a problem, techniques that solve it, complexities to ask for); none of Spec-Bench's own coding problems
PROBLEMS = [
    ("find the length of the longest increasing subsequence of an array", ["dynamic programming", "binary search"],
     ["O(n^2)", "O(n log n)"]),
    ("compute the edit distance between two strings", ["dynamic programming"], ["O(mn)"]),
    ("find the maximum sum of a contiguous subarray", ["Kadane's algorithm", "divide and conquer"], ["O(n)"]),
    ("merge a list of overlapping intervals", ["sorting"], ["O(n log n)"]),
    ("find two numbers in an array that add up to a target", ["a hash map", "two pointers on a sorted copy"],
     ["O(n)", "O(n log n)"]),
    ("check whether a string of brackets is balanced", ["a stack"], ["O(n)"]),
    ("find the shortest path between two cells of a grid with walls", ["breadth-first search", "A* search"],
     ["O(rows * cols)"]),
    ("count the islands in a grid of 0s and 1s", ["depth-first search", "union-find"], ["O(rows * cols)"]),
    ("detect a cycle in a directed graph", ["depth-first search with colours", "Kahn's algorithm"], ["O(V + E)"]),
    ("order tasks so that every task comes after the tasks it depends on", ["topological sorting"], ["O(V + E)"]),
    ("compute the shortest distances from one node of a weighted graph to all others", ["Dijkstra's algorithm"],
     ["O((V + E) log V)"]),
    ("find the minimum spanning tree of a weighted graph", ["Kruskal's algorithm", "Prim's algorithm"],
     ["O(E log E)"]),
    ("solve the 0/1 knapsack problem for a list of items with weights and values", ["dynamic programming"],
     ["O(n * capacity)"]),
    ("find the number of ways to make change for an amount with given coins", ["dynamic programming"],
     ["O(n * amount)"]),
    ("rotate a square matrix by 90 degrees", ["in-place layer swaps", "transpose then reverse"],
     ["O(n^2) time and O(1) extra space"]),
    ("find all permutations of a string", ["backtracking", "recursion"], ["O(n * n!)"]),
    ("place n queens on an n by n board so that none attack each other", ["backtracking"], [""]),
    ("find every prime number below n", ["the sieve of Eratosthenes"], ["O(n log log n)"]),
    ("search for a pattern in a text", ["the Knuth-Morris-Pratt algorithm", "a rolling hash"], ["O(n + m)"]),
    ("find the longest palindromic substring", ["expanding around centres", "dynamic programming"], ["O(n^2)"]),
    ("reverse a singly linked list", ["iteration", "recursion"], ["O(n) time and O(1) extra space"]),
    ("detect whether a linked list has a cycle", ["Floyd's tortoise and hare"], ["O(n) time and O(1) extra space"]),
    ("check whether a binary tree is a valid binary search tree", ["recursion with bounds", "an in-order walk"],
     ["O(n)"]),
    ("return the level-order traversal of a binary tree", ["a queue"], ["O(n)"]),
    ("compute the height of a binary tree and check whether it is balanced", ["recursion"], ["O(n)"]),
    ("serialise a binary tree to a string and back", ["pre-order traversal", "breadth-first traversal"], ["O(n)"]),
    ("find the k most frequent elements of an array", ["a heap", "bucket sort"], ["O(n log k)", "O(n)"]),
    ("find the maximum of every window of size k in an array", ["a deque"], ["O(n)"]),
    ("sort an array of integers", ["merge sort", "quicksort", "heap sort", "counting sort"],
     ["O(n log n)", "O(n + k)"]),
    ("find the first missing positive integer in an unsorted array", ["index marking"],
     ["O(n) time and O(1) extra space"]),
    ("compute x raised to the power n", ["fast exponentiation"], ["O(log n)"]),
    ("find the longest substring without repeating characters", ["a sliding window"], ["O(n)"]),
    ("evaluate an arithmetic expression given as a string with +, -, * and parentheses",
     ["a recursive-descent parser", "two stacks"], ["O(n)"]),
    ("search a sorted array that was rotated at an unknown index", ["binary search"], ["O(log n)"]),
]
DATA_STRUCTURES = [
    ("an LRU cache", "get and put", "O(1)"), ("a stack that also returns its minimum", "push, pop and min", "O(1)"),
    ("a trie", "insert, search and starts_with", "O(length of the word)"),
    ("a queue built from two stacks", "enqueue and dequeue", "amortised O(1)"),
    ("a circular buffer of fixed size", "append, pop and is_full", "O(1)"),
    ("a binary search tree", "insert, delete and find", "O(height)"),
    ("a min-heap", "push, pop and peek", "O(log n)"), ("a union-find structure", "union and find",
                                                           "near-constant amortised"),
    ("a hash map with separate chaining", "put, get and remove", "average O(1)"),
    ("a doubly linked list", "append, prepend, remove and reverse", "O(1) for the ends"),
    ("a rate limiter that allows at most n requests per minute", "allow(request_time)", "O(1) amortised"),
    ("an interval set that merges overlapping ranges", "add and contains", "O(log n)"),
]


def algorithm(rng: random.Random) -> str:
    """A named problem or data structure, sometimes with the technique and complexity to use."""
    lang = rng.choice(LANGS)
    if rng.random() < 0.3:
        ds, ops, cx = rng.choice(DATA_STRUCTURES)
        return rng.choice([
            f"Implement {ds} in {lang} with {ops} operations.",
            f"Implement {ds} in {lang} whose {ops} operations run in {cx} time.",
            f"Write a {lang} class for {ds} supporting {ops}. Explain the time complexity of each operation.",
            f"Design {ds} with {ops}, and implement it in {lang} with a short usage example.",
        ])
    problem, techniques, complexities = rng.choice(PROBLEMS)
    tech = rng.choice(techniques)
    cx = rng.choice(complexities)
    options = [
        f"Implement a function to {problem}.",
        f"Write a {lang} function to {problem} using {tech}.",
        f"Write a {lang} function to {problem}. Explain the time and space complexity.",
        f"How would you {problem}? Write the code in {lang} and walk through an example.",
        f"Implement a {lang} function that uses {tech} to {problem}, and add a few test cases.",
    ]
    if cx:
        within = f"with {cx}" if "time" in cx else f"in {cx} time"
        options += [f"Implement a function to {problem} {within}.",
                    f"Write a {lang} function to {problem} with {tech} {within}."]
    return rng.choice(options)


# Correct functions of our own, each with bugs that could be put in: (purpose, code, [(correct, buggy), ...])
FUNCTIONS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("returns the index of a target in a sorted list, or -1", """def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1""", [("while lo <= hi", "while lo < hi"), ("lo = mid + 1", "lo = mid"), ("hi = mid - 1", "hi = mid")]),
    ("returns the largest value of a non-empty list", """def largest(values):
    best = values[0]
    for v in values[1:]:
        if v > best:
            best = v
    return best""", [("best = values[0]", "best = 0"), ("if v > best", "if v < best"),
                     ("    return best", "        return best")]),
    ("merges two sorted lists into one sorted list", """def merge_sorted(a, b):
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            out.append(a[i])
            i += 1
        else:
            out.append(b[j])
            j += 1
    out.extend(a[i:])
    out.extend(b[j:])
    return out""", [("    out.extend(b[j:])\n", ""), ("            i += 1\n", ""), ("while i < len(a) and j < len(b)",
                                                                                  "while i < len(a) or j < len(b)")]),
    ("counts how often each word appears in a text", """def word_counts(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,!?;:")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts""", [("counts.get(word, 0) + 1", "counts.get(word, 1)"), ("text.lower().split()", "text.split(' ')"),
                       ("counts[word] = counts.get(word, 0) + 1", "counts[word] = 1")]),
    ("returns the n-th triangular number 1 + 2 + ... + n", """def triangular(n):
    total = 0
    for k in range(1, n + 1):
        total += k
    return total""", [("range(1, n + 1)", "range(1, n)"), ("total += k", "total = k"), ("total = 0", "total = 1")]),
    ("checks whether a string reads the same backwards, ignoring case and spaces", """def is_palindrome(s):
    cleaned = [c.lower() for c in s if c.isalnum()]
    left, right = 0, len(cleaned) - 1
    while left < right:
        if cleaned[left] != cleaned[right]:
            return False
        left += 1
        right -= 1
    return True""", [("len(cleaned) - 1", "len(cleaned)"), ("right -= 1", "right += 1"),
                     ("c.lower() for c in s if c.isalnum()", "c for c in s if c.isalnum()")]),
    ("removes duplicates from a list, keeping the first occurrence of each", """def unique(items):
    seen = set()
    out = []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out""", [("            seen.add(x)\n", ""), ("if x not in seen", "if x in seen"),
                    ("    return out", "    return seen")]),
    ("returns the average of the numbers in a list, or None for an empty list", """def average(numbers):
    if not numbers:
        return None
    return sum(numbers) / len(numbers)""", [("    if not numbers:\n        return None\n", ""),
                                              ("sum(numbers) / len(numbers)", "sum(numbers) // len(numbers)")]),
    ("splits a list into chunks of size n", """def chunks(items, n):
    out = []
    for start in range(0, len(items), n):
        out.append(items[start:start + n])
    return out""", [("range(0, len(items), n)", "range(0, len(items) - n, n)"),
                    ("items[start:start + n]", "items[start:start + n - 1]")]),
    ("returns the running totals of a list of numbers", """def running_totals(numbers):
    totals = []
    current = 0
    for x in numbers:
        current += x
        totals.append(current)
    return totals""", [("        current += x\n        totals.append(current)", "        totals.append(current)\n"
                        "        current += x"), ("current = 0", "current = numbers[0]")]),
    ("converts a Roman numeral such as 'XIV' to an integer", """def roman_to_int(s):
    values = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}
    total = 0
    for i, ch in enumerate(s):
        if i + 1 < len(s) and values[ch] < values[s[i + 1]]:
            total -= values[ch]
        else:
            total += values[ch]
    return total""", [("values[ch] < values[s[i + 1]]", "values[ch] > values[s[i + 1]]"),
                      ("i + 1 < len(s) and ", ""), ("total -= values[ch]", "total += values[ch]")]),
    ("rotates a list to the right by k places", """def rotate_right(items, k):
    if not items:
        return items
    k %= len(items)
    return items[-k:] + items[:-k]""", [("    k %= len(items)\n", ""),
                                        ("items[-k:] + items[:-k]", "items[k:] + items[:k]")]),
]
REVIEW_ASKS = [
    "Here is a Python function that {purpose}. Can you find the bug and fix it?",
    "This function is supposed to {purpose2}, but a test fails. What is wrong with it?",
    "Review this Python code. It should {purpose2}. Point out any bug and suggest a fix.",
    "Is there a bug in this function, which {purpose}? Explain and give a corrected version.",
]
OTHER_ASKS = [
    "Write pytest unit tests for this Python function, which {purpose}:",
    "Translate this Python function, which {purpose}, into {lang}:",
    "Explain this Python function line by line and give its time complexity:",
    "Rewrite this Python function to be more idiomatic, and explain what you changed:",
    "Add input validation with clear error messages to this Python function, which {purpose}:",
]


def _infinitive(purpose: str) -> str:
    """'returns the largest value' -> 'return the largest value' (the first verb without its s)."""
    verb, _, rest = purpose.partition(" ")
    verb = verb[:-2] if verb.endswith(("ches", "shes", "xes")) else verb[:-1] if verb.endswith("s") else verb
    return f"{verb} {rest}"


def code_review(rng: random.Random) -> str:
    """One of our functions with one bug put in, to find; or correct, to test, translate or explain."""
    purpose, code, bugs = rng.choice(FUNCTIONS)
    fill = {"purpose": purpose, "purpose2": _infinitive(purpose), "lang": rng.choice(LANGS[4:])}
    if rng.random() < 0.6:
        good, bad = rng.choice(bugs)
        code = code.replace(good, bad, 1)
        ask = rng.choice(REVIEW_ASKS).format(**fill)
    else:
        ask = rng.choice(OTHER_ASKS).format(**fill)
    return f"{ask}\n\n```python\n{code}\n```"


WIDGETS = [
    "a counter with increment, decrement and reset buttons", "a to-do list where items can be added, ticked off "
    "and removed", "a sign-up form that checks the email address and password length before submitting",
    "a stopwatch with start, stop and reset buttons", "a button that switches between a light and a dark theme",
    "a table of {recs} that sorts by a column when its header is clicked", "an image gallery with previous and next "
    "buttons", "a tip calculator that splits a bill between several people", "a character counter under a text "
    "area that turns red past 280 characters", "a live search box that filters a list of {recs} as you type",
    "a simple quiz of three multiple-choice questions that shows the score at the end",
    "a countdown timer to a date the user picks", "tabs that show a different panel when clicked",
    "a colour picker that shows the chosen colour's hex code", "an accordion of frequently asked questions",
]


def web_page(rng: random.Random) -> str:
    recs = rng.choice(RECORDS)[0]
    widget = rng.choice(WIDGETS).format(recs=recs)
    return rng.choice([
        f"Write a simple web page in HTML, CSS and JavaScript with {widget}.",
        f"Create an HTML page with {widget}. Use plain JavaScript, no libraries.",
        f"Build {widget} as a single HTML file with inline CSS and JavaScript.",
        f"Write the HTML and JavaScript for {widget}, and explain how the event handling works.",
    ])


THINGS = [
    ("BankAccount", "a bank account", ["deposit money", "withdraw money but refuse overdrafts", "report the balance",
                                       "list past transactions"]),
    ("Library", "a small library", ["add books", "lend a book to a member", "take a book back",
                                    "list the overdue loans"]),
    ("ShoppingCart", "a shopping cart", ["add an item with a quantity", "remove an item", "apply a discount code",
                                         "compute the total with tax"]),
    ("ParkingLot", "a parking lot", ["park a car in the nearest free space", "free a space", "count the free spaces",
                                     "find where a car is parked"]),
    ("Fraction", "a fraction", ["add and multiply fractions", "reduce to lowest terms", "compare two fractions",
                                "convert to a float"]),
    ("Matrix", "a matrix", ["add two matrices", "multiply two matrices", "transpose", "compute the determinant"]),
    ("Inventory", "a shop's inventory", ["add stock", "sell items", "warn when stock runs low",
                                         "report the total value"]),
    ("Thermostat", "a thermostat", ["set a target temperature", "read the current temperature",
                                    "switch heating on or off", "keep a history of readings"]),
    ("TaskQueue", "a queue of tasks with priorities", ["add a task", "take the most urgent task",
                                                       "change a task's priority", "list the waiting tasks"]),
    ("Polynomial", "a polynomial", ["add two polynomials", "multiply them", "evaluate at a point",
                                    "print in readable form"]),
]


def class_design(rng: random.Random) -> str:
    name, thing, methods = rng.choice(THINGS)
    m = rng.sample(methods, 3)
    lang = rng.choice(LANGS)
    return rng.choice([
        f"Write a {lang} class `{name}` that models {thing}. It should {m[0]}, {m[1]} and {m[2]}.",
        f"Design a class for {thing} in {lang} with methods to {m[0]}, {m[1]} and {m[2]}. Include an example.",
        f"Implement {thing} as a {lang} class with methods to {m[0]}, {m[1]} and {m[2]}, and write tests for it.",
    ])


def sql_query(rng: random.Random) -> str:
    recs, cats, nums = rng.choice(RECORDS)
    table = recs.replace(" ", "_")
    cols = ", ".join(["id", *(c.replace(" ", "_") for c in cats), *(n.replace(" ", "_") for n in nums)])
    cat, num = rng.choice(cats).replace(" ", "_"), rng.choice(nums).replace(" ", "_")
    k = rng.randint(3, 10)
    q = rng.choice([
        f"returns the total {num} for each {cat}, largest first", f"finds the {k} rows with the highest {num}",
        f"counts the rows per {cat} and keeps only the groups with more than {k} rows",
        f"returns each {cat} with its average {num}, rounded to two decimals",
        f"finds the rows whose {num} is above the average {num} of their {cat}",
        f"ranks the rows within each {cat} by {num} using a window function",
    ])
    return f"Given a table {table}({cols}), write an SQL query that {q}. Explain the query."


KINDS: list[Callable[[random.Random], str]] = [program, algorithm, code_review, web_page, class_design, sql_query]
WEIGHTS = [3, 4, 3, 1, 2, 1]


def code_task(rng: random.Random) -> str:
    """One composed programming task, of a kind drawn by WEIGHTS."""
    return rng.choices(KINDS, weights=WEIGHTS)[0](rng)
