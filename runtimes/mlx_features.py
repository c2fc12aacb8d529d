"""What an MLX session honours beyond plain sampling: tools and log-probabilities.

Kept out of :mod:`.mlx` so the session stays about loading, prompts and the KV cache.

* **tools**: the definitions reach the prompt through :mod:`localrun.chat.tools`, as for
  llama.cpp — the chat template's ``tools`` variable when it reads one, else the fallback
  system block; mlx-lm's own renderers (``chat_template_type`` modules, tokenizer classes
  with their own ``apply_chat_template``) get ``tools=`` and the history's tool turns as
  Hugging Face templates do. The answer's calls are parsed onto its last chunk
  (:func:`localrun.chat.tools.with_tool_calls`). A *forced* call (``tool_choice`` "required" or
  a named function) needs a grammar, which mlx-lm does not have: it is refused, never
  silently answered freely.
* **logprobs**: mlx-lm's generation step gives the log-softmax over the vocabulary for
  each token (after the repetition penalty when one is set, before temperature); the
  chosen token's value and the top ``k`` alternatives are read on the device, so only
  ``k + 1`` numbers leave it per token. Each entry's ``token``/``bytes`` are what that
  token adds to the answer's text (:class:`TokenText`), so the entries concatenate to it.
* ``json_schema`` and ``grammar`` are **not** supported (no grammar engine): the server
  answers 400 because the session does not declare them, and a caller that skips the
  server (CLI, TUI) gets the same :class:`~localrun.errors.UnsupportedFeature` here.

mlx is imported inside the functions that use it, as in :mod:`.mlx`.
"""

from __future__ import annotations

from typing import Any

from localrun.chat import tools
from localrun.errors import UnsupportedFeature
from localrun.types import ChatRequest, Sampling, logprob_entry

#: What every MLX session honours.
CAPABILITIES = frozenset({"tools", "logprobs"})

#: Stands for mlx-lm's own chat renderers, which take ``tools`` (and tool turns) like a
#: Hugging Face template that reads the variable: :func:`localrun.chat.tools.prompt_messages`
#: then shapes the messages for it.
RENDERER_TEMPLATE = "{{ tools }}"


def check_sampling(sampling: Sampling, model: str) -> None:
    """Refuse what MLX cannot honour, for callers that skip the server's capability check.

    Raises:
        UnsupportedFeature: a JSON schema or a grammar is asked for.
    """
    for param, value in (("response_format", sampling.json_schema), ("grammar", sampling.grammar)):
        if value is not None:
            raise UnsupportedFeature(
                f"{param!r} is not supported by the mlx runtime serving {model}: "
                "mlx-lm has no grammar engine to constrain the output",
                param=param,
                hint="remove the field, or use a GGUF model with llama.cpp",
            )


def chat_inputs(req: ChatRequest, template: str | None, model: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(messages, template variables) for a chat request; ``template`` is the one the prompt
    is rendered with (:data:`RENDERER_TEMPLATE` for mlx-lm's renderers, None for the fallback).

    Raises:
        UnsupportedFeature: ``tool_choice`` forces a call (or names a function not offered).
    """
    if tools.forced_call(req, tools.tool_style(template)) is not None:
        raise UnsupportedFeature(
            f"the MLX runtime serving {model} cannot force a tool call (tool_choice or function_call "
            f"{req.tool_choice!r}): "
            "it has no grammar engine to make the model emit one",
            param="tool_choice",
            hint="use tool_choice 'auto' (the model may call a tool) or a llama.cpp model",
        )
    return tools.prompt_messages(req, template)


class TokenText:
    """What each token adds to the answer's text, as mlx-lm's streaming detokenizer writes it.

    SentencePiece and byte-level BPE vocabularies map a token to its raw bytes (a token
    that is part of a UTF-8 character has just its bytes), with the leading space the
    detokenizer drops at the start of an answer dropped too. Other tokenizers are decoded
    as mlx-lm's naive detokenizer does, line by line, each token being the difference it
    makes to the last few tokens of its line. One per session; :meth:`cursor` follows one answer.
    """

    #: Tokens of context a token is decoded after (enough to finish a character or respace).
    WINDOW = 8

    def __init__(self, tokenizer: Any) -> None:
        from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, _byte_decoder

        detok = tokenizer.detokenizer
        self.decode = tokenizer.decode
        self.table: list[bytes] | None = None
        self.trim_space = True
        # When the leading space stops being dropped: SentencePiece's detokenizer drops it
        # until some text survives; the BPE one only from the first bytes it writes out.
        self.trim_until_text = False
        if isinstance(detok, SPMStreamingDetokenizer):
            sep = "\u2581".encode()
            self.table = [raw.replace(sep, b" ") for raw in detok.tokenmap]
            self.trim_space, self.trim_until_text = detok.trim_space, True
        elif isinstance(detok, BPEStreamingDetokenizer):
            byte_of = _byte_decoder()
            self.table = [
                b"".join(bytes([byte_of[c]]) if c in byte_of else c.encode() for c in piece) for piece in detok.tokenmap
            ]

    def cursor(self) -> TokenCursor:
        return TokenCursor(self)


class TokenCursor:
    """Position in one answer: :meth:`bytes_of` a candidate token here, :meth:`advance` past the chosen one."""

    def __init__(self, text: TokenText) -> None:
        self._text = text
        self._started = False  # some text was written (no leading space to drop any more)
        self._context: list[int] = []  # naive decoding: the last tokens of the current line
        self._context_text = ""

    def bytes_of(self, token: int) -> bytes:
        table = self._text.table
        if table is not None:
            raw = table[token] if 0 <= token < len(table) else b""
            if not self._started and self._text.trim_space and raw.startswith(b" "):
                raw = raw[1:]
            return raw
        decoded: str = self._text.decode([*self._context, token])
        prev = self._context_text
        if not decoded.startswith(prev):  # a character completed or respaced: keep what differs
            common = 0
            for a, b in zip(prev, decoded):
                if a != b:
                    break
                common += 1
            return decoded[common:].encode()
        return decoded[len(prev) :].encode()

    def advance(self, token: int, raw: bytes) -> None:
        text = self._text
        if text.table is not None:
            whole = text.table[token] if 0 <= token < len(text.table) else b""
            self._started = self._started or bool(raw if text.trim_until_text else whole)
            return
        context = [*self._context, token]
        if text.decode(context).endswith("\n"):  # the naive detokenizer starts a new line
            self._context, self._context_text = [], ""
        else:
            self._context = context[-text.WINDOW :]
            self._context_text = text.decode(self._context)


class LogprobTrack:
    """The entries of one answer. ``read`` each generated token (not an end-of-generation
    token) with mlx-lm's log-probability vector for its position; entries go to ``entries``."""

    def __init__(self, text: TokenText, top_n: int) -> None:
        self._cursor = text.cursor()
        self._top_n = max(int(top_n), 0)
        self.entries: list[dict[str, Any]] = []

    def read(self, token: int, logprobs: Any) -> None:
        import mlx.core as mx

        lp = logprobs.astype(mx.float32)
        lp = lp - mx.logsumexp(lp)  # exact in float32 whatever dtype the model computes in
        n = min(self._top_n, lp.shape[-1])
        chosen = lp[token]
        if n > 0:
            best = mx.argpartition(-lp, kth=n - 1)[:n]
            values = lp[best]
            order = mx.argsort(-values)
            best, values = best[order], values[order]
            mx.eval(chosen, best, values)
            ids: list[int] = best.tolist()  # type: ignore[assignment]  # a 1-D array's list
            scores: list[float] = values.tolist()
            alts = [(int(t), float(v)) for t, v in zip(ids, scores)]
        else:
            alts = []
        cursor = self._cursor
        raw = cursor.bytes_of(token)
        entry = logprob_entry(raw, float(chosen.item()))
        entry["top_logprobs"] = [logprob_entry(cursor.bytes_of(t), v) for t, v in alts]
        cursor.advance(token, raw)
        self.entries.append(entry)
