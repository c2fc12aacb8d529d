"""Failure handling with real servers: an upstream killed mid-stream, one that never answers,
broken SSE, a wrong key, one that disappears and comes back, a full queue, a client that
leaves, and 100 concurrent clients over two upstreams.

Upstreams are real localrun servers (threads, or processes where they must be killed);
their fake runtime makes answers slow enough to cut. Bounds on time here are hang
detectors with room for a loaded machine, not speed measurements.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.support.launch import launch_args
from tests.support.servers import free_port, wait_until
from tests.upstreams.replay import Reply, chat_sse, models_json

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}]}


@pytest.fixture
def proc_upstream(spawn_server, tiny_gguf):
    """``proc_upstream(port=None, delay=0.05)``: a localrun process on the fake runtime serving "tiny"."""
    from localrun.modelstore.store import ModelStore
    from localrun.settings import Settings

    store = ModelStore(Settings())
    store.import_path(tiny_gguf, name="tiny")

    def start(port: int | None = None, delay: float = 0.05, words: int = 40):
        port = port or free_port()
        args = launch_args(port, {"fake_delay_s": delay, "fake_reply_words": words}, log_level="WARNING")
        return spawn_server(args, port=port, env={"LOCALRUN_RUNTIME__FORCE": "fake"})

    return start


def _ok_replay(replays, *words):
    return replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("tiny")),
            "POST /v1/chat/completions": Reply(body=chat_sse(list(words) or ["fine"]), sse=True),
        }
    )


def _serving(front) -> str | None:
    busy = [s["name"] for s in front.pool.status() if s["in_flight"]]
    return busy[0] if busy else None


def test_upstream_killed_mid_stream_errors_fast_and_next_request_goes_to_the_other(proc_upstream, front_factory):
    a, b = proc_upstream(), proc_upstream()
    front = front_factory(
        [{"name": "a", "url": a.url, "kind": "localrun"}, {"name": "b", "url": b.url, "kind": "localrun"}]
    )
    procs = {"a": a, "b": b}
    with httpx.stream("POST", front.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]
        victim = _serving(front)
        assert victim in procs and any("content" in line for line in got)
        procs[victim].proc.kill()
        killed_at = time.monotonic()
        rest = [line for line in lines if line.startswith("data:")]
        ended_in = time.monotonic() - killed_at
    assert '"error"' in rest[-1] and f"upstream '{victim}'" in rest[-1]
    assert ended_in < 5.0, f"the client waited {ended_in:.1f} s for the error"
    other = "b" if victim == "a" else "a"
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"].startswith("You said")
    assert front.pool.get(other).sent == 1 and front.pool.get(victim).sent == 1  # not retried on the dead one
    assert front.pool.get(victim).status()["health"] in ("cooldown", "down")
    assert (
        f'localrun_upstream_errors_total{{upstream="{victim}",model="tiny",kind="stream"}} 1'
        in httpx.get(front.url + "/metrics").text
    )


def test_upstream_that_never_answers_times_out_and_fails_over(replays, front_factory):
    hang = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("tiny")),
            "POST /v1/chat/completions": Reply(hang=True),
        }
    )
    good = _ok_replay(replays, "still", " here")
    front = front_factory(
        [
            {"name": "hang", "url": hang.url, "kind": "vllm", "first_byte_timeout_s": 1.0, "chunk_timeout_s": 1.0},
            {"name": "good", "url": good.url, "kind": "vllm"},
        ]
    )
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "still here"
    assert front.pool.get("hang").cooldowns == 1
    alone = front_factory(
        [{"name": "hang", "url": hang.url, "kind": "vllm", "first_byte_timeout_s": 1.0, "chunk_timeout_s": 1.0}]
    )
    r = httpx.post(alone.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 504 and "upstream 'hang' timed out" in r.json()["error"]["message"]


def test_silence_between_chunks_ends_the_stream_with_an_error(replays, front_factory):
    events = chat_sse(["one", " two", " three"]).split(b"\n\n")
    # The role event and two tokens, then silence with the connection open.
    up = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("tiny")),
            "POST /v1/chat/completions": Reply(body=b"\n\n".join(events[:3]) + b"\n\n", sse=True, hold_open=True),
        }
    )
    front = front_factory([{"name": "slow", "url": up.url, "kind": "vllm", "chunk_timeout_s": 0.5}])
    r = httpx.post(front.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    data = [line for line in r.text.splitlines() if line.startswith("data:")]
    assert (
        "one" in r.text
        and '"error"' in data[-1]
        and "upstream 'slow' sent nothing for 0.5 s (between chunks)" in data[-1]
    )


def test_broken_sse_fails_over_before_the_first_byte_and_errors_after_it(replays, front_factory):
    broken = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("tiny")),
            "POST /v1/chat/completions": Reply(body=b"data: {not json\n\n", sse=True),
        }
    )
    good = _ok_replay(replays, "ok")
    front = front_factory(
        [{"name": "broken", "url": broken.url, "kind": "sglang"}, {"name": "good", "url": good.url, "kind": "sglang"}]
    )
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    late = chat_sse(["first"], usage=False).split(b"\n\n")[:2]
    broken.routes["POST /v1/chat/completions"] = Reply(body=b"\n\n".join(late) + b"\n\ndata: {oops\n\n", sse=True)
    alone = front_factory([{"name": "broken", "url": broken.url, "kind": "sglang"}])
    r = httpx.post(alone.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30)
    data = [line for line in r.text.splitlines() if line.startswith("data:")]
    assert "first" in data[0] and "broken event stream" in data[-1]


def test_wrong_key_is_a_clear_403_naming_the_upstream_and_keys_never_cross(
    build_stack, live_factory, replays, front_factory, monkeypatch
):
    guarded = live_factory(build_stack(api_key="right-key-123"))
    monkeypatch.setenv("GOOD_KEY", "right-key-123")
    front = front_factory(
        [{"name": "locked", "url": guarded.url, "kind": "localrun", "key": "wrong-key-456", "models": ["tiny"]}]
    )
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    err = r.json()["error"]
    assert r.status_code == 403 and "upstream 'locked' refused localrun's key" in err["message"]
    assert "wrong-key-456" not in r.text and "right-key-123" not in r.text
    x, y = _ok_replay(replays, "x"), _ok_replay(replays, "y")
    front = front_factory(
        [
            {"name": "x", "url": x.url, "kind": "vllm", "key": "key-for-x-0001"},
            {"name": "y", "url": y.url, "kind": "vllm", "key_env": "GOOD_KEY"},
        ]
    )
    for _ in range(4):
        assert httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
    assert {q["headers"].get("Authorization") for q in x.requests} == {"Bearer key-for-x-0001"}
    assert {q["headers"].get("Authorization") for q in y.requests} == {"Bearer right-key-123"}
    assert "key-for-x" not in httpx.get(front.url + "/metrics").text + httpx.get(front.url + "/health").text


def test_upstream_that_disappears_cools_down_and_recovers(proc_upstream, front_factory):
    a = proc_upstream(delay=0.0)
    port_b = free_port()
    b = proc_upstream(port=port_b, delay=0.0)
    front = front_factory(
        [{"name": "a", "url": a.url, "kind": "localrun"}, {"name": "b", "url": b.url, "kind": "localrun"}],
        cooldown_s=60.0,
    )
    b.proc.kill()
    b.proc.wait()
    for _ in range(4):
        r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 200
    assert wait_until(lambda: front.pool.get("b").status()["health"] in ("down", "cooldown"), 10)
    sent_b = front.pool.get("b").sent
    proc_upstream(port=port_b, delay=0.0)  # back on the same address
    assert wait_until(lambda: front.pool.get("b").status()["health"] == "up", 20), front.pool.status()
    for _ in range(6):
        assert httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30).status_code == 200
    assert front.pool.get("b").sent > sent_b  # back in rotation, long before its 60 s cooldown ran out
    metrics = httpx.get(front.url + "/metrics").text
    assert 'localrun_upstream_cooldowns_total{upstream="b"}' in metrics
    assert 'localrun_upstream_up{upstream="b",state="up"} 1' in metrics
    assert 'localrun_upstream_requests_total{upstream="b",model="tiny",outcome="ok"}' in metrics


def test_the_only_upstream_is_never_cooled_out_of_reach(replays, front_factory):
    flaky = replays(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("tiny")),
            "POST /v1/chat/completions": Reply(500, b'{"error": {"message": "engine hiccup"}}'),
        }
    )
    front = front_factory([{"name": "only", "url": flaky.url, "kind": "vllm"}])
    for _ in range(2):
        r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
        assert r.status_code == 502 and "engine hiccup" in r.json()["error"]["message"]
    flaky.routes["POST /v1/chat/completions"] = Reply(body=chat_sse(["back"]), sse=True)
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    assert r.status_code == 200, r.text  # cooling, but the only one: still tried


def test_full_queue_is_503_with_retry_after(fake_upstream, front_factory):
    up = fake_upstream(fake_delay_s=0.05)
    front = front_factory([{"name": "u", "url": up.url, "kind": "localrun", "max_concurrency": 1}], queue_size=1)
    results: list[int] = []

    def slow():
        results.append(httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=60).status_code)

    threads = [threading.Thread(target=slow) for _ in range(2)]
    for t in threads:
        t.start()
    assert wait_until(lambda: front.pool.get("u").in_flight == 1, 10)
    assert wait_until(lambda: front.stack.manager.load("tiny").active == 2, 10)
    r = httpx.post(front.url + "/v1/chat/completions", json=CHAT, timeout=30)
    for t in threads:
        t.join(60)
    assert r.status_code == 503 and r.headers["Retry-After"]
    assert sorted(results) == [200, 200]


def test_client_disconnect_closes_the_upstream_stream(fake_upstream, front_factory):
    up = fake_upstream(fake_delay_s=0.05)
    front = front_factory([{"name": "u", "url": up.url, "kind": "localrun"}])
    with httpx.stream("POST", front.url + "/v1/chat/completions", json={**CHAT, "stream": True}, timeout=30) as r:
        lines = r.iter_lines()
        next(lines)
        next(lines)
        assert front.pool.get("u").in_flight == 1
    assert wait_until(lambda: front.pool.get("u").in_flight == 0, 5)
    upstream_manager = up.stack.manager
    assert wait_until(lambda: all(m["in_flight"] == 0 for m in upstream_manager.loaded()), 5)


def test_hundred_concurrent_clients_over_two_upstreams_none_lost_split_evenly(fake_upstream, front_factory):
    a, b = fake_upstream(fake_delay_s=0.01, fake_reply_words=4), fake_upstream(fake_delay_s=0.01, fake_reply_words=4)
    front = front_factory(
        [
            {"name": "a", "url": a.url, "kind": "localrun", "max_concurrency": 8},
            {"name": "b", "url": b.url, "kind": "localrun", "max_concurrency": 8},
        ],
        queue_size=100,
    )
    codes: list[int] = []
    texts: list[str] = []
    lock = threading.Lock()

    def one(i: int) -> None:
        body = {**CHAT, "messages": [{"role": "user", "content": f"client {i}"}], "stream": True}
        with httpx.Client(timeout=120) as c:
            r = c.post(front.url + "/v1/chat/completions", json=body)
        with lock:
            codes.append(r.status_code)
            texts.append(r.text)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert codes.count(200) == 100, sorted(set(codes))
    assert all("[DONE]" in t and '"error"' not in t for t in texts)
    sent = {n: front.pool.get(n).sent for n in ("a", "b")}
    assert sum(sent.values()) == 100 and all(40 <= v <= 60 for v in sent.values()), sent
