"""The fake runtime's optional capabilities, all of them: what a server "with everything" declares."""

from __future__ import annotations

ALL = ("tools", "json_schema", "logprobs", "embeddings", "n")
