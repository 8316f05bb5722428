"""A corpus of the default assistant's own greedy answers, for training its EAGLE-3 draft head.

Prompts: composed offline from the templates and word lists below (no network, no external data
set), grouped in families (explanations, code, facts, lists, how-to, creative, chat, text tasks,
arithmetic). Each family is de-duplicated and shuffled with its own seeded `random.Random`, and the
families are interleaved round-robin, so any prefix of the order is balanced across families.

Held-out split: a prompt is held out when sha1(prompt) mod 20 == 0 (a property of the text, so it
does not move when the word lists grow), and so are the 24 held-out prompts of
scripts/train_assistant_kit.py. Held-out prompts never enter the corpus; benchmarks take them from
`held_out_prompts()` (or `--dry-run --held-out`).

Generation: vLLM's offline engine in this process on the CPU (float32, eager, greedy, the model's
chat template), fed through `LLM.llm_engine` with at most `--batch` requests in flight (continuous
batching: a finished answer is written at once and the next prompt takes its place).

Output: lmi_server/demo/assistant/corpus/part-NNNN.jsonl, one new part per run (a run rolls to the
next part near 9.5 MB), one JSON line per answer:
  {"id", "index", "family", "prompt", "prompt_token_ids", "answer", "output_token_ids", "finish_reason"}
Runs resume: prompts whose id is already in a part are skipped, so repeating
`--count N` extends the corpus by N answers. manifest.json is rewritten at the end of each run.

    python scripts/assistant_corpus.py --dry-run [--held-out] [--sample 20]
    flock /tmp/engine.lock .venv/bin/python scripts/assistant_corpus.py --count 2000
    flock /tmp/engine.lock .venv/bin/python scripts/assistant_corpus.py --bench 32,64,128 --bench-prompts 256

Measured on the 2-core CPU host (manifest.json, batch_size_measurements): 256 prompts, max_tokens 128,
both cores to the worker: 151 / 202 / 238 / 268 output tokens/s at 32 / 64 / 128 / 256 in flight;
128 in flight with vLLM's default (one core kept for the scheduler): 130 tokens/s. The first part
(200 answers, max_tokens 256, 256 in flight): 259 tokens/s, 173 tokens per answer, about 11 minutes
per 1,000 answers plus about 35 s of engine start; `--count 1000` keeps a run under 15 minutes.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import random
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORPUS_DIR = REPO / "lmi_server" / "demo" / "assistant" / "corpus"
KIT_SCRIPT = REPO / "scripts" / "train_assistant_kit.py"
GENERATOR_VERSION = 2
SEED = 0
HELD_OUT_EVERY = 20
PART_MAX_BYTES = 9_500_000

# --------------------------------------------------------------------------------------------
# word lists

AUDIENCES = [
    "a child", "a ten-year-old", "a beginner", "a high school student", "a college student",
    "my grandmother", "a busy manager", "a new programmer", "someone who has never heard of it",
    "a friend over coffee", "a curious teenager", "a non-technical person",
]

# Concepts in related groups (pairs inside a group make comparison prompts).
CONCEPT_GROUPS = {
    "science": [
        "photosynthesis", "gravity", "evolution", "the water cycle", "plate tectonics", "electricity",
        "magnetism", "nuclear fusion", "the greenhouse effect", "DNA", "cells", "atoms", "energy",
        "friction", "sound waves", "light", "black holes", "the Big Bang", "chemical reactions",
        "the periodic table", "erosion", "the carbon cycle", "vaccines", "the immune system",
        "antibiotics", "climate change", "ecosystems", "static electricity", "buoyancy", "inertia",
    ],
    "computing": [
        "recursion", "machine learning", "a database", "an API", "cloud computing", "encryption",
        "an operating system", "a compiler", "version control", "the internet", "a web browser",
        "an algorithm", "object-oriented programming", "a hash table", "a linked list", "binary numbers",
        "a neural network", "open-source software", "a firewall", "caching", "multithreading",
        "a virtual machine", "unit testing", "a programming language", "a search engine",
        "artificial intelligence", "a computer virus", "the CPU", "RAM", "a file system",
    ],
    "economics": [
        "inflation", "compound interest", "the stock market", "supply and demand", "a budget",
        "taxes", "a credit score", "interest rates", "a recession", "a mortgage", "insurance",
        "a savings account", "cryptocurrency", "international trade", "unemployment",
    ],
    "society": [
        "democracy", "human rights", "the rule of law", "voting", "a constitution", "free speech",
        "urbanization", "globalization", "public health", "education", "recycling", "volunteering",
        "renewable energy", "the Industrial Revolution", "the Renaissance",
    ],
    "mind": [
        "memory", "sleep", "motivation", "habits", "stress", "empathy", "creativity", "meditation",
        "critical thinking", "procrastination", "learning", "emotions", "confidence", "curiosity",
    ],
    "arts": [
        "jazz music", "classical music", "impressionism", "poetry", "photography", "theater",
        "sculpture", "film editing", "rhyme", "metaphor", "a sonnet", "a haiku", "storytelling",
        "abstract art", "architecture",
    ],
    "nature": [
        "volcanoes", "earthquakes", "rainbows", "glaciers", "coral reefs", "deserts", "rain forests",
        "tides", "hurricanes", "lightning", "the seasons", "the moon", "the sun", "clouds", "rivers",
    ],
    "health": [
        "nutrition", "exercise", "hydration", "protein", "vitamins", "the heart", "the lungs",
        "the brain", "posture", "stretching", "a balanced diet", "blood pressure", "digestion",
    ],
}
CONCEPTS = [c for group in CONCEPT_GROUPS.values() for c in group]

EXPLAIN_TEMPLATES = [
    "Explain {c} to {a}.", "How would you explain {c} to {a}?",
    "Describe {c} in a way {a} would understand.",
]
CONCEPT_TEMPLATES = [
    "What is {c}?", "Why is {c} important?", "Explain {c} in simple terms.",
    "Give me three facts about {c}.", "Write a short paragraph about {c}.",
    "What are the main ideas behind {c}?", "Summarize {c} in two sentences.",
    "What are common misconceptions about {c}?", "How does {c} affect everyday life?",
    "Tell me something surprising about {c}.", "What should everyone know about {c}?",
]
COMPARE_TEMPLATES = [
    "What is the difference between {x} and {y}?", "Compare {x} and {y}.",
    "How are {x} and {y} related?",
]

LANGUAGES = ["Python", "JavaScript", "Java", "C", "Go", "Rust", "TypeScript", "Ruby"]
CODE_TASKS = [
    "checks whether a number is prime", "returns the factorial of n", "counts the vowels in a string",
    "returns the first n Fibonacci numbers", "removes duplicates from a list",
    "checks if a string is a palindrome", "returns the largest element of a list",
    "merges two sorted lists", "converts Celsius to Fahrenheit", "reverses the words in a sentence",
    "computes the average of a list of numbers", "flattens a nested list",
    "checks if a year is a leap year", "counts the words in a sentence", "sums the digits of a number",
    "finds the second largest number in a list", "returns the greatest common divisor of two numbers",
    "checks whether two strings are anagrams", "capitalizes the first letter of every word",
    "converts a binary string to an integer", "converts an integer to Roman numerals",
    "returns the n-th triangular number", "finds the most common element in a list",
    "checks whether a list is sorted", "rotates a list by k positions", "returns the median of a list",
    "counts how often each character appears in a string", "removes all spaces from a string",
    "splits a list into chunks of size n", "returns the intersection of two lists",
    "checks whether a number is a perfect square", "computes the power of a number without using **",
    "validates an email address with a simple rule", "returns all even numbers from a list",
    "finds the index of an item in a list using binary search", "sorts a list with bubble sort",
    "sorts a list with insertion sort", "returns the length of the longest word in a sentence",
    "converts a string to title case", "checks if a number is an Armstrong number",
    "generates a random password of length n", "counts the lines in a text file",
    "returns the sum of all odd numbers up to n", "transposes a matrix",
    "multiplies two matrices", "computes the dot product of two vectors",
    "checks whether parentheses in a string are balanced", "returns the prime factors of a number",
    "converts a number of seconds to hours, minutes and seconds", "finds all pairs in a list that add up to a target",
    "removes vowels from a string", "returns the cumulative sum of a list",
    "checks whether a string contains only digits", "returns the minimum and maximum of a list",
    "counts the number of uppercase letters in a string", "converts kilometers to miles",
    "computes the area of a circle from its radius", "computes simple interest",
    "returns a list of squares from 1 to n", "finds the longest common prefix of a list of strings",
    "reverses a linked list", "implements a stack with push and pop", "implements a queue",
    "computes the n-th Fibonacci number with memoization", "checks whether a number is even or odd",
    "calculates the body mass index from weight and height", "shuffles a list",
    "replaces every occurrence of a word in a text", "returns the last n elements of a list",
    "groups a list of words by their first letter", "converts a dictionary to a list of pairs",
]
PY_HOWTO = [
    "read a file line by line", "sort a dictionary by value", "reverse a list", "handle exceptions",
    "create a virtual environment", "write to a CSV file", "read a JSON file", "parse command-line arguments",
    "measure how long a function takes", "make an HTTP request", "format a date", "remove an item from a list",
    "check if a key is in a dictionary", "join a list of strings", "split a string by commas",
    "convert a string to an integer", "get the current date and time", "generate random numbers",
    "use a list comprehension", "define a class", "write a unit test", "use a for loop with an index",
    "merge two dictionaries", "copy a list", "find the length of a string", "round a number to two decimals",
    "read user input", "create a set", "iterate over a dictionary", "use a lambda function",
    "sort a list of tuples by the second element", "write a decorator", "use a generator",
    "open a file safely with a context manager", "count items with collections.Counter",
    "use f-strings", "check the type of a variable", "install a package with pip", "use enumerate",
    "use zip to loop over two lists", "delete a file", "list the files in a folder",
    "convert a list to a string", "remove whitespace from a string", "use a while loop",
    "write a function with default arguments", "return multiple values from a function",
    "use the map function", "filter a list", "find the maximum value in a dictionary",
]
PY_HOWTO_TEMPLATES = [
    "How do I {t} in Python?", "Show me how to {t} in Python.", "What is the best way to {t} in Python?",
]
CODE_CONCEPTS = [
    "a Python decorator", "a generator in Python", "a list comprehension", "the Python keyword yield",
    "a lambda function", "a Python dictionary", "a tuple", "a for loop", "a while loop",
    "an if statement", "a class in Python", "inheritance", "a module in Python", "a virtual environment",
    "a try/except block", "type hints in Python", "the __init__ method", "a JavaScript promise",
    "async and await", "a closure", "a variable", "a function argument", "a return value",
    "a SQL join", "a primary key", "a REST API", "JSON", "a regular expression", "a git branch",
    "a merge conflict", "Big O notation", "a recursive function", "an array", "a string",
]
CODE_CONCEPT_TEMPLATES = [
    "What is {c}? Show a small example.", "Explain {c} with a short code example.",
    "When should I use {c}?",
]
SQL_TASKS = [
    "selects all users older than 30", "counts the orders per customer", "finds the most expensive product",
    "lists employees hired after 2020", "returns the average salary per department",
    "deletes rows where the status is inactive", "updates the price of a product",
    "joins orders with customers", "finds duplicate email addresses", "selects the top five scores",
    "creates a table for books", "inserts a new row into a users table",
    "lists customers who never placed an order", "sums the sales per month",
    "finds products with no stock left",
]
SHELL_TASKS = [
    "counts the lines in a file", "finds all Python files in a folder", "shows the disk usage of a folder",
    "lists the ten largest files", "searches for a word in all text files", "renames all .txt files to .md",
    "shows the running processes", "creates a compressed archive of a folder", "prints the last 20 lines of a log",
    "counts how many times a word appears in a file", "deletes empty folders", "shows the current date",
    "downloads a file from a URL", "makes a script executable", "sorts the lines of a file",
]
CODE_SNIPPETS = [
    "print([x * x for x in range(5)])", "def add(a, b):\n    return a + b", "for i in range(3):\n    print(i)",
    "s = 'hello'\nprint(s[::-1])", "nums = [3, 1, 2]\nnums.sort()\nprint(nums)",
    "d = {'a': 1}\nprint(d.get('b', 0))", "x = 10\nwhile x > 0:\n    x -= 3\nprint(x)",
    "def f(n):\n    return 1 if n == 0 else n * f(n - 1)", "words = 'a b c'.split()\nprint(len(words))",
    "print(sum(range(1, 11)))", "items = ['a', 'b']\nfor i, item in enumerate(items):\n    print(i, item)",
    "print(max([4, 9, 2], key=lambda v: -v))", "import math\nprint(math.sqrt(16))",
    "a, b = 1, 2\na, b = b, a\nprint(a, b)", "print('-'.join(['2024', '01', '31']))",
    "def greet(name='world'):\n    return f'Hello, {name}!'", "print(set([1, 2, 2, 3]))",
    "numbers = [1, 2, 3, 4]\nprint(list(filter(lambda n: n % 2 == 0, numbers)))",
    "with open('data.txt') as f:\n    print(f.read())", "print(len('banana'.replace('a', '')))",
]
CODE_SNIPPET_TEMPLATES = ["What does this Python code do?\n\n{s}", "Explain this code line by line:\n\n{s}"]

COUNTRIES = [
    "France", "Germany", "Italy", "Spain", "Portugal", "Japan", "China", "India", "Brazil", "Canada",
    "Mexico", "Argentina", "Chile", "Peru", "Colombia", "Egypt", "Kenya", "Nigeria", "South Africa",
    "Morocco", "Australia", "New Zealand", "Russia", "Turkey", "Greece", "Sweden", "Norway", "Finland",
    "Denmark", "Poland", "Ireland", "the Netherlands", "Belgium", "Switzerland", "Austria",
    "the United Kingdom", "the United States", "South Korea", "Vietnam", "Thailand", "Indonesia",
    "the Philippines", "Malaysia", "Pakistan", "Iran", "Saudi Arabia", "Israel", "Ethiopia", "Ghana",
    "Cuba", "Iceland", "Hungary", "the Czech Republic", "Ukraine", "Romania", "Venezuela", "Nepal",
    "Bangladesh", "Sri Lanka", "Mongolia",
]
COUNTRY_TEMPLATES = [
    "What is the capital of {x}?", "What language is spoken in {x}?", "What is the currency of {x}?",
    "Tell me three facts about {x}.", "What is {x} famous for?", "What is the climate like in {x}?",
    "What are some traditional dishes from {x}?", "Describe the geography of {x}.",
    "What should a tourist know before visiting {x}?",
]
CITIES = [
    "Paris", "London", "Tokyo", "New York", "Rome", "Berlin", "Madrid", "Cairo", "Sydney", "Toronto",
    "Rio de Janeiro", "Mumbai", "Beijing", "Istanbul", "Moscow", "Amsterdam", "Vienna", "Prague",
    "Barcelona", "Lisbon", "Seoul", "Bangkok", "Singapore", "Dubai", "Mexico City", "Buenos Aires",
    "Cape Town", "Nairobi", "Athens", "Stockholm", "San Francisco", "Chicago", "Venice", "Kyoto",
    "Edinburgh", "Dublin", "Vancouver", "Marrakesh", "Hanoi", "Lima",
]
CITY_TEMPLATES = [
    "What is {x} known for?", "What should I see in {x}?", "Plan a one-day trip to {x}.",
    "In which country is {x}?", "What is the best time of year to visit {x}?",
]
ANIMALS = [
    "elephants", "octopuses", "dolphins", "penguins", "owls", "wolves", "honeybees", "sharks", "koalas",
    "giraffes", "lions", "tigers", "cats", "dogs", "horses", "rabbits", "turtles", "frogs", "butterflies",
    "ants", "bats", "whales", "eagles", "parrots", "crocodiles", "snakes", "squirrels", "foxes", "bears",
    "kangaroos", "camels", "zebras", "hedgehogs", "jellyfish", "spiders", "chickens", "cows", "pandas",
    "flamingos", "hummingbirds",
]
ANIMAL_TEMPLATES = [
    "Tell me a fun fact about {x}.", "What do {x} eat?", "Where do {x} live?", "How long do {x} live?",
    "Describe {x} to a child.", "Why are {x} important to their ecosystem?", "How do {x} communicate?",
]
PEOPLE = [
    "Albert Einstein", "Marie Curie", "Isaac Newton", "Leonardo da Vinci", "William Shakespeare",
    "Ada Lovelace", "Alan Turing", "Charles Darwin", "Nelson Mandela", "Mahatma Gandhi", "Cleopatra",
    "Julius Caesar", "Napoleon Bonaparte", "Abraham Lincoln", "Martin Luther King Jr.", "Galileo Galilei",
    "Nikola Tesla", "Thomas Edison", "Jane Austen", "Mozart", "Beethoven", "Frida Kahlo", "Vincent van Gogh",
    "Aristotle", "Socrates", "Confucius", "Queen Victoria", "Rosa Parks", "Amelia Earhart", "Neil Armstrong",
    "Florence Nightingale", "Johannes Gutenberg", "Pablo Picasso", "Charles Dickens", "Grace Hopper",
]
PEOPLE_TEMPLATES = [
    "Who was {x}?", "What is {x} known for?", "Summarize the life of {x} in three sentences.",
    "Why is {x} remembered today?",
]
FACT_QUESTIONS = [
    "What is the tallest mountain in the world?", "What is the largest ocean on Earth?",
    "How many continents are there?", "What is the boiling point of water?", "What is the speed of light?",
    "How far is the Moon from Earth?", "What is the longest river in the world?",
    "How many planets are in the solar system?", "What is the smallest planet in the solar system?",
    "What is the hottest planet?", "How many bones are in the human body?", "What is the largest desert?",
    "What is the chemical symbol for gold?", "What gas do plants absorb?", "How many days are in a year?",
    "How many hours are in a week?", "What is the freezing point of water in Fahrenheit?",
    "Who invented the telephone?", "Who painted the Sistine Chapel ceiling?", "Who wrote Hamlet?",
    "When did the first person walk on the Moon?", "What is the largest mammal?",
    "What is the fastest land animal?", "How many strings does a violin have?", "What is a light year?",
    "What is the most spoken language in the world?", "What is the largest country by area?",
    "How many players are on a soccer team?", "What is the main gas in Earth's atmosphere?",
    "What is the hardest natural substance?", "How many sides does a hexagon have?",
    "What is the largest organ of the human body?", "How many teeth does an adult have?",
    "What is the deepest ocean trench?", "How old is the universe?", "What is the closest star to Earth?",
]
ELEMENTS = [
    "oxygen", "hydrogen", "carbon", "nitrogen", "iron", "gold", "silver", "copper", "aluminum", "helium",
    "sodium", "calcium", "silicon", "uranium", "lead", "zinc", "neon", "chlorine", "mercury", "titanium",
]
ELEMENT_TEMPLATES = ["What is {x} used for?", "Where is {x} found in nature?", "Tell me two facts about {x}."]

LIST_THINGS = [
    "fruits", "vegetables", "fruits high in vitamin C", "programming languages", "countries in South America",
    "countries in Africa", "European capitals", "musical instruments", "board games", "indoor hobbies",
    "outdoor activities", "healthy snacks", "breakfast ideas", "famous painters", "famous scientists",
    "planets", "birds", "sea animals", "mammals that live in the ocean", "dog breeds", "flowers",
    "trees", "herbs for cooking", "spices", "kinds of pasta", "cheeses", "sports played with a ball",
    "Olympic sports", "winter sports", "types of clouds", "renewable energy sources", "greenhouse gases",
    "parts of a computer", "web browsers", "Python libraries", "data structures", "sorting algorithms",
    "famous bridges", "wonders of the world", "mountains", "rivers in Europe", "deserts", "oceans and seas",
    "colors of the rainbow", "shapes", "prime numbers", "even numbers", "things to pack for a trip",
    "things to do on a rainy day", "ways to save energy at home", "ways to reduce stress",
    "ways to save money", "ways to be more productive", "study techniques", "kitchen tools",
    "gardening tools", "car parts", "jobs in healthcare", "jobs in technology", "school subjects",
    "classic novels", "poets", "Greek gods", "Roman emperors", "inventions of the 20th century",
    "ancient civilizations", "languages spoken in India", "dances", "martial arts", "card games",
    "pizza toppings", "soups", "desserts", "drinks without caffeine", "sources of protein",
    "vitamins and what they do", "muscles in the human body", "organs of the human body",
    "emotions", "virtues", "good habits", "questions to ask in a job interview", "icebreaker questions",
    "things to see in Paris", "gifts for a friend", "names for a pet dog", "names for a pet cat",
    "types of rocks", "insects", "reptiles", "constellations", "units of length", "metals",
    "punctuation marks", "parts of speech", "synonyms for happy", "synonyms for big", "rhymes for cat",
    "words that start with q", "chess pieces", "famous composers", "types of bread", "berries",
    "safety tips for hiking", "things that are made of glass", "things you can recycle",
    "ways to stay hydrated", "exercises you can do at home", "camping essentials", "features of a good website",
]
LIST_NUMBERS = ["3", "5", "7", "10", "three", "four", "five", "six"]
LIST_TEMPLATES = ["List {n} {x}.", "Name {n} {x}.", "Give me a list of {n} {x}.", "What are {n} examples of {x}?"]

ACTIVITIES = [
    "learning a new language", "studying for exams", "running a marathon", "cooking at home", "saving money",
    "writing an essay", "public speaking", "preparing for job interviews", "sleeping better", "staying focused",
    "working from home", "learning to code", "gardening", "camping", "taking photos with a phone",
    "traveling on a budget", "learning the guitar", "painting with watercolors", "reading more books",
    "making friends in a new city", "keeping a journal", "starting a small business", "baking bread",
    "drinking more water", "waking up early", "managing time", "staying healthy in winter", "hiking",
    "swimming", "cycling in the city", "learning chess", "writing poetry", "meditating", "cleaning the house",
    "moving to a new home", "training a puppy", "caring for houseplants", "riding a bike", "driving in the rain",
    "planning a wedding", "packing a suitcase", "writing a resume", "negotiating a salary", "giving feedback",
    "learning math", "teaching kids to read", "reducing screen time", "eating healthy on a budget",
    "staying motivated", "debugging code", "writing clean code", "reviewing code", "learning to draw",
    "playing the piano", "singing", "doing yoga", "lifting weights", "stretching after exercise",
    "making a presentation", "organizing a desk", "decluttering a closet", "shopping for groceries",
    "preparing for a road trip", "hosting a dinner party", "making coffee at home", "remembering names",
    "writing a cover letter", "learning history", "birdwatching", "fishing", "skiing",
]
TIP_COUNTS = ["two", "three", "four", "five"]
TIP_TEMPLATES = ["Give {k} tips for {x}.", "Give me {k} pieces of advice about {x}."]
ACTIVITY_TEMPLATES = [
    "What are some tips for {x}?", "What are common beginner mistakes in {x}?", "How can I get better at {x}?",
    "What do I need to start {x}?", "Write a short step-by-step guide to {x}.",
    "What are the benefits of {x}?",
]
HOWTO_TASKS = [
    "make pancakes", "boil an egg", "make a cup of tea", "change a flat tire", "plant tomatoes",
    "tie a tie", "fold a paper airplane", "make a budget", "write a thank-you note", "clean a laptop keyboard",
    "make scrambled eggs", "brew coffee with a French press", "set up a fish tank", "start a compost pile",
    "make a smoothie", "sew on a button", "wash a wool sweater", "unclog a sink", "write a haiku",
    "back up my phone", "create a strong password", "make homemade pizza", "cook rice", "make a salad",
    "remove a stain from a shirt", "make a paper boat", "learn to juggle", "make a to-do list",
    "prepare for a job interview", "write a short story", "grow herbs on a windowsill", "make lemonade",
    "clean a cast iron pan", "fall asleep faster", "calm down when I am anxious", "introduce myself at work",
    "apologize to a friend", "ask for a raise", "say no politely", "make a simple website",
    "start learning Python", "set goals for the new year", "build a birdhouse", "make soap bubbles",
    "keep cut flowers fresh", "take care of a cactus", "wrap a gift", "make bread without yeast",
    "study for a math test", "memorize a poem", "write an email to my teacher", "choose a good book",
]
HOWTO_TEMPLATES = ["How do I {x}?", "What are the steps to {x}?", "Explain how to {x}.", "What is the easiest way to {x}?"]

WHY_QUESTIONS = [  # (question form, statement form)
    ("is the sky blue", "the sky is blue"), ("do leaves change color in autumn", "leaves change color in autumn"),
    ("is the ocean salty", "the ocean is salty"), ("do we have tides", "we have tides"),
    ("do we need sleep", "we need sleep"), ("do cats purr", "cats purr"), ("does ice float on water", "ice floats on water"),
    ("do we dream", "we dream"), ("do onions make us cry", "onions make us cry"), ("do stars twinkle", "stars twinkle"),
    ("is the Earth round", "the Earth is round"), ("do birds migrate", "birds migrate"),
    ("do we have seasons", "we have seasons"), ("do we yawn", "we yawn"), ("does bread rise", "bread rises"),
    ("does the moon change shape", "the moon seems to change shape"), ("do volcanoes erupt", "volcanoes erupt"),
    ("does metal feel cold", "metal feels cold"), ("do we get goosebumps", "we get goosebumps"),
    ("do soap bubbles pop", "soap bubbles pop"), ("is exercise good for the brain", "exercise is good for the brain"),
    ("do we hiccup", "we hiccup"), ("do plants need sunlight", "plants need sunlight"),
    ("is recycling important", "recycling is important"), ("do people get sunburned", "people get sunburned"),
    ("does popcorn pop", "popcorn pops"), ("do zebras have stripes", "zebras have stripes"),
    ("do our ears pop on airplanes", "our ears pop on airplanes"),
    ("does time seem to fly when we have fun", "time seems to fly when we have fun"),
    ("do we need vitamins", "we need vitamins"), ("is water important for the body", "water is important for the body"),
    ("do rivers flow to the sea", "rivers flow to the sea"), ("does thunder follow lightning", "thunder follows lightning"),
    ("do apples turn brown after being cut", "apples turn brown after being cut"),
    ("do dogs wag their tails", "dogs wag their tails"),
]
WHY_TEMPLATES = ["Why {q}?", "Explain in a few sentences why {s}.", "Can you explain to a child why {s}?"]
DEVICES = [
    "a refrigerator", "a microwave oven", "an airplane", "a car engine", "a bicycle", "a solar panel",
    "a computer", "a smartphone", "the internet", "a camera", "a battery", "a light bulb", "a thermometer",
    "a compass", "a telescope", "a vaccine", "a wind turbine", "a washing machine", "a GPS receiver",
    "an elevator", "a touchscreen", "a printer", "a microphone", "a speaker", "a rocket", "a submarine",
    "a clock", "an electric car", "a heat pump", "Wi-Fi", "a search engine", "email", "a credit card",
    "a dishwasher", "a vacuum cleaner", "a 3D printer",
]
DEVICE_TEMPLATES = ["How does {x} work?", "Explain how {x} works step by step.", "What are the main parts of {x}?"]

POEM_SUBJECTS = [
    "the moon", "the ocean", "autumn leaves", "a rainy day", "a cup of coffee", "a city at night", "friendship",
    "a lost sock", "a lighthouse", "the first snow", "a cat in the sun", "mountains", "a summer evening",
    "a busy train station", "an old library", "a garden in spring", "the stars", "a thunderstorm",
    "a dragon", "a robot learning to love", "a birthday", "the wind", "a river", "a forest at dawn",
    "homework", "a quiet morning", "a lonely tree", "the desert", "a butterfly", "a sunrise", "time",
    "a bakery", "a kite", "the sea at night", "an old photograph", "a violin", "a snowman", "coding late at night",
]
CREATIVE_TEMPLATES = [
    "Write a short poem about {x}.", "Write a haiku about {x}.", "Write a limerick about {x}.",
    "Write a two-sentence story about {x}.", "Describe {x} in three sentences.",
    "Write the opening line of a story about {x}.", "Write a riddle about {x}.",
]
CHARACTERS = [
    "a brave knight", "a curious robot", "a shy dragon", "an old fisherman", "a young wizard", "a talking cat",
    "a lost astronaut", "a clever fox", "a lonely lighthouse keeper", "a little girl", "a retired teacher",
    "a baker", "a detective", "a pirate captain", "a friendly ghost", "a tiny mouse", "a giant",
    "a time traveler", "a street musician", "a farmer",
]
SITUATIONS = [
    "finds a mysterious map", "loses their way home", "learns to fly", "meets a new friend", "discovers a secret door",
    "wins a contest", "must cross a river", "finds a talking tree", "is afraid of the dark", "bakes a magic cake",
    "gets lost in a city", "receives a strange letter", "builds a machine", "wakes up in the future",
    "saves a village", "finds a treasure chest", "plants a magic seed", "forgets their birthday",
    "has to tell the truth", "learns a new song",
]
STORY_TEMPLATES = ["Write a short story about {c} who {s}.", "Tell a bedtime story about {c} who {s}."]
MESSAGE_TONES = ["friendly", "polite", "formal", "short", "cheerful", "apologetic"]
MESSAGE_KINDS = ["email", "text message", "note"]
RECIPIENTS = [
    "my neighbor", "my boss", "a coworker", "my teacher", "a friend", "my landlord", "a customer",
    "my team", "my grandmother", "a new colleague",
]
OCCASIONS = [
    "a lost cat", "a party next weekend", "being late tomorrow", "a thank you for their help", "a meeting change",
    "a birthday", "a noisy evening", "borrowing a ladder", "a job well done", "a missed call", "a holiday greeting",
    "a project deadline", "a welcome to the team", "a broken window", "an invitation to lunch",
]

FEELINGS = [
    "nervous", "sad", "stressed", "bored", "lonely", "excited but worried", "overwhelmed", "unmotivated",
    "angry", "confused", "tired",
]
FEELING_SITUATIONS = [
    "a job interview tomorrow", "starting a new school", "moving to another city", "my exams",
    "a presentation at work", "a fight with my friend", "my first day at a new job", "learning to drive",
    "my birthday party", "a long flight", "my weekend", "my project at work", "meeting new people",
    "a difficult conversation", "my exercise routine", "my career", "my homework", "a big decision",
]
FEELING_TEMPLATES = ["I feel {f} about {s}. What should I do?", "I'm {f} about {s}. Any advice?"]
CHAT_OPENERS = [
    "Hello!", "Hi, how are you?", "Good morning!", "Can you help me?", "What can you do?", "Who are you?",
    "Tell me a joke.", "Tell me a joke about computers.", "Tell me a joke about cats.", "Tell me a riddle.",
    "What is your favorite color?", "Do you like music?", "What should I do this weekend?",
    "What should I cook for dinner tonight?", "I'm bored. Any ideas?", "Give me a fun fact.",
    "Say something nice.", "Can you recommend a good book?", "What is a good movie for a family night?",
    "Tell me something interesting.", "Can you motivate me to study?", "Thank you for your help!",
    "What is the meaning of life?", "Give me a quote about courage.", "Give me a word of the day.",
    "How can I be happier?", "Tell me a short story.", "What is a good name for a goldfish?",
    "Say hello in five languages.", "Suggest a weekend project.", "Suggest a healthy lunch.",
]
EVENTS = [
    "a birthday party", "a picnic", "a camping trip", "a family reunion", "a study group",
    "a surprise party", "a weekend in the mountains", "a wedding anniversary", "a game night",
    "a school science fair", "a bake sale", "a team lunch", "a garage sale", "a road trip", "a book club",
]
EVENT_TEMPLATES = ["Help me plan {x}.", "What should I prepare for {x}?", "Give me a checklist for {x}."]
RECOMMEND_MEDIA = ["book", "movie", "podcast", "board game", "song"]
GENRES = [
    "science fiction", "history", "mystery stories", "comedy", "adventure", "nature", "space", "cooking",
    "fantasy", "sports", "romance", "music", "true stories", "puzzles",
]
NAMED_THINGS = [
    "a bakery", "a coffee shop", "a pet rabbit", "a fantasy kingdom", "a robot", "a sailboat", "a band",
    "a podcast about science", "a hiking club", "a bookstore", "a video game", "a startup that sells plants",
]

WORDS = [
    "happy", "big", "fast", "brave", "quiet", "bright", "ancient", "curious", "generous", "fragile", "honest",
    "gigantic", "delicious", "calm", "clever", "lazy", "polite", "ambitious", "cheerful", "difficult",
    "elegant", "famous", "gentle", "humble", "important", "jealous", "kind", "loyal", "mysterious", "nervous",
    "optimistic", "patient", "rare", "simple", "tiny", "useful", "vivid", "wise", "young", "zealous",
    "abundant", "bold", "crisp", "diligent", "eager", "fierce", "graceful", "hollow", "invisible", "joyful",
]
WORD_TEMPLATES = [
    "Give me a synonym for {x}.", "What is the opposite of {x}?", "Use the word {x} in a sentence.",
    "What does the word {x} mean?",
]
PHRASES = [
    "Good morning", "Thank you very much", "Where is the train station?", "I love reading books",
    "How much does this cost?", "The weather is nice today", "See you tomorrow", "I am learning a new language",
    "Can I have a glass of water?", "Happy birthday", "What time is it?", "My name is Anna",
    "I would like a coffee, please", "Where is the bathroom?", "Have a nice day", "I am hungry",
    "The cat is sleeping", "Let's go to the beach", "I don't understand", "Nice to meet you",
]
TARGET_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
SENTENCES_TO_FIX = [
    "me and him goes to the store yesterday", "she dont like apples", "their going to the park later",
    "i has three cat", "the book what I read was good", "he run very fast every days",
    "we was happy to see you", "its a nice day isnt it", "they is my best friends", "i seen that movie",
    "can you borrow me a pen", "there is many people here", "she have a big dog", "me want pizza",
    "he don't know nothing",
]
INFORMAL_SENTENCES = [
    "hey, can u send me the file asap", "gonna be late, sorry", "that meeting was kinda pointless",
    "thx for the help, u rock", "wanna grab lunch", "the app is totally broken lol", "i need this done by friday ok",
    "sorry cant make it tonight", "can we talk about the money thing", "your idea is pretty cool",
]
TEXT_TASK_TEMPLATES = {
    "fix": ["Correct the grammar in this sentence: \"{x}\"", "Fix the mistakes in: \"{x}\""],
    "formal": ["Rewrite this more formally: \"{x}\"", "Make this sound more professional: \"{x}\""],
}

ITEMS = ["apples", "books", "marbles", "cookies", "pencils", "stickers", "coins", "oranges", "cards", "balloons"]
UNIT_PAIRS = [
    ("kilometers", "miles"), ("miles", "kilometers"), ("meters", "feet"), ("kilograms", "pounds"),
    ("pounds", "kilograms"), ("liters", "gallons"), ("inches", "centimeters"), ("hours", "minutes"),
    ("days", "hours"), ("degrees Celsius", "degrees Fahrenheit"),
]


# --------------------------------------------------------------------------------------------
# prompt families


def _fmt(templates: list[str], **lists: list[str]) -> list[str]:
    keys = list(lists)
    return [t.format(**dict(zip(keys, combo))) for t in templates for combo in itertools.product(*lists.values())]


def _math_prompts() -> list[str]:
    out = []
    for a in range(2, 21):
        for b in range(2, 21):
            out.append(f"What is {a} times {b}?")
            out.append(f"What is {a * 7} plus {b * 3}?")
    for a in range(10, 60, 3):
        for b in range(1, a, 4):
            for item in ITEMS[:4]:
                out.append(f"If I have {a} {item} and give away {b}, how many are left?")
    for n in range(2, 150):
        out.append(f"Is {n} a prime number?")
    for value in (1, 2, 3, 5, 10, 12, 20, 25, 50, 100):
        for src, dst in UNIT_PAIRS:
            out.append(f"Convert {value} {src} to {dst}.")
    for price in (3, 5, 8, 12, 15):
        for qty in (2, 3, 4, 6, 7):
            item = ITEMS[(price + qty) % len(ITEMS)]
            out.append(f"If one box of {item} costs {price} dollars, how much do {qty} boxes cost? Explain your answer.")
    return out


def _pairs(groups: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    xs, ys = [], []
    for group in groups.values():
        for x, y in itertools.combinations(group, 2):
            xs.append(x)
            ys.append(y)
    return xs, ys


def families() -> dict[str, list[str]]:
    """Every family's prompts (before de-duplication and shuffling)."""
    xs, ys = _pairs(CONCEPT_GROUPS)
    compare = [t.format(x=x, y=y) for t in COMPARE_TEMPLATES for x, y in zip(xs, ys)]
    return {
        "explain": _fmt(EXPLAIN_TEMPLATES, c=CONCEPTS, a=AUDIENCES),
        "concept": _fmt(CONCEPT_TEMPLATES, c=CONCEPTS),
        "compare": compare,
        "code_function": [
            f"Write a {lang} function that {task}." for lang in LANGUAGES for task in CODE_TASKS
        ] + [f"Write a Python function that {task}. Include a docstring and an example." for task in CODE_TASKS],
        "code_howto": _fmt(PY_HOWTO_TEMPLATES, t=PY_HOWTO),
        "code_concept": _fmt(CODE_CONCEPT_TEMPLATES, c=CODE_CONCEPTS),
        "code_other": [f"Write a SQL query that {t}." for t in SQL_TASKS]
        + [f"Write a shell command that {t}." for t in SHELL_TASKS]
        + _fmt(CODE_SNIPPET_TEMPLATES, s=CODE_SNIPPETS),
        "facts_country": _fmt(COUNTRY_TEMPLATES, x=COUNTRIES),
        "facts_city": _fmt(CITY_TEMPLATES, x=CITIES),
        "facts_animal": _fmt(ANIMAL_TEMPLATES, x=ANIMALS),
        "facts_people": _fmt(PEOPLE_TEMPLATES, x=PEOPLE),
        "facts_misc": list(FACT_QUESTIONS) + _fmt(ELEMENT_TEMPLATES, x=ELEMENTS),
        "lists": _fmt(LIST_TEMPLATES, n=LIST_NUMBERS, x=LIST_THINGS),
        "tips": _fmt(TIP_TEMPLATES, k=TIP_COUNTS, x=ACTIVITIES) + _fmt(ACTIVITY_TEMPLATES, x=ACTIVITIES),
        "howto": _fmt(HOWTO_TEMPLATES, x=HOWTO_TASKS),
        "why": [t.format(q=q, s=st) for t in WHY_TEMPLATES for q, st in WHY_QUESTIONS],
        "how_it_works": _fmt(DEVICE_TEMPLATES, x=DEVICES),
        "creative_short": _fmt(CREATIVE_TEMPLATES, x=POEM_SUBJECTS),
        "creative_story": _fmt(STORY_TEMPLATES, c=CHARACTERS, s=SITUATIONS),
        "messages": [
            f"Write a {tone} {kind} to {who} about {what}."
            for tone in MESSAGE_TONES for kind in MESSAGE_KINDS for who in RECIPIENTS for what in OCCASIONS
        ],
        "chat": list(CHAT_OPENERS) + _fmt(FEELING_TEMPLATES, f=FEELINGS, s=FEELING_SITUATIONS)
        + _fmt(EVENT_TEMPLATES, x=EVENTS)
        + [f"Recommend a {m} for someone who likes {g}." for m in RECOMMEND_MEDIA for g in GENRES]
        + [f"Suggest {n} names for {x}." for n in ("three", "five") for x in NAMED_THINGS],
        "words": _fmt(WORD_TEMPLATES, x=WORDS),
        "text_tasks": [f"Translate \"{p}\" into {lang}." for p in PHRASES for lang in TARGET_LANGUAGES]
        + _fmt(TEXT_TASK_TEMPLATES["fix"], x=SENTENCES_TO_FIX) + _fmt(TEXT_TASK_TEMPLATES["formal"], x=INFORMAL_SENTENCES),
        "math": _math_prompts(),
    }


# --------------------------------------------------------------------------------------------
# order, ids, held-out split


def _digest(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()


def prompt_id(prompt: str) -> str:
    """A stable id from the prompt's text (survives changes to the word lists)."""
    return "p" + _digest(prompt)[:12]


def kit_held_out() -> frozenset[str]:
    """The held-out prompts of scripts/train_assistant_kit.py (read as a literal, without importing it)."""
    try:
        tree = ast.parse(KIT_SCRIPT.read_text())
    except OSError:
        return frozenset()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELD_OUT" for t in node.targets):
            return frozenset(ast.literal_eval(node.value))
    return frozenset()


def is_held_out(prompt: str, kit: frozenset[str] | None = None) -> bool:
    return int(_digest(prompt)[:8], 16) % HELD_OUT_EVERY == 0 or prompt in (kit_held_out() if kit is None else kit)


def ordered_prompts(seed: int = SEED) -> list[tuple[str, str]]:
    """(family, prompt) for every distinct prompt: each family shuffled with its own seeded RNG, then
    the families interleaved round-robin (in name order), first occurrence of a text kept."""
    shuffled = []
    for name, prompts in sorted(families().items()):
        unique = sorted(set(prompts))
        random.Random(f"{seed}:{name}").shuffle(unique)
        shuffled.append((name, unique))
    seen: set[str] = set()
    order = []
    for row in itertools.zip_longest(*[[(name, p) for p in prompts] for name, prompts in shuffled]):
        for entry in row:
            if entry is not None and entry[1] not in seen:
                seen.add(entry[1])
                order.append(entry)
    return order


def split(seed: int = SEED) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(training prompts, held-out prompts), each in the seeded order."""
    kit = kit_held_out()
    train, held = [], []
    for entry in ordered_prompts(seed):
        (held if is_held_out(entry[1], kit) else train).append(entry)
    return train, held


def held_out_prompts(seed: int = SEED) -> list[str]:
    return [p for _, p in split(seed)[1]]


def pool_fingerprint(seed: int = SEED) -> str:
    return hashlib.sha256("\n".join(p for _, p in ordered_prompts(seed)).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------------------------
# corpus files


def read_parts(corpus: Path) -> list[tuple[Path, list[dict]]]:
    parts = []
    for path in sorted(corpus.glob("part-*.jsonl")):
        rows = []
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:  # a torn last line of an interrupted run
                    print(f"warning: skipped an unreadable line in {path.name}", file=sys.stderr)
        parts.append((path, rows))
    return parts


def next_part_path(corpus: Path) -> Path:
    numbers = [int(p.stem.split("-")[1]) for p in corpus.glob("part-*.jsonl")]
    return corpus / f"part-{(max(numbers) + 1) if numbers else 0:04d}.jsonl"


class PartWriter:
    """Appends JSON lines to a new part file, rolling to the next part near PART_MAX_BYTES."""

    def __init__(self, corpus: Path, max_bytes: int = PART_MAX_BYTES):
        self.corpus, self.max_bytes = corpus, max_bytes
        self.fh = None
        self.paths: list[Path] = []

    def write(self, row: dict) -> None:
        line = json.dumps(row, ensure_ascii=False) + "\n"
        if self.fh is None or self.fh.tell() + len(line.encode()) > self.max_bytes:
            self.close()
            path = next_part_path(self.corpus)
            self.paths.append(path)
            self.fh = path.open("a", encoding="utf-8")
        self.fh.write(line)
        self.fh.flush()

    def close(self) -> None:
        if self.fh is not None:
            self.fh.close()
            self.fh = None


def write_manifest(corpus: Path, info: dict) -> dict:
    parts = read_parts(corpus)
    rows = [row for _, part_rows in parts for row in part_rows]
    finish: dict[str, int] = {}
    fams: dict[str, int] = {}
    for r in rows:
        finish[r["finish_reason"]] = finish.get(r["finish_reason"], 0) + 1
        fams[r.get("family", "?")] = fams.get(r.get("family", "?"), 0) + 1
    out_tokens = sum(len(r["output_token_ids"]) for r in rows)
    manifest_path = corpus / "manifest.json"
    old = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest = {
        "answers": len(rows),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(len(r.get("prompt_token_ids") or []) for r in rows),
        "mean_answer_tokens": round(out_tokens / len(rows), 1) if rows else None,
        "finish_reasons": dict(sorted(finish.items())),
        "families": dict(sorted(fams.items())),
        "parts": [
            {"file": p.name, "answers": len(r), "bytes": p.stat().st_size,
             "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for p, r in parts
        ],
        "model": info.get("model", old.get("model")),
        "settings": info.get("settings", old.get("settings")),
        "prompt_pool": info.get("prompt_pool", old.get("prompt_pool")),
        "runs": old.get("runs", []) + ([info["run"]] if "run" in info else []),
    }
    measurements = old.get("batch_size_measurements", []) + info.get("batch_size_measurements", [])
    if measurements:
        manifest["batch_size_measurements"] = measurements
    manifest_path.write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return manifest


# --------------------------------------------------------------------------------------------
# generation


def engine_env(kv_space_gib: int, reserved_cpus: int) -> None:
    """The settings the server gives a CPU engine (lmi_server.engine), set before vLLM is imported
    (a variable already set wins). vLLM's CPU worker by default leaves one core to its scheduler
    process; on the 2-core host that halves the worker's threads, and measured output tokens/s at
    128 in flight were higher with both cores given to the worker (see manifest.json)."""
    from lmi_server.engine import CPU_ENGINE_ENV, TELEMETRY_OFF_ENV

    for key, value in {**TELEMETRY_OFF_ENV, **CPU_ENGINE_ENV, "PYTHONHASHSEED": "0",
                       "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib), "TOKENIZERS_PARALLELISM": "false"}.items():
        os.environ.setdefault(key, value)
    if reserved_cpus >= 0:
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", str(reserved_cpus))


def model_info(model: Path) -> dict:
    cfg = json.loads((model / "config.json").read_text())
    stamp = model / "lmi_assistant.stamp"
    return {
        "served_name": "smollm2-135m-instruct", "path": str(model), "architecture": cfg.get("architectures"),
        "stored_dtype": cfg.get("dtype") or cfg.get("torch_dtype"),
        "stamp": stamp.read_text().strip() if stamp.is_file() else None,
        "weights_sha256": hashlib.sha256((model / "model.safetensors").read_bytes()).hexdigest(),
    }


def build_llm(model: Path, max_num_seqs: int, max_model_len: int, prefix_caching: bool):
    from vllm import LLM

    return LLM(
        model=str(model), dtype="float32", enforce_eager=True, max_num_seqs=max_num_seqs,
        max_model_len=max_model_len, seed=0, enable_prefix_caching=prefix_caching,
        disable_log_stats=True,
    )


def chat_token_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sampling_params(max_tokens: int):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, output_kind=RequestOutputKind.FINAL_ONLY)


def run_requests(llm, items: list[dict], sp, in_flight: int, on_done) -> dict:
    """Continuous batching with at most `in_flight` requests in the engine; `on_done(item, output)`."""
    engine = llm.llm_engine
    pending = iter(items)
    running: dict[str, dict] = {}
    out_tokens = 0
    t0 = time.perf_counter()
    last_report = t0
    done = 0
    while True:
        while len(running) < in_flight:
            item = next(pending, None)
            if item is None:
                break
            rid = f"{item['id']}#{done + len(running)}"
            engine.add_request(rid, {"prompt_token_ids": item["prompt_token_ids"]}, sp)
            running[rid] = item
        if not running:
            break
        for output in engine.step():
            if output.finished:
                item = running.pop(output.request_id)
                out_tokens += len(output.outputs[0].token_ids)
                done += 1
                on_done(item, output)
        now = time.perf_counter()
        if now - last_report > 30:
            last_report = now
            print(f"  {done}/{len(items)} answers, {out_tokens} tokens, {out_tokens / (now - t0):.1f} tok/s", flush=True)
    wall = time.perf_counter() - t0
    return {"answers": done, "output_tokens": out_tokens, "wall_s": round(wall, 2),
            "output_tokens_per_s": round(out_tokens / wall, 2) if wall else None}


def select(train: list[tuple[str, str]], start: int, count: int, have: set[str]) -> list[tuple[int, str, str]]:
    chosen = []
    for index in range(start, len(train)):
        family, prompt = train[index]
        if prompt_id(prompt) in have:
            continue
        chosen.append((index, family, prompt))
        if len(chosen) >= count:
            break
    return chosen


def main_generate(args) -> None:
    engine_env(args.kv_space, args.reserved_cpus)
    from lmi_server.demo.assistant import ensure_assistant

    model = Path(args.model) if args.model else ensure_assistant()
    corpus = Path(args.out)
    corpus.mkdir(parents=True, exist_ok=True)
    train, held = split(args.seed)
    have = {r["id"] for _, rows in read_parts(corpus) for r in rows}
    todo = select(train, args.start, args.count, have) if args.count else []
    bench_sizes = [int(b) for b in args.bench.split(",")] if args.bench else []
    if not todo and not bench_sizes:
        print("nothing to do")
        return
    print(f"{len(train)} training prompts, {len(held)} held out; {len(have)} answers present; generating {len(todo)}"
          + (f"; benchmarking in-flight sizes {bench_sizes}" if bench_sizes else ""), flush=True)
    t0 = time.perf_counter()
    llm = build_llm(model, max([args.batch, *bench_sizes]), args.max_model_len, prefix_caching=not bench_sizes)
    startup = time.perf_counter() - t0
    print(f"engine ready in {startup:.1f} s", flush=True)
    tok = llm.get_tokenizer()
    sp = sampling_params(args.max_tokens)
    settings = {
        "engine": "vllm.LLM (in-process, CPU backend)", "vllm": _vllm_version(), "dtype": "float32",
        "enforce_eager": True, "temperature": 0.0, "max_tokens": args.max_tokens, "max_model_len": args.max_model_len,
        "chat_template": "the model's (tokenizer.apply_chat_template, add_generation_prompt=True; no system message given)",
        "in_flight": args.batch,
        "env": {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_NUM_OF_RESERVED_CPU",
                                               "VLLM_CPU_OMP_THREADS_BIND", "ONEDNN_PRIMITIVE_CACHE_CAPACITY")},
        "host_cpus": os.cpu_count(),
    }
    info: dict = {
        "model": model_info(model), "settings": settings,
        "prompt_pool": {"generator_version": GENERATOR_VERSION, "seed": args.seed, "distinct": len(train) + len(held),
                        "training": len(train), "held_out": len(held), "fingerprint": pool_fingerprint(args.seed),
                        "held_out_rule": f"sha1(prompt) mod {HELD_OUT_EVERY} == 0, plus train_assistant_kit HELD_OUT"},
    }

    if bench_sizes:
        # The same prompts at each size (prefix caching off so no size gets the others' prefills).
        items = [{"id": prompt_id(p), "prompt_token_ids": chat_token_ids(tok, p)} for _, p in train[: args.bench_prompts]]
        run_requests(llm, items[:8], sampling_params(16), 8, lambda *a: None)  # warm-up
        results = []
        bench_sp = sampling_params(args.bench_max_tokens or args.max_tokens)
        for size in bench_sizes:
            lengths = []
            r = run_requests(llm, items, bench_sp, size, lambda item, out: lengths.append(len(out.outputs[0].token_ids)))
            r.update(in_flight=size, prompts=len(items), mean_answer_tokens=round(sum(lengths) / len(lengths), 1))
            print(f"in flight {size}: {r}", flush=True)
            results.append(r)
        measured = {"max_tokens": args.bench_max_tokens or args.max_tokens, "engine_max_num_seqs": max(bench_sizes),
                    "env": settings["env"], "host_cpus": os.cpu_count(), "at": time.strftime("%Y-%m-%dT%H:%M:%S"), "results": results}
        info["batch_size_measurements"] = [measured]
        if args.bench_json:
            Path(args.bench_json).write_text(json.dumps(measured, indent=1) + "\n")

    if todo:
        writer = PartWriter(corpus)
        items = [{"id": prompt_id(p), "index": i, "family": f, "prompt": p, "prompt_token_ids": chat_token_ids(tok, p)}
                 for i, f, p in todo]

        def on_done(item: dict, output) -> None:
            completion = output.outputs[0]
            writer.write({**item, "answer": completion.text, "output_token_ids": list(completion.token_ids),
                          "finish_reason": completion.finish_reason})

        try:
            r = run_requests(llm, items, sp, args.batch, on_done)
        finally:
            writer.close()
        r.update(in_flight=args.batch, engine_startup_s=round(startup, 1), parts=[p.name for p in writer.paths],
                 first_index=todo[0][0], last_index=todo[-1][0], finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"))
        info["run"] = r
        print(f"run: {r}", flush=True)
    manifest = write_manifest(corpus, info)
    print(f"corpus: {manifest['answers']} answers, {manifest['output_tokens']} output tokens, "
          f"mean {manifest['mean_answer_tokens']} tokens per answer", flush=True)


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def main_dry_run(args) -> None:
    train, held = split(args.seed)
    chosen = held if args.held_out else train
    fams: dict[str, int] = {}
    for f, _ in chosen:
        fams[f] = fams.get(f, 0) + 1
    print(f"{len(train) + len(held)} distinct prompts: {len(train)} training, {len(held)} held out "
          f"(fingerprint {pool_fingerprint(args.seed)})")
    print(f"{'held-out' if args.held_out else 'training'} prompts per family: {json.dumps(fams)}")
    start = 0 if args.held_out else args.start
    for i in range(start, min(start + args.sample, len(chosen))):
        f, p = chosen[i]
        print(f"[{i}] ({f}) {p!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=0, help="answers to generate (prompts already answered are skipped)")
    ap.add_argument("--start", type=int, default=0, help="first position in the training order")
    ap.add_argument("--dry-run", action="store_true", help="print the pool's size and a sample of prompts")
    ap.add_argument("--held-out", action="store_true", help="with --dry-run: show the held-out prompts")
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--batch", type=int, default=256, help="requests in flight (engine max_num_seqs)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--kv-space", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE in GiB (when not set)")
    ap.add_argument("--reserved-cpus", type=int, default=0,
                    help="VLLM_CPU_NUM_OF_RESERVED_CPU when not set (-1: vLLM's default, one core kept for the scheduler)")
    ap.add_argument("--model", help="model directory (default: ensure_assistant())")
    ap.add_argument("--out", default=str(CORPUS_DIR))
    ap.add_argument("--bench", help="comma-separated in-flight sizes to measure on the same prompts, e.g. 32,64,128")
    ap.add_argument("--bench-prompts", type=int, default=256)
    ap.add_argument("--bench-max-tokens", type=int, help="max_tokens of the measurement (default: --max-tokens)")
    ap.add_argument("--bench-json", help="also write the measurements to this file")
    args = ap.parse_args(argv)
    if args.dry_run:
        main_dry_run(args)
    else:
        main_generate(args)


if __name__ == "__main__":
    main()
