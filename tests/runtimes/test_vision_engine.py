"""Images and audio inside the llama.cpp scheduler (issue 19): the media prompt's rules against the
prefix cache (pure), then real llama.cpp on Gemma 3 270M with the fixture projectors (random
weights: the answers are noise, but token counts, cache hits, logits and refusals are real)."""

from __future__ import annotations

import threading
import time

import pytest

from localrun.errors import InvalidMedia, UnsupportedFeature
from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.media.prompt import (
    START_BELOW,
    MediaPrompt,
    MediaSpan,
    media_safe_cut,
    pseudo_ids,
    starts_media,
)
from localrun.types import (
    AUDIO,
    MEDIA_MARKER,
    VISION,
    Cancel,
    ChatRequest,
    CompletionRequest,
    Format,
    Media,
    Message,
    ModelRecord,
    Plan,
    Sampling,
)
from tests.batching.test_prefix import FakeKv
from tests.conftest import needs_llama

# --- the prompt's rules (pure) ------------------------------------------------------------------


def test_pseudo_ids_are_negative_content_keyed_and_mark_the_chunk_start():
    a, a2, b = pseudo_ids("aaa#0", 16), pseudo_ids("aaa#0", 16), pseudo_ids("bbb#0", 16)
    assert a == a2 and len(a) == 16 and all(t < 0 for t in a)
    assert all(x != y for x, y in zip(a, b))  # a different image differs at every position
    assert starts_media(a[0]) and not any(starts_media(t) for t in a[1:])
    assert all(START_BELOW <= t < 0 for t in a[1:])
    assert pseudo_ids("aaa#0", 8) != a[:8]  # the length is part of the key


def test_a_cut_inside_a_chunk_backs_up_to_its_start():
    img = pseudo_ids("x#0", 10)
    tokens = [5, 6, 7, *img, 8, 9]
    assert media_safe_cut(tokens, 3) == 3  # right before the chunk
    assert media_safe_cut(tokens, 8) == 3  # inside it
    assert media_safe_cut(tokens, 13) == 13  # right after it
    assert media_safe_cut(tokens, 14) == 14


def test_media_prompt_walks_text_runs_and_chunks():
    img = pseudo_ids("x#0", 4)
    p = MediaPrompt([1, 2, *img, 3], [MediaSpan(2, 4, "image", 1, "x#0")])
    assert p.text_run(0) == 2 and p.span_at(2).n_tokens == 4 and p.span_at(0) is None
    assert p.text_run(6) == 1 and p.media_tokens == 4
    assert p.pending(2) == p.spans and p.pending(6) == []


def _text(n, base=100):
    return list(range(base, base + n))


def test_prefix_cache_reuses_the_same_image_and_never_another_or_half_of_one():
    kv = FakeKv(2)
    cache = PrefixCache(2, kv)
    head = _text(20)
    turn1 = [*head, *pseudo_ids("A#0", 16), *_text(5, 500)]
    slot, keep = cache.acquire(turn1)
    assert keep == 0
    slot.tokens.extend(turn1)
    kv.kv[slot.seq] = list(slot.tokens)
    cache.release(slot)
    # Turn 2 with the same image: everything up to the new text is reused, the image included.
    same = [*turn1, *_text(4, 700)]
    assert cache._reusable(same)[0] == len(turn1)
    # The same text with another image: only the text before it.
    other = [*head, *pseudo_ids("B#0", 16), *_text(5, 500)]
    assert cache._reusable(other)[0] == len(head)
    # A prompt that ends with the image: its last position must be evaluated again, which would
    # cut inside the chunk; the cut goes back to the chunk's start instead.
    ends = [*head, *pseudo_ids("A#0", 16)]
    assert cache._reusable(ends)[0] == len(head)


# --- real llama.cpp ---------------------------------------------------------------------------

HEAD = "You are looking at a photograph taken on a sunny afternoon in the garden. "


def _png(seed: int) -> bytes:
    from tests.support.vision import image_bytes

    return image_bytes("PNG", (64, 48), seed=seed)


def _image(seed: int) -> Media:
    return Media("image", _png(seed), "image/png")


def _req(media=(), text=f"{HEAD}{MEDIA_MARKER} What is in it?", **sampling) -> ChatRequest:
    sampling.setdefault("temperature", 0.0)
    sampling.setdefault("max_tokens", 6)
    msg = Message("user", text, media=tuple(media))
    return ChatRequest(messages=(msg,), sampling=Sampling(**sampling))


def _run(session, req):
    chunks = list(session.chat(req, Cancel()))
    return "".join(c.text for c in chunks), chunks[-1]


def _load(record, **options):
    from localrun.runtimes.llamacpp.session import LlamaCppRuntime

    options.setdefault("n_slots", 4)
    return LlamaCppRuntime().load(record, Plan(runtime="llama.cpp", n_ctx=2048, n_threads=2, options=options))


@pytest.fixture(scope="module")
def vision(gemma_vision):
    s = _load(gemma_vision.record())
    yield s
    s.close()


def _media_start(session, req) -> tuple[int, int]:
    """(the first media chunk's start, its tokens) in ``req``'s prompt."""
    prompt, _, _ = session.chat_tokens(req)
    try:
        # Gemma 3's image tokens attend to each other: decoded in one call, causal attention off.
        assert all(s.non_causal == (s.kind == "image") for s in prompt.spans)
        return prompt.spans[0].start, prompt.spans[0].n_tokens
    finally:
        prompt.close()


@needs_llama
@pytest.mark.llama
def test_a_projector_declares_vision_and_image_tokens_count_in_the_prompt(vision):
    from tests.support.vision import TINY

    assert VISION in vision.capabilities and AUDIO not in vision.capabilities
    assert vision.serve_props()["modalities"] == {"vision": True, "audio": False}
    _, plain = _run(vision, _req(text=f"{HEAD} What is in it?"))
    _, last = _run(vision, _req([_image(1)]))
    start, n = _media_start(vision, _req([_image(1)]))
    assert n == TINY.tokens_per_image
    # The image's tokens, and mtmd's <start_of_image> / <end_of_image> around them.
    assert last.usage.prompt_tokens >= plain.usage.prompt_tokens + n
    assert vision.serve_count_prompt(_req([_image(1)]).to_dict())["prompt_tokens"] == last.usage.prompt_tokens


@needs_llama
@pytest.mark.llama
def test_two_images_give_different_logits_and_the_same_one_the_same(vision):
    def top(seed):
        _, last = _run(vision, _req([_image(seed)], logprobs=5, max_tokens=1))
        first = last.logprobs[0] if last.logprobs else None
        assert first is not None
        return [(t["token"], round(t["logprob"], 4)) for t in first["top_logprobs"]]

    a = top(1)
    assert a == top(1)
    assert a != top(2)


@needs_llama
@pytest.mark.llama
def test_the_same_image_in_turn_two_is_cached_and_another_image_is_not(gemma_vision):
    s = _load(gemma_vision.record(), n_slots=2)
    try:
        req = _req([_image(3)])
        start, n = _media_start(s, req)
        answer, first = _run(s, req)
        assert first.usage.cached_tokens == 0
        # Turn 2: the same image, the answer, a new question.
        msgs = (*req.messages, Message("assistant", answer), Message("user", "And the colours?"))
        _, second = _run(s, ChatRequest(messages=msgs, sampling=req.sampling))
        assert second.usage.cached_tokens >= start + n  # the image's tokens came from the cache
        # The same text with another image: the text before it is reused, the image is not.
        _, other = _run(s, _req([_image(4)]))
        assert other.usage.cached_tokens == start
        assert s._sched.encoder.encoded == 2  # turn 2 encoded nothing
    finally:
        s.close()


@needs_llama
@pytest.mark.llama
def test_text_streams_and_an_image_request_batched_answer_as_they_do_alone(gemma_vision):
    """Batched, the image request reuses almost all of its prompt from the cache (its run alone
    left it there) and evaluates one token; alone it prefilled the image and the text. Only
    ``exact_prefix`` makes those two paths agree bit for bit (cache/slots.py): with flash
    attention a cached prefix is right to rounding, which flipped a near-tie on a loaded CI run."""
    s = _load(gemma_vision.record(), exact_prefix=True)
    try:
        texts = [_req(text=f"Tell me about {w}.", max_tokens=12) for w in ("cats", "rivers", "clocks")]
        img = _req([_image(5)], max_tokens=12)
        _run(s, _req([_image(1)]))  # the text before the image is in the cache, as for a second image
        alone = [_run(s, r) for r in (*texts, img)]
        got: dict[int, tuple] = {}

        def go(i, r):
            got[i] = _run(s, r)

        threads = [threading.Thread(target=go, args=(i, r)) for i, r in enumerate((*texts, img))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert alone[3][1].usage.cached_tokens < got[3][1].usage.cached_tokens  # two paths to one answer
        assert [got[i][0] for i in range(4)] == [a[0] for a in alone]  # greedy and batch-invariant: bit for bit
        assert all(got[i][1].finish_reason in ("stop", "length") for i in range(4))
    finally:
        s.close()


@needs_llama
@pytest.mark.llama
def test_other_streams_decode_to_the_end_while_an_image_is_being_encoded(vision):
    """The encode runs off the scheduler thread: held inside the projector's encode, it must
    not stop a text stream from finishing (llama-server's slot loop would wait for it)."""
    encoder = vision._sched.encoder
    real, entered, release, left = encoder.projector.encode, threading.Event(), threading.Event(), threading.Event()

    def held(native, span):
        entered.set()
        release.wait(60)
        left.set()
        return real(native, span)

    encoder.projector.encode = held
    try:
        result: dict = {}
        image = threading.Thread(target=lambda: result.setdefault("image", _run(vision, _req([_image(9)]))))
        image.start()
        assert entered.wait(60)
        text, last = _run(vision, _req(text="Count to ten.", max_tokens=10))
        assert last.finish_reason in ("stop", "length")
        assert not left.is_set()  # the text stream finished while the encode was still held
        release.set()
        image.join(60)
        assert result["image"][1].finish_reason in ("stop", "length")
    finally:
        release.set()
        encoder.projector.encode = real


@needs_llama
@pytest.mark.llama
def test_a_bad_image_fails_its_request_only(vision):
    good, _ = _run(vision, _req(text="Say hello.", max_tokens=4))
    for bad in (b"", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, _png(6)[:60], b"not an image at all"):
        with pytest.raises(InvalidMedia):
            _run(vision, _req([Media("image", bad, "image/png")]))
    assert _run(vision, _req(text="Say hello.", max_tokens=4))[0] == good
    assert _run(vision, _req([_image(6)]))[1].finish_reason in ("stop", "length")


@needs_llama
@pytest.mark.llama
def test_completion_takes_media_and_places_them_after_the_text_when_unmarked(vision):
    req = CompletionRequest(prompt="A picture:", media=(_image(7),), sampling=Sampling(temperature=0, max_tokens=3))
    chunks = list(vision.complete(req, Cancel()))
    _, n = _media_start(vision, _req([_image(7)]))
    assert chunks[-1].usage.prompt_tokens > n


@needs_llama
@pytest.mark.llama
def test_a_cancelled_image_request_frees_its_chunks(vision):
    cancel = Cancel()
    stream = vision.chat(_req([_image(8)], max_tokens=50), cancel)
    cancel.set()
    chunks = list(stream)
    assert chunks[-1].finish_reason == "cancelled"
    encoder = vision._sched.encoder
    deadline = time.monotonic() + 30
    while encoder._live and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not encoder._live


@needs_llama
@pytest.mark.llama
def test_audio_to_a_vision_projector_is_invalid_media(vision):
    from tests.support.vision import wav_bytes

    with pytest.raises(InvalidMedia, match="takes images, not audio"):
        _run(vision, _req([Media("audio", wav_bytes(0.5), "audio/wav")]))


@needs_llama
@pytest.mark.llama
@pytest.mark.slow  # Whisper pads every clip to 30 s: about 790 prompt tokens per request
def test_audio_through_the_audio_projector(gemma_audio):
    from tests.support.vision import wav_bytes

    s = _load(gemma_audio.record("gemma-audio"), n_slots=1)
    try:
        assert AUDIO in s.capabilities
        clip = Media("audio", wav_bytes(1.0), "audio/wav")
        _, plain = _run(s, _req(text=f"{HEAD} What is in it?"))
        _, last = _run(s, _req([clip]))
        assert last.usage.prompt_tokens > plain.usage.prompt_tokens
        _, again = _run(s, _req([clip]))
        assert again.usage.cached_tokens > 0
    finally:
        s.close()


@needs_llama
@pytest.mark.llama
def test_media_to_a_model_without_a_projector_says_how_to_add_one(gemma_gguf):
    s = _load(ModelRecord(name="gemma-text", format=Format.GGUF, path=str(gemma_gguf)), n_slots=1)
    try:
        assert VISION not in s.capabilities
        with pytest.raises(UnsupportedFeature, match="gemma-text has no multimodal projector") as info:
            _run(s, _req([_image(1)]))
        assert "--mmproj" in info.value.hint
    finally:
        s.close()
