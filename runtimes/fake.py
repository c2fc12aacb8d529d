"""A runtime with no model: a deterministic, word-per-token echo.

It ships in the package (as httpx ships ``MockTransport``) so the manager, worker, server,
TUI and CLI can be tested and demonstrated in milliseconds, and so the runtime contract
tests have a second implementation to keep the protocol honest. It follows the same rules
as llama.cpp: a chat template from the record's metadata when there is one, ContextOverflow
past ``n_ctx - 1``, ``max_tokens`` capped by the context, stop strings cut, cancel checked
every step, usage on the last chunk and prefix reuse reported as ``cached_tokens``.

The answer is ``"You said: <last user message>."`` followed by filler words: a fixed
cycle when ``temperature == 0``, seeded random words otherwise. It ends ("stop") after
``plan.options["fake_reply_words"]`` filler words (default 48). ``plan.options["fake_delay_s"]``
sleeps before each token, to make streams slow enough to cancel or kill mid-way; ``fake_load_s`` sleeps
in the load, to make a load slow enough to stop the server during it.
``plan.options["fake_think_words"]`` makes it a reasoning model: the answer opens with
``<think>`` and that many words, ``</think>``, unless ``ChatRequest.prefix`` already closed
the reasoning (a budget's continuation, which it honours as llama.cpp does).

Capabilities are what ``plan.options["fake_capabilities"]`` lists (default: embeddings only,
so by default it stands for a runtime that refuses tools, JSON schemas and logprobs). With
them declared it honours the fields the way a real runtime would, in the same words:

* ``json_schema``: the answer is the smallest JSON instance of the schema (``{}`` for any
  object) — valid by construction, as a grammar-constrained model's would be;
* ``tools``: tools reach the prompt through :mod:`localrun.chat.tools`; when ``tool_choice``
  forces a call, or the last user message says ``call NAME`` for one of the tools, the
  answer is a Hermes ``<tool_call>`` whose arguments are the smallest instance of the
  function's parameters, recognised by the same parser as llama.cpp's answers;
* ``logprobs``: every token gets a log-probability below zero and ``n`` alternatives;
* ``n``: the choices are answered one after another (seed + i each), chunks tagged with
  their index, the usage (prompt once, completions summed) on the very last chunk.

Embeddings come with their tokens counted (``serve_embed_usage``), words being its tokens.

Media: a record with a projector sees images by default (``fake_capabilities`` may list ``vision``,
``audio``); the answer says what arrived, for exact wire tests: ``[media: image/png 68B, …]``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import re
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from localrun import __version__
from localrun.chat import tools as toolcalls
from localrun.chat.template import fallback_chat, render_chat
from localrun.errors import ContextOverflow, RuntimeUnavailable, UnsupportedFeature
from localrun.runtimes.base import RuntimeStatus
from localrun.runtimes.llamacpp.text import TextAssembler
from localrun.types import (
    AUDIO,
    META_PROJECTOR,
    VISION,
    Cancel,
    ChatRequest,
    Chunk,
    CompletionRequest,
    Format,
    Media,
    ModelRecord,
    Plan,
    Sampling,
    Usage,
    logprob_entry,
)

log = logging.getLogger(__name__)

_FILLER = (
    "the quick brown fox jumps over a lazy dog while seven small llamas count tokens "
    "under a quiet sky and nobody minds the weather"
).split()

if TYPE_CHECKING:
    from localrun.planning.hardware import HardwareProfile
_TOKEN = re.compile(r"\s*\S+")
EMBED_DIM = 16


def fake_tokenize(text: str) -> list[str]:
    """The fake vocabulary: one token per word, carrying its leading whitespace."""
    return _TOKEN.findall(text)


class FakeRuntime:
    name: ClassVar[str] = "fake"
    formats: ClassVar[frozenset[Format]] = frozenset(Format)
    in_worker: ClassVar[bool] = False
    #: Not probed, never chosen for a model by the planner: only ``--runtime fake`` runs it.
    listed: ClassVar[bool] = False

    def probe(self, hw: HardwareProfile | None = None) -> RuntimeStatus:
        return RuntimeStatus(
            name=self.name,
            available=True,
            version=__version__,
            devices=("cpu",),
            reason="no model: a deterministic echo for tests and demos",
        )

    def load(self, model: ModelRecord, plan: Plan) -> FakeSession:
        return FakeSession(model, plan)

    def media_before_load(self, model: ModelRecord, plan: Plan) -> frozenset[str]:
        """The media a session would take (the manager refuses others before loading)."""
        return _capabilities(model, plan) & {VISION, AUDIO}


def _capabilities(model: ModelRecord, plan: Plan, declared: frozenset[str] | None = None) -> frozenset[str]:
    """What a session declares: the plan's ``fake_capabilities`` when listed, else its class's
    own (``declared``, a subclass's included) plus vision for a record with a projector."""
    if "fake_capabilities" in plan.options:
        return frozenset(plan.options["fake_capabilities"] or ())
    base = FakeSession.capabilities if declared is None else declared
    return base | ({VISION} if model.metadata.get(META_PROJECTOR) else set())


class FakeSession:
    capabilities: frozenset[str] = frozenset({"embeddings"})

    def __init__(self, model: ModelRecord, plan: Plan) -> None:
        self.model = model
        self.plan = plan
        self.capabilities = _capabilities(model, plan, type(self).capabilities)
        self._delay = float(plan.options.get("fake_delay_s", 0) or 0)
        time.sleep(float(plan.options.get("fake_load_s", 0) or 0))  # a slow load, for shutdown races
        self._reply_words = int(plan.options.get("fake_reply_words", 48))
        self._think_words = int(plan.options.get("fake_think_words", 0))
        self._last_prompt: list[str] = []
        self._closed = False

    # --- the protocol ---------------------------------------------------------------

    def chat(self, req: ChatRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_capabilities(req.sampling, req)
        template = self.model.metadata.get("tokenizer.chat_template") or self.model.metadata.get("chat_template")
        stops: tuple[str, ...] = ()
        messages, variables = toolcalls.prompt_messages(req, template)
        if template:
            prompt = render_chat(template, messages, bos_token="<s>", eos_token="</s>", variables=variables)
        else:
            fallback = fallback_chat(messages)
            prompt, stops = fallback.text, fallback.stop
        prompt += req.prefix
        last_user = next((m.content for m in reversed(req.messages) if m.role == "user"), "")
        exact = self._tool_call(req, last_user) or self._json_answer(req.sampling)
        head = exact or f"You said: {last_user.strip()}.{media_note(req.media)}"
        if self._think_words and "</think>" not in req.prefix:  # a reasoning model's answer: think first
            head = (
                "<think> " + " ".join(_FILLER[i % len(_FILLER)] for i in range(self._think_words)) + " </think> " + head
            )
        stream = self._generate(prompt, head, req.sampling, cancel, stops, filler=exact is None)
        return toolcalls.with_tool_calls(stream, req)

    def complete(self, req: CompletionRequest, cancel: Cancel) -> Iterator[Chunk]:
        self._check_capabilities(req.sampling, None, req.media)
        tail = " ".join(req.prompt.split()[-8:])
        exact = self._json_answer(req.sampling)
        head = exact or f" ... {tail}.{media_note(req.media)}"
        return self._generate(req.prompt, head, req.sampling, cancel, (), filler=exact is None)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Deterministic unit vectors from a hash of each text: equal texts, equal vectors."""
        if "embeddings" not in self.capabilities:
            raise UnsupportedFeature(
                f"embeddings are not supported by the fake runtime serving {self.model.name}",
                param="input",
                hint="use a model whose runtime declares embeddings",
            )
        out = []
        for text in texts:
            digest = hashlib.sha256(text.encode()).digest()
            vec = [b / 255.0 - 0.5 for b in digest[:EMBED_DIM]]
            norm = sum(v * v for v in vec) ** 0.5 or 1.0
            out.append([v / norm for v in vec])
        return out

    def serve_embed_usage(self, inputs: Sequence[str]) -> dict[str, Any]:
        if any(not isinstance(x, str) for x in inputs):
            raise UnsupportedFeature(
                "token-id inputs are not supported by the fake runtime", param="input", hint="send the input as text"
            )
        return {"embeddings": self.embed(inputs), "prompt_tokens": sum(len(fake_tokenize(t)) for t in inputs)}

    def serve_props(self) -> dict[str, Any]:
        """The facts /props shows, as the llama.cpp session gives them."""
        template = self.model.metadata.get("tokenizer.chat_template") or self.model.metadata.get("chat_template") or ""
        return {
            "n_ctx": self.plan.n_ctx,
            "total_slots": 1,
            "n_vocab": 0,
            "chat_template": template,
            "chat_template_source": "gguf" if template else "fallback",
            "bos_token": "<s>",
            "eos_token": "</s>",
            "fim": False,
            "pooling": None,
            "capabilities": sorted(self.capabilities),
        }

    def close(self) -> None:
        self._closed = True

    # --- capabilities -------------------------------------------------------------------

    def _check_capabilities(self, sampling: Sampling, req: ChatRequest | None, media: tuple[Media, ...] = ()) -> None:
        """The runtime's own refusal, for callers that skip the server's check (CLI, TUI)."""
        kinds = {m.kind for m in (req.media if req is not None else media)}
        asked = [
            ("images", VISION, "image" in kinds),
            ("audio", AUDIO, "audio" in kinds),
            ("logprobs", "logprobs", sampling.logprobs is not None),
            ("response_format", "json_schema", sampling.json_schema is not None),
            ("grammar", "grammar", sampling.grammar is not None),
            ("n", "n", sampling.n > 1),
            (
                "tools",
                "tools",
                bool(req and (req.tools or any(m.tool_calls or m.role == "tool" for m in req.messages))),
            ),
        ]
        for param, capability, on in asked:
            if on and capability not in self.capabilities:
                raise UnsupportedFeature(
                    f"{param!r} is not supported by the fake runtime serving {self.model.name}",
                    param=param,
                    hint="remove the field from the request",
                )

    def _tool_call(self, req: ChatRequest, last_user: str) -> str | None:
        """A Hermes call when tool_choice forces one or the user says "call NAME"."""
        if not toolcalls.active(req):
            return None
        forced = toolcalls.forced_call(req, toolcalls.HERMES)
        by_name = {t["function"]["name"]: t["function"] for t in req.tools if isinstance(t.get("function"), dict)}
        if isinstance(req.tool_choice, dict):
            name = (req.tool_choice.get("function") or {}).get("name")
        else:
            said = re.search(r"\bcall\s+([\w.-]+)", last_user)
            name = said.group(1) if said and said.group(1) in by_name else (next(iter(by_name)) if forced else None)
        if name not in by_name:
            return None
        args = _instance(by_name[name].get("parameters") or {"type": "object"}, "tools")
        return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"

    @staticmethod
    def _json_answer(sampling: Sampling) -> str | None:
        if sampling.json_schema is None:
            return None
        return json.dumps(_instance(sampling.json_schema or {"type": "object"}, "response_format"))

    # --- generation ---------------------------------------------------------------------

    def _answer_tokens(self, head: str, sampling: Sampling, filler: bool) -> list[str]:
        if not filler:
            return fake_tokenize(head)
        if sampling.temperature and sampling.temperature > 0:
            rng = random.Random(sampling.seed)
            words = [rng.choice(_FILLER) for _ in range(self._reply_words)]
        else:
            words = [_FILLER[i % len(_FILLER)] for i in range(self._reply_words)]
        return fake_tokenize(head + " " + " ".join(words))

    def _generate(
        self,
        prompt: str,
        head: str,
        sampling: Sampling,
        cancel: Cancel,
        extra_stops: tuple[str, ...],
        *,
        filler: bool = True,
    ) -> Iterator[Chunk]:
        if self._closed:
            raise RuntimeUnavailable("this fake session is closed", hint="load the model again")
        tokens = fake_tokenize(prompt)
        n_ctx = self.plan.n_ctx
        if len(tokens) > n_ctx - 1:
            raise ContextOverflow(
                f"the prompt is {len(tokens)} tokens but the context holds {n_ctx} (at most {n_ctx - 1} for the "
                "prompt)",
                hint="shorten the conversation or load the model with a larger context",
            )
        # Validation happens above, eagerly; the stream itself is a generator.
        if sampling.n > 1:
            return self._choices(tokens, head, sampling, cancel, extra_stops, filler)
        return self._stream(tokens, self._answer_tokens(head, sampling, filler), sampling, cancel, extra_stops)

    def _choices(
        self,
        tokens: list[str],
        head: str,
        sampling: Sampling,
        cancel: Cancel,
        extra_stops: tuple[str, ...],
        filler: bool,
    ) -> Iterator[Chunk]:
        produced = 0
        for i in range(sampling.n):
            own = dataclasses.replace(sampling, n=1, seed=None if sampling.seed is None else sampling.seed + i)
            for chunk in self._stream(tokens, self._answer_tokens(head, own, filler), own, cancel, extra_stops):
                if chunk.finish_reason == "cancelled":
                    yield chunk
                    return
                usage = chunk.usage
                if usage is not None:
                    produced += usage.completion_tokens
                    usage = dataclasses.replace(usage, completion_tokens=produced) if i == sampling.n - 1 else None
                yield dataclasses.replace(chunk, index=i, usage=usage)

    def _stream(
        self, tokens: list[str], answer: list[str], sampling: Sampling, cancel: Cancel, extra_stops: tuple[str, ...]
    ) -> Iterator[Chunk]:
        cached = 0
        for a, b in zip(tokens, self._last_prompt):
            if a != b:
                break
            cached += 1
        cached = min(cached, len(tokens) - 1) if tokens else 0
        self._last_prompt = tokens
        room = self.plan.n_ctx - len(tokens)
        limit = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        text = TextAssembler((*sampling.stop, *extra_stops))
        produced = 0
        logprobs: list[dict[str, Any]] = []  # of tokens whose text is not out yet

        def final(reason: str, tail: str = "") -> Chunk:
            usage = Usage(prompt_tokens=len(tokens), completion_tokens=produced, cached_tokens=cached)
            return Chunk(text=tail, finish_reason=reason, usage=usage, logprobs=tuple(logprobs))

        while True:
            if cancel.is_set():
                yield final("cancelled", text.finish())
                return
            if produced >= limit:
                yield final("length", text.finish())
                return
            if produced >= len(answer):
                yield final("stop", text.finish())
                return
            if self._delay:
                time.sleep(self._delay)
            piece, stopped = text.feed(answer[produced].encode())
            if sampling.logprobs is not None:
                logprobs.append(fake_logprob(answer[produced], sampling.logprobs))
            produced += 1
            if stopped:
                yield final("stop", piece)
                return
            if piece:
                yield Chunk(text=piece, logprobs=tuple(logprobs))
                logprobs.clear()


def media_note(media: tuple[Media, ...]) -> str:
    """What the answer says about the request's media: `` [media: image/png 68B, …]``, or nothing."""
    if not media:
        return ""
    return " [media: " + ", ".join(f"{m.mime or m.kind} {len(m.data)}B" for m in media) + "]"


def fake_logprob(token: str, top_n: int) -> dict[str, Any]:
    """A deterministic log-probability in [-1, -0.05] for ``token`` and ``top_n`` alternatives,
    the chosen token first, each below the one before."""
    chosen = -0.05 - (int(hashlib.sha256(token.encode()).hexdigest()[:4], 16) % 96) / 100

    others = [" " + w for w in dict.fromkeys(_FILLER) if " " + w != token]
    alts = [logprob_entry(token, chosen)] + [logprob_entry(w, chosen - 0.5 * (i + 1)) for i, w in enumerate(others)]
    return {**logprob_entry(token, chosen), "top_logprobs": alts[:top_n]}


def _instance(schema: Any, param: str) -> Any:
    """:func:`minimal_instance`, with a malformed schema refused as llama.cpp's compiler refuses it."""
    try:
        return minimal_instance(schema)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise UnsupportedFeature(
            f"the JSON schema in {param!r} cannot be compiled: {type(exc).__name__}: {exc}",
            param=param,
            hint="send a valid JSON Schema",
        ) from exc


def minimal_instance(schema: Any, root: Any = None, depth: int = 0) -> Any:
    """The smallest JSON value valid against ``schema``, for the schemas people send:
    local ``$ref``, const, enum, anyOf/oneOf/allOf (the first branch), type (lists too),
    required and listed properties, minItems, minLength, minimum / exclusiveMinimum."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 32:
        return None
    if "$ref" in schema:
        target: Any = root
        for part in str(schema["$ref"]).lstrip("#/").split("/"):
            target = target.get(part, {}) if part and isinstance(target, dict) else target
        return minimal_instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return minimal_instance(schema[key][0], root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or kind is None:
        props = schema.get("properties") or {}
        return {k: minimal_instance(v, root, depth + 1) for k, v in props.items()}
    if kind == "array":
        return [
            minimal_instance(schema.get("items") or {}, root, depth + 1) for _ in range(int(schema.get("minItems", 0)))
        ]
    if kind == "string":
        return "x" * int(schema.get("minLength", 0))
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + (1 if "exclusiveMinimum" in schema else 0))
        return int(low) if kind == "integer" else float(low)
    return {"boolean": True, "null": None}.get(kind)
