"""The tool-use cases of bench_tools.py, in the shape of BFCL's categories: ``simple`` (one
function offered, the question asks for it), ``multiple`` (several offered, one is right),
``parallel`` (one question, two calls), ``irrelevance`` (functions offered, none fits: the
right answer is no call). Written here from a handful of functions and values, 207 cases."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    params = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


WEATHER = _fn(
    "get_weather",
    "Current weather in a city",
    {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city"],
)
CONVERT = _fn(
    "convert_currency",
    "Convert an amount of money between currencies",
    {
        "amount": {"type": "number", "minimum": 0},
        "from_currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
        "to_currency": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
    },
    ["amount", "from_currency", "to_currency"],
)
TIMER = _fn(
    "set_timer",
    "Start a countdown timer",
    {"minutes": {"type": "integer", "minimum": 1, "maximum": 120}, "label": {"type": "string"}},
    ["minutes"],
)
EMAIL = _fn(
    "send_email",
    "Send an email",
    {"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}},
    ["to", "subject"],
)
SEARCH = _fn(
    "search_flights",
    "Find flights between two airports on a date",
    {
        "origin": {"type": "string", "minLength": 3, "maxLength": 3},
        "destination": {"type": "string", "minLength": 3, "maxLength": 3},
        "date": {"type": "string"},
    },
    ["origin", "destination"],
)
TRANSLATE = _fn(
    "translate",
    "Translate text into a language",
    {"text": {"type": "string"}, "language": {"type": "string", "enum": ["French", "German", "Spanish", "Italian"]}},
    ["text", "language"],
)
FUNCTIONS = (WEATHER, CONVERT, TIMER, EMAIL, SEARCH, TRANSLATE)

CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Nairobi", "Denver", "Hanoi", "Quito")
ASKS: dict[str, list[str]] = {
    "get_weather": [f"What is the weather like in {c} right now?" for c in CITIES]
    + [f"Is it cold in {c} today? Answer in fahrenheit." for c in CITIES]
    + [f"Should I take an umbrella in {c}?" for c in CITIES[::2]],
    "convert_currency": [
        f"Convert {a} {f} to {t}." for a, f, t in (("20", "USD", "EUR"), ("150", "GBP", "JPY"), ("7.5", "EUR", "USD"))
    ]
    + ["How many yen is 300 dollars?", "I have 80 euros, how much is that in pounds?"],
    "set_timer": [
        f"Set a timer for {m} minutes{lab}." for m, lab in (("5", ""), ("25", " for pasta"), ("45", " called study"))
    ]
    + ["Remind me in 10 minutes to check the oven."],
    "send_email": [
        "Email bob@example.com with the subject 'Lunch' and say I am late.",
        "Send an email to ana@example.org titled 'Report' saying the report is done.",
    ],
    "search_flights": ["Find flights from JFK to LHR on 2025-03-01.", "Any flights from CDG to NRT next Friday?"],
    "translate": ["Translate 'good morning' into French.", "How do you say 'thank you' in German?"],
}
IRRELEVANT = (
    "Write a haiku about autumn leaves.",
    "What is 17 times 23?",
    "Who wrote Pride and Prejudice?",
    "Explain photosynthesis in one sentence.",
    "Tell me a joke about cats.",
    "What is the capital of Australia?",
    "How many legs does a spider have?",
    "Give me a synonym for happy.",
    "Summarise the plot of Hamlet in two lines.",
    "What does HTTP stand for?",
)
PAIRS = (
    ("What is the weather in {a} and in {b}?", "get_weather", "get_weather"),
    ("Check the weather in {a} and set a timer for 15 minutes.", "get_weather", "set_timer"),
    ("Convert 10 USD to EUR and tell me the weather in {a}.", "convert_currency", "get_weather"),
    ("Translate 'hello' into Spanish and tell me the weather in {b}.", "translate", "get_weather"),
    ("Find flights from {a3} to {b3} and set a timer for 30 minutes.", "search_flights", "set_timer"),
    ("Email joe@example.com the subject 'Trip' and check the weather in {a}.", "send_email", "get_weather"),
)


@dataclass(frozen=True)
class Case:
    category: str
    question: str
    tools: tuple[dict[str, Any], ...]
    #: The functions a right answer calls (empty: no call is right).
    expected: tuple[str, ...]


def _by_name(name: str) -> dict[str, Any]:
    return next(f for f in FUNCTIONS if f["function"]["name"] == name)


def _offered(*names: str) -> tuple[dict[str, Any], ...]:
    return tuple({n: _by_name(n) for n in names}.values())


def cases() -> list[Case]:
    """Every case, categories interleaved (a subset from the front keeps every category)."""
    simple = [Case("simple", q, (_by_name(n),), (n,)) for n, qs in ASKS.items() for q in qs]
    multiple = []
    asked = [(n, q) for n, qs in ASKS.items() for q in qs]
    for i, (n, q) in enumerate(asked + asked):
        others = [f for f in FUNCTIONS if f["function"]["name"] != n]
        offered = [_by_name(n), *others[i % len(others) : i % len(others) + 2]] + others[:1]
        offered = list({f["function"]["name"]: f for f in offered}.values())
        offered = offered[i % len(offered) :] + offered[: i % len(offered)]  # the right one not always first
        multiple.append(Case("multiple", q, tuple(offered), (n,)))
    parallel = [
        Case("parallel", text.format(a=a, b=b, a3=a[:3].upper(), b3=b[:3].upper()), _offered(f1, f2), (f1, f2))
        for (text, f1, f2), (a, b) in itertools.product(PAIRS, itertools.pairwise(CITIES))
    ]
    irrelevance = [
        Case("irrelevance", q, tuple(FUNCTIONS[i % len(FUNCTIONS) : i % len(FUNCTIONS) + 3]) or FUNCTIONS[:3], ())
        for i, q in enumerate(q for q in IRRELEVANT for _ in range(6))
    ]
    groups = [simple, multiple, parallel, irrelevance]
    return [c for row in itertools.zip_longest(*groups) for c in row if c is not None]
