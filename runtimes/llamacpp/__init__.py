"""The llama.cpp runtime, one room of its own.

Parts, from the outside in. Each class is one object holding its collaborators (no mixins):

* :mod:`.session`   — ``LlamaCppRuntime`` and its session: owns the context, turns requests into
  scheduler jobs; it holds the parts below. :mod:`.context` loads the model and sizes the context.
* :mod:`.prompting` — tokens, chat text, fill-in-the-middle and media prompts (:mod:`.tokens`,
  :mod:`.token_split`, :mod:`.turns` beneath it).
* :mod:`.extras`, :mod:`.slot_api` — llama-server's utility calls and slot API, on public
  scheduler and cache methods.
* :mod:`.scheduler` — continuous batching: one decode step for every running sequence;
  :mod:`.job` is one request in it, :mod:`.calls` the native work other threads hand it,
  :mod:`.decode_calls` its ``llama_decode`` calls.
* :mod:`.speculative` — speculative decoding: n-gram and draft-model drafts, the policy,
  verification passes.
* :mod:`.cache`     — the slots, the prefix cache over them, host RAM, checkpoints and the disk tier.
* :mod:`.media`     — images and audio: the projector, media prompts, their prefill, decoding files.
* :mod:`.features`  — tools, JSON schemas, grammars, logprobs and embeddings for a session.
* :mod:`.grammar`   — GBNF samplers and the logprob reader.
* :mod:`.embed`     — the embedding context and pooling.
* :mod:`.decode`    — sampler chains, batch filling, the token-to-bytes reader.
* :mod:`.text`      — incremental detokenising and stop strings.

Nothing here imports ``llama_cpp`` at module level except through :func:`.context.llama_lib`;
the registry names ``localrun.runtimes.llamacpp.session:LlamaCppRuntime``.
"""
