"""Upstream health never interrupts traffic: a request that succeeds counts as a probe, an
upstream with requests in flight is not probed, a request waits for a probe that is out rather
than meet it, and failures still cool an upstream down.

Before: the pool probed every upstream every ``probe_interval_s`` whatever it was doing, and
llama-cpp-python's server cancels its running stream whenever a new request arrives, so a
stream through localrun ended without a finish whenever a probe landed in it.
"""

from __future__ import annotations

import threading
import time

import openai
import pytest

from localrun.errors import LocalrunError
from localrun.runtimes.openai_compat.client import Probe
from localrun.settings import UpstreamConfig, UpstreamSettings
from localrun.upstreams.pool import UpstreamPool
from tests.conftest import needs_llama
from tests.support.servers import free_port, llama_cpp_server, start


class _Prober:
    """A stand-in client that counts probes; ``hold`` keeps a probe out until set."""

    def __init__(self) -> None:
        self.probes = 0
        self.hold = threading.Event()
        self.hold.set()

    def probe(self, *, timeout_s: float) -> Probe:
        self.probes += 1
        self.hold.wait(5)
        return Probe(True, 0.001)

    def version(self) -> str:
        return ""

    def close(self) -> None:
        pass


def _pool(interval: float = 1.0) -> tuple[UpstreamPool, _Prober]:
    client = _Prober()
    pool = UpstreamPool(
        [UpstreamConfig(name="u", url="http://127.0.0.1:9", models=["m"])],
        UpstreamSettings(probe_interval_s=interval, cooldown_s=5.0),
        client_factory=lambda c: client,
        start=False,
    )
    return pool, client


def test_an_upstream_with_traffic_in_flight_is_not_probed():
    pool, client = _pool()
    st = pool.acquire(pool.route("m"), exclude=set(), key=None, wait_s=1)
    pool.probe_all()
    assert client.probes == 0  # before: 1, in the middle of the request
    pool.release(st)
    pool.probe_all()
    assert client.probes == 1 and pool.get("u").healthy


def test_a_request_that_succeeds_counts_as_a_probe_and_ends_a_cooldown():
    pool, client = _pool(interval=60.0)
    st = pool.get("u")
    pool.mark_failure(st, "m", LocalrunError("upstream answered 502"))
    assert st.cooling()  # failures still cool it down
    pool.mark_success(st)
    assert not st.cooling() and st.healthy and st.status()["health"] == "up"
    pool.probe_all()
    assert client.probes == 0  # a success within the interval: nothing to learn from a probe
    st.last_ok -= 61
    pool.probe_all()
    assert client.probes == 1  # idle for a whole interval: probed again


def test_a_request_waits_for_a_probe_that_is_out_instead_of_meeting_it():
    pool, client = _pool()
    client.hold.clear()
    prober = threading.Thread(target=pool.probe_all)
    prober.start()
    while not pool.get("u").probing:
        time.sleep(0.005)
    got: list[float] = []
    waiter = threading.Thread(
        target=lambda: got.append(pool.acquire(pool.route("m"), exclude=set(), key=None, wait_s=5) and time.monotonic())
    )
    waiter.start()
    time.sleep(0.3)
    assert not got  # held while the probe is out
    released = time.monotonic()
    client.hold.set()
    prober.join(5)
    waiter.join(5)
    assert got and got[0] >= released


INTERVAL_S = 1.0
STREAMS = 12


@pytest.fixture(scope="module")
def interrupting_cpp(tiny_gguf, tmp_path_factory):
    pytest.importorskip("sse_starlette", reason="llama_cpp.server needs sse-starlette (the test extra)")
    logs = tmp_path_factory.mktemp("lcp-logs")
    cpp = start(llama_cpp_server(tiny_gguf, free_port(), alias="tiny-cpp", interrupt=True), logs / "lcp.log")
    yield cpp
    cpp.stop()


@needs_llama
@pytest.mark.llama
def test_probes_every_second_cut_no_stream_of_llama_cpp_python(interrupting_cpp, front_factory):
    """Streams back to back and with idle gaps, probes every second: none is cut (before: most were)."""
    front = front_factory(
        [{"name": "lcp", "url": interrupting_cpp.url, "kind": "openai"}], probe_interval_s=INTERVAL_S, cooldown_s=1.0
    )
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    cut, finished, started = [], 0, time.monotonic()
    for i in range(STREAMS):
        try:
            chunks = list(
                client.chat.completions.create(
                    model="tiny-cpp",
                    messages=[{"role": "user", "content": f"Count from 1 to 100, number {i}."}],
                    max_tokens=48,
                    temperature=0,
                    stream=True,
                )
            )
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
            finished += bool(reasons)
            if not reasons:
                cut.append(i)
        except openai.APIError as exc:
            cut.append(f"{i}: {exc}")
        if i % 3 == 2:
            time.sleep(INTERVAL_S * 1.5)  # idle: the prober may look now, and must find it up
    elapsed = time.monotonic() - started
    status = {u["name"]: u for u in front.stack.manager.upstream_status()}["lcp"]
    print(f"\n{STREAMS} streams in {elapsed:.1f} s with a {INTERVAL_S:g} s probe interval: {len(cut)} cut")
    assert not cut, cut
    assert finished == STREAMS and status["health"] == "up"
