"""The shared streaming pieces: stop strings across piece boundaries, the chunk stream's
end (finish reason, usage, cancel), SSE decoding, and cancelling a blocked HTTP read."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from localrun.chat.stops import StopMatcher
from localrun.runtimes.openai_compat.sse import iter_sse
from localrun.runtimes.openai_compat.watch import abort_on_cancel
from localrun.runtimes.pieces import Piece, shape_stream
from localrun.types import Cancel, Usage, fold


def _scan(pieces, stops):
    scanner = StopMatcher(stops)
    out = []
    for p in pieces:
        text, hit = scanner.feed(p)
        out.append(text)
        if hit:
            return "".join(out), True
    rest, hit = scanner.finish()
    return "".join(out) + rest, hit


def test_stop_string_split_across_pieces_is_cut_and_never_sent():
    text, hit = _scan(["hello wo", "r", "ld and more"], ["world"])
    assert (text, hit) == ("hello ", True)


def test_held_back_prefix_is_released_when_it_does_not_complete():
    scanner = StopMatcher(["STOP"])
    assert scanner.feed("abcST") == ("abc", False)
    assert scanner.feed("x") == ("STx", False)
    assert scanner.flush() == ""


def test_earliest_of_several_stops_wins():
    assert _scan(["one two three"], ["three", "two"]) == ("one ", True)


def test_a_stop_held_whole_behind_a_longer_stops_prefix_is_still_a_hit_at_the_end():
    """Found by the property test below in CI: in "cb" with stops "cbx" and "b", "cbx" could still
    start at 0, so "b" waits; when the stream ends there, "b" was the stop (finish "stop",
    Anthropic's stop_sequence), not an end with text cut for no reason."""
    assert _scan(["cb"], ["cbx", "b"]) == ("c", True)
    assert _scan(["c  a", "x"], ["axc", "x"]) == ("c  a", True)


def test_no_stops_passes_text_through_untouched():
    assert StopMatcher([]).feed("abc") == ("abc", False)
    assert StopMatcher(["", ""]).feed("abc") == ("abc", False)


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abcx ", max_size=40),
    stops=st.lists(st.text(alphabet="abcx", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_scanner_matches_cutting_the_whole_text_at_the_first_stop(text, stops, cuts):
    bounds = sorted({0, len(text), *[min(c, len(text)) for c in cuts]})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(hits)] if hits else text
    assert _scan(pieces, stops) == (expected, bool(hits))


def test_shape_stream_ends_with_backend_finish_and_usage():
    usage = Usage(prompt_tokens=4, completion_tokens=2)
    chunks = list(
        shape_stream(iter([Piece("a"), Piece("b", finish_reason="length", usage=usage)]), stops=(), cancel=Cancel())
    )
    assert fold(chunks) == ("ab", "length", usage)
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage == usage
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_shape_stream_counts_tokens_when_the_backend_reports_none():
    text, finish, usage = fold(
        shape_stream(iter([Piece("a"), Piece("b"), Piece("c")]), stops=("c",), cancel=Cancel(), prompt_tokens=5)
    )
    assert (text, finish) == ("ab", "stop")
    assert usage == Usage(prompt_tokens=5, completion_tokens=3)


def test_shape_stream_cancel_ends_at_the_next_piece_and_closes_the_source():
    closed = []

    def source():
        try:
            for i in range(1000):
                yield Piece(f"t{i} ")
        finally:
            closed.append(True)

    cancel = Cancel()
    stream = shape_stream(source(), stops=(), cancel=cancel)
    first = next(stream)
    cancel.set()
    last = next(stream)
    assert first.text == "t0 "
    assert last.finish_reason == "cancelled" and last.text == ""
    assert closed == [True]


def _lp(token: str) -> dict:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


def test_logprobs_ride_the_next_chunk_sent_and_none_are_lost_to_a_held_back_stop():
    pieces = [
        Piece("Hel", logprobs=(_lp("Hel"),)),
        Piece("lo <", logprobs=(_lp("lo"), _lp(" <"))),
        Piece("e", logprobs=(_lp("e"),)),
        Piece("nd> more", logprobs=(_lp("nd>"),)),
    ]
    chunks = list(shape_stream(iter(pieces), stops=("<end>",), cancel=Cancel()))
    assert [c.text for c in chunks] == ["Hel", "lo ", ""]
    assert [[e["token"] for e in c.logprobs] for c in chunks] == [["Hel"], ["lo", " <"], ["e", "nd>"]]
    assert chunks[-1].finish_reason == "stop"


def test_tool_calls_gather_on_the_last_chunk_and_set_its_finish_reason():
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    other = {**call, "id": "call_2"}
    pieces = [Piece("", tool_calls=(call,)), Piece("", tool_calls=(other,), finish_reason="stop", tokens=0)]
    last = list(shape_stream(iter(pieces), stops=(), cancel=Cancel()))[-1]
    assert last.finish_reason == "tool_calls" and last.tool_calls == (call, other)
    cancel = Cancel()
    cancel.set()
    cut = list(shape_stream(iter([Piece("", tool_calls=(call,))]), stops=(), cancel=cancel))[-1]
    assert cut.finish_reason == "cancelled"  # a cancelled answer is not a tool call


def test_closing_the_shaped_stream_closes_the_source_at_once():
    def source():
        yield Piece("a", logprobs=(_lp("a"),))
        yield Piece("b")

    inner = source()
    out = shape_stream(inner, stops=(), cancel=Cancel())
    assert next(out).logprobs[0]["token"] == "a"
    out.close()
    assert inner.gi_frame is None  # closed now, not left for the garbage collector


def test_iter_sse_decodes_events_and_stops_at_done():
    lines = [
        ": keep-alive",
        "",
        'data: {"a": 1}',
        "",
        "event: x",
        'data: {"b":',
        "data: 2}",
        "",
        "data: [DONE]",
        "",
        'data: {"after": 1}',
        "",
    ]
    assert list(iter_sse(lines)) == [{"a": 1}, {"b": 2}]


class _SlowHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self.wfile.write(b"6\r\nfirst\n\r\n")
            self.wfile.flush()
            time.sleep(5)  # a long prefill: nothing to read for a while
            self.wfile.write(b"7\r\nsecond\n\r\n0\r\n\r\n")
        except OSError:
            pass


def test_abort_on_cancel_wakes_a_read_blocked_on_a_silent_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cancel = Cancel()
    got, errors = [], []
    try:
        with httpx.Client() as client, client.stream("GET", f"http://127.0.0.1:{server.server_address[1]}/") as r:
            with abort_on_cancel(r, cancel):
                lines = r.iter_lines()
                got.append(next(lines))
                threading.Timer(0.2, cancel.set).start()
                started = time.monotonic()
                try:
                    got.extend(lines)
                except httpx.HTTPError as exc:
                    errors.append(exc)
                elapsed = time.monotonic() - started
    finally:
        server.shutdown()
        server.server_close()
    assert got[0] == "first"
    assert "second" not in got
    assert elapsed < 1.0, f"the blocked read took {elapsed:.2f} s to notice the cancel"
