"""Small pure pieces: keep_alive durations, the Host matcher, error shapes, metrics text."""

from __future__ import annotations

import pytest

from localrun.errors import ConfigError, ContextOverflow, ModelNotFound, Overloaded, WorkerCrashed
from localrun.server.errors import DEFAULT, error_headers, error_response
from localrun.server.generation import clamp_max_tokens, make_sampling
from localrun.server.metrics import Metrics, RequestStats
from localrun.server.ollama.errors import OLLAMA
from localrun.server.schemas import keep_alive_seconds
from localrun.server.security import allowed_host_names, host_allowed, is_loopback_host
from localrun.server.serve import check_bind_policy, probe_port
from tests.support.stacks import make_settings


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("", None),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("10s", 10.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        (0, 0.0),
        ("0", 0.0),
        (30, 30.0),
        (2.5, 2.5),
        ("45", 45.0),
        (-1, -1.0),
        ("-1", -1.0),
        ("-5m", -1.0),
        (-0.001, -1.0),
    ],
)
def test_keep_alive_durations(value, seconds):
    assert keep_alive_seconds(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 m", "m", "5x", "1h-3m", "--5m", "nan", "inf", "5m ago"])
def test_bad_keep_alive(value):
    with pytest.raises(ValueError):
        keep_alive_seconds(value)


def test_host_matching_is_exact():
    names = allowed_host_names("127.0.0.1", ["Box.Lan"])
    assert names >= {"localhost", "127.0.0.1", "[::1]", "box.lan"}
    for ok in ("localhost", "localhost:1", "127.0.0.1:65535", "[::1]:80", "BOX.LAN:8739"):
        assert host_allowed(ok, names), ok
    for bad in (
        None,
        "",
        "localhost:65536",
        "localhost:-1",
        "localhost:+1",
        "localhost:1:2",
        "evil.box.lan",
        "box.lan.evil",
        "::1",
        "[::1",
    ):
        assert not host_allowed(bad, names), bad
    assert "[::1]" in allowed_host_names("::1", [])
    assert "10.0.0.5" in allowed_host_names("10.0.0.5", []) and "0.0.0.0" not in allowed_host_names("0.0.0.0", [])


def test_loopback_detection_and_bind_policy():
    assert all(is_loopback_host(h) for h in ("127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.5"))
    assert not any(is_loopback_host(h) for h in ("0.0.0.0", "::", "192.168.1.2", "example.com", ""))
    # The short forms the resolver binds as 127.0.0.1 are loopback too (before: `--host 127.1` was refused).
    assert is_loopback_host("127.1") and is_loopback_host("127.0.1")
    assert not any(is_loopback_host(h) for h in ("10.1", "0x7f.1", "1.2.3.4.5", "127.1.2.3.4"))
    check_bind_policy(make_settings(host="127.1"))
    check_bind_policy(make_settings(host="127.0.0.1"))
    check_bind_policy(make_settings(host="0.0.0.0", api_key="k-test-key"))
    with pytest.raises(ConfigError, match="0.0.0.0") as info:
        check_bind_policy(make_settings(host="0.0.0.0"))
    assert "API key" in info.value.message


@pytest.mark.parametrize("key", [" ", "", "\t", "k", "1234567", " padded-key ", "ключ-ключ-ключ", "new\nline-key"])
def test_an_api_key_no_client_could_send_or_anyone_could_guess_is_refused(key):
    """Before: `--api-key ' '` started a server whose key no client can send, and 1-character keys started."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="API key"):
        make_settings(api_key=key)


def test_a_long_enough_printable_key_is_accepted():
    assert make_settings(api_key="12345678").server.api_key.get_secret_value() == "12345678"
    assert make_settings(api_key="with inner space").server.api_key is not None


def test_probe_port_names_the_busy_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port}"):
            probe_port("127.0.0.1", port)


def test_error_shapes():
    err = ModelNotFound("no model named 'x'", hint="import it")
    body = DEFAULT.body(err)["error"]
    assert body == {
        "message": "no model named 'x' (import it)",
        "type": "invalid_request_error",
        "param": None,
        "code": "model_not_found",
    }
    assert OLLAMA.body(err) == {"error": "no model named 'x' (import it)"}
    assert DEFAULT.body(WorkerCrashed("gone"))["error"]["type"] == "server_error"
    assert error_headers(Overloaded("full")) == {"Retry-After": "1"}
    r = error_response(ContextOverflow("too long", param="messages"))
    assert r.status_code == 400 and b'"param": "messages"' in r.body
    r = error_response(RuntimeError("boom"), OLLAMA)
    assert r.status_code == 500 and b"RuntimeError" in r.body and b"boom" not in r.body  # no internals leak


def test_sampling_mapping():
    assert clamp_max_tokens(None, 100) is None and clamp_max_tokens(5, 100) == 5 and clamp_max_tokens(10**9, 100) == 100
    assert clamp_max_tokens(-1, 100) == 100
    s = make_sampling(cap=64, max_tokens=10, seed=2**40 + 3, stop="x", temperature=0.0, top_p=None)
    assert s.max_tokens == 10 and s.seed == 3 and s.stop == ("x",) and s.temperature == 0.0 and s.top_p == 0.95


def test_metrics_text():
    m = Metrics()
    stats = RequestStats(
        start=0.0, model='we"ird', prompt_tokens=3, completion_tokens=5, first_token_at=0.2, last_token_at=0.6
    )
    m.observe_request("/v1/chat/completions", "POST", 200, 0.7, stats)
    m.observe_itl(0.003)
    text = m.render(loaded=[{"name": "a", "active": 2}], worker_restarts=1)
    assert 'localrun_requests_total{route="/v1/chat/completions",method="POST",status="200"} 1' in text
    assert 'localrun_completion_tokens_total{model="we\\"ird"} 5' in text
    assert 'localrun_time_to_first_token_seconds_bucket{model="we\\"ird",le="0.25"} 1' in text
    assert 'localrun_inter_token_latency_seconds_bucket{le="0.0025"} 0' in text
    assert 'localrun_inter_token_latency_seconds_bucket{le="0.005"} 1' in text
    assert 'localrun_queue_depth{model="a"} 2' in text and "localrun_worker_restarts_total 1" in text
    assert stats.decode_rate == pytest.approx(10.0)
