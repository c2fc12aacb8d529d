"""Images and audio for a llama.cpp session.

* :mod:`.session` — what a session does with a request's media (the projector, "vision"/"audio").
* :mod:`.prompt` — a prompt with media chunks in it (pseudo token ids where the embeddings go).
* :mod:`.mtmd` — the projector through libmtmd: tokenizing with media, encoding a chunk.
* :mod:`.prefill` — encoding on a thread of its own, interleaved with the scheduler's steps.
* :mod:`.decoder`, :mod:`.formats` — untrusted files decoded in a sacrificial child process.
"""
