"""ModelManager: load on first use, restart after a crash, bounded queues, keep-alive,
the loaded-model cap and pinning — with the fake runtime, in and out of a worker."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from localrun.errors import ModelNotFound, Overloaded, UnsupportedFeature, WorkerCrashed
from localrun.manager import ModelManager
from localrun.settings import load_settings
from localrun.types import META_PROJECTOR, Cancel, ChatRequest, Format, Media, Message, ModelRecord, Plan, Sampling


class DictStore:
    """The store's resolve() contract, nothing more: the manager's unit tests need no index."""

    def __init__(self, *names):
        self.records = {n: ModelRecord(name=n, format=Format.GGUF, path=f"/models/{n}.gguf") for n in names}

    def resolve(self, name):
        try:
            return self.records[name]
        except KeyError:
            raise ModelNotFound(f"no model named {name!r}") from None

    def list(self):
        return list(self.records.values())


def _manager(*names, runtime="fake", delay=0.0, **runtime_settings):
    settings = load_settings(runtime=runtime_settings, server={"queue_size": 2})
    planner = lambda record: Plan(runtime=runtime, n_ctx=256, options={"fake_delay_s": delay})  # noqa: E731
    return ModelManager(settings, DictStore(*names), planner=planner)


def _req(n=5):
    return ChatRequest(messages=(Message("user", "hi"),), sampling=Sampling(max_tokens=n, temperature=0.0))


def test_loads_on_first_use_and_reuses_the_loaded_model():
    m = _manager("a")
    try:
        assert not m.is_loaded("a")
        text = "".join(c.text for c in m.stream("a", _req()))
        assert text and m.is_loaded("a")
        first = m.loaded()[0]
        list(m.stream("a", _req()))
        assert m.loaded()[0]["loaded_at"] == first["loaded_at"]
    finally:
        m.shutdown()


def test_unknown_model_is_model_not_found_naming_it():
    m = _manager("a")
    try:
        with pytest.raises(ModelNotFound, match="'zzz'"):
            list(m.stream("zzz", _req()))
    finally:
        m.shutdown()


def test_queue_bound_gives_overloaded_and_frees_slots_after():
    m = _manager("a", delay=0.05)
    try:
        streams = [m.stream("a", _req(50)) for _ in range(2)]
        for s in streams:
            next(s)  # admitted and running/queued
        with pytest.raises(Overloaded):
            next(m.stream("a", _req()))
        for s in streams:
            s.close()
        assert m.loaded()[0]["active"] == 0
        assert list(m.stream("a", _req(2)))
    finally:
        m.shutdown()


def test_cap_evicts_least_recently_used_idle_model_but_never_a_pinned_one():
    m = _manager("a", "b", "c", max_loaded_models=2)
    try:
        m.load("a", pin=True)
        m.load("b")
        m.load("c")
        names = {x["name"] for x in m.loaded()}
        assert names == {"a", "c"}, names
    finally:
        m.shutdown()


def test_keep_alive_unloads_idle_models_and_negative_pins():
    m = _manager("a", "b")
    try:
        m.load("a", keep_alive_s=0.5)
        m.load("b", keep_alive_s=-1)
        deadline = time.monotonic() + 5
        while m.is_loaded("a") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not m.is_loaded("a")
        assert m.is_loaded("b")
        assert [x["ttl_left_s"] for x in m.loaded()] == [None]
    finally:
        m.shutdown()


def test_a_dead_worker_fails_its_request_and_the_next_request_starts_a_new_one(monkeypatch):
    m = _manager("a", delay=0.05)
    monkeypatch.setattr("localrun.manager.ModelManager.start_handle", _force_worker(ModelManager.start_handle))
    try:
        stream = m.stream("a", _req(1000))
        next(stream)
        pid = m.loaded()[0]["pid"]
        assert pid != os.getpid()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerCrashed):
            list(stream)
        assert list(m.stream("a", _req(2)))
        assert m.loaded()[0]["pid"] != pid
        assert m.worker_restarts == 1
    finally:
        m.shutdown()


def _force_worker(original):
    """Run the fake runtime in a real worker process, as llama.cpp would be."""

    def start(self, record, plan):
        from localrun.worker.host import WorkerHandle

        return WorkerHandle(record, plan, log_path=self.settings.data_dir / "logs" / "w.log")

    return start


def test_concurrent_first_use_loads_once():
    m = _manager("a")
    loads = []
    orig = m.start_handle

    def counting(record, plan):
        loads.append(record.name)
        return orig(record, plan)

    m.start_handle = counting
    try:
        threads = [threading.Thread(target=lambda: list(m.stream("a", _req(2)))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert loads == ["a"]
    finally:
        m.shutdown()


def test_cancel_object_stops_a_blocking_stream():
    m = _manager("a", delay=0.01)
    try:
        cancel = Cancel()
        got = []
        for c in m.stream("a", _req(10_000), cancel):
            got.append(c)
            if len(got) == 2:
                cancel.set()
        assert got[-1].finish_reason == "cancelled"
    finally:
        m.shutdown()


def _image_chat():
    image = Media("image", b"\x89PNG not really", "image/png")
    return ChatRequest(messages=(Message("user", "<__media__> what is it?", media=(image,)),), sampling=Sampling())


def _counting_starts(m):
    starts = []
    real = m.start_handle
    m.start_handle = lambda record, plan: starts.append(record.name) or real(record, plan)
    return starts


def test_media_for_a_model_without_a_projector_are_refused_before_it_loads():
    """A text-only model is not loaded (most of a minute for a large one) to refuse an image."""
    m = _manager("a")
    starts = _counting_starts(m)
    try:
        with pytest.raises(UnsupportedFeature, match="a cannot take image input") as info:
            list(m.stream("a", _image_chat()))
        assert "--mmproj" in (info.value.hint or "")
        seen = []

        def check(record, plan, takes):  # the server's refusal, in its own words
            seen.append((record.name, plan.runtime, takes))
            raise UnsupportedFeature("refused by the caller's check")

        with pytest.raises(UnsupportedFeature, match="caller's check"):
            asyncio.run(m.aopen("a", _image_chat(), check=check))
        assert seen == [("a", "fake", frozenset())]
        assert starts == [] and not m.is_loaded("a")
        list(m.stream("a", _req(2)))  # text still loads it
        assert starts == ["a"]
    finally:
        m.shutdown()


def test_media_for_a_model_with_a_projector_load_it():
    m = _manager("a")
    record = m.store.records["a"]
    m.store.records["a"] = ModelRecord(
        name="a", format=Format.GGUF, path=record.path, metadata={META_PROJECTOR: "/models/mmproj-a.gguf"}
    )
    starts = _counting_starts(m)
    try:
        text = "".join(c.text for c in m.stream("a", _image_chat()))
        assert "image/png" in text and starts == ["a"]
    finally:
        m.shutdown()


def test_the_table_swaps_a_model_only_once_its_requests_are_done():
    """Residency.replace (a reload with a larger context): nothing more is admitted to the old
    row, the swap waits for its request, and the new row takes its place."""
    from localrun.residency import LoadedModel, Residency

    class Handle:
        pid, in_flight, alive = 1, 0, True
        closed = False

        def close(self):
            self.closed = True

    events = []
    table = Residency(events.append)
    record = ModelRecord(name="a", format=Format.GGUF, path="/a.gguf")
    old = LoadedModel("a", record, Plan(runtime="fake", n_ctx=256), Handle())
    table.put(old)
    assert table.admit(old, limit=4)
    swapped = []
    thread = threading.Thread(
        target=lambda: swapped.append(table.replace(old, Plan(runtime="fake", n_ctx=1024), lambda r, p: Handle()))
    )
    thread.start()
    deadline = time.monotonic() + 5
    while not old.retired and time.monotonic() < deadline:
        time.sleep(0.01)
    assert old.retired and not table.admit(old, limit=4)  # admit nothing more: load it again
    time.sleep(0.1)
    assert not swapped and not old.handle.closed  # its request is still running
    table.release(old)
    thread.join(5)
    (new,) = swapped
    assert table.get("a") is new and new.plan.n_ctx == 1024 and not new.retired and new.active == 0
    assert old.handle.closed
    assert [e["event"] for e in events] == ["loaded", "unloaded", "loaded"]
