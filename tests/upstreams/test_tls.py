"""TLS to an upstream: verified by default (a certificate from an unknown CA is refused, clearly),
trusted through ``ca_bundle`` for an intranet CA. The CA and certificate are made here by openssl."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest

from tests.upstreams.replay import Replay, Reply, chat_sse, models_json

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture
def intranet_ca(tmp_path):
    """(ca.pem, server.pem, server.key): a throw-away CA and a certificate for 127.0.0.1 signed by it."""

    def run(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "1",
        "-subj",
        "/CN=test intranet CA",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (tmp_path / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "1",
        "-extfile",
        "san.ext",
    )
    return tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"


def test_unknown_ca_is_refused_and_a_ca_bundle_trusts_it(intranet_ca, front_factory):
    ca, cert, key = intranet_ca
    up = Replay(
        {
            "GET /health": Reply(200, b""),
            "GET /v1/models": Reply(body=models_json("m")),
            "POST /v1/chat/completions": Reply(body=chat_sse(["secure"]), sse=True),
        },
        tls=(str(cert), str(key)),
    )
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
        strict = front_factory([{"name": "intra", "url": up.url, "kind": "vllm", "models": ["m"]}])
        assert "CERTIFICATE_VERIFY_FAILED" in strict.pool.get("intra").status()["detail"]
        r = httpx.post(strict.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 503 and "intra" in r.json()["error"]["message"]
        trusted = front_factory([{"name": "intra", "url": up.url, "kind": "vllm", "ca_bundle": str(ca)}])
        assert trusted.pool.get("intra").status()["health"] == "up"
        r = httpx.post(trusted.url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "secure"
    finally:
        up.close()
