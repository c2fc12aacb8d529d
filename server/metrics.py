"""Prometheus metrics and the access log, hand-written (no dependency, no global registry).

:class:`Observe` is the outermost middleware: it times every request, records its status
under bounded labels, and writes one access-log line when the response has been sent — for a
stream, after the last token. A label is a known HTTP method and a route template of the app
(never the raw method or path, which a client controls: 10,000 made-up method names once made
10,000 series, 75 MB of RSS, and a 93 MB ``/metrics``); anything else is ``other``. Refused
requests (a bad Host, no key) still count, under those same labels.
Generation routes fill in a :class:`RequestStats` found in the ASGI scope with the model,
token counts and first-token time. The log line never holds a header, so never the key.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from localrun.manager import ModelManager

log = logging.getLogger(__name__)
access_log = logging.getLogger("localrun.server.access")

STATS_KEY = "localrun.stats"
#: The methods that become a label as themselves; any other is counted as OTHER.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


@dataclass
class RequestStats:
    """What a generation route learned about its request, for the log line and the metrics."""

    start: float = field(default_factory=time.perf_counter)
    model: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    drafted_tokens: int = 0  # speculative decoding: tokens drafted and verified
    accepted_tokens: int = 0  # … and kept (each one a decode pass saved)
    first_token_at: float | None = None
    last_token_at: float | None = None
    requested_model: str | None = None  # what the body named (DEBUG log only), before any route resolved it
    first_byte_at: float | None = None  # when the response started (its status line)
    reason: str | None = None  # a refused request's error message, for its log line

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.start

    @property
    def ttfb_s(self) -> float | None:
        return None if self.first_byte_at is None else self.first_byte_at - self.start

    @property
    def decode_rate(self) -> float | None:
        if self.first_token_at is None or self.last_token_at is None or self.completion_tokens < 2:
            return None
        span = self.last_token_at - self.first_token_at
        return (self.completion_tokens - 1) / span if span > 0 else None


class Histogram:
    __slots__ = ("buckets", "counts", "total", "count")

    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1

    def render(self, name: str, labels: str = "") -> list[str]:
        sep = "," if labels else ""
        lines, running = [], 0
        for bound, n in zip(self.buckets, self.counts):
            running += n
            lines.append(f'{name}_bucket{{{labels}{sep}le="{bound}"}} {running}')
        running += self.counts[-1]
        lines.append(f'{name}_bucket{{{labels}{sep}le="+Inf"}} {running}')
        suffix = f"{{{labels}}}" if labels else ""
        lines.append(f"{name}_sum{suffix} {self.total:.6f}")
        lines.append(f"{name}_count{suffix} {self.count}")
        return lines


def method_label(method: str) -> str:
    """The method as a label: itself when HTTP defines it for this server, else ``other``."""
    return method if method in KNOWN_METHODS else OTHER


def route_label(scope: Scope) -> str:
    """The matched route's template (``/api/show``, ``/{repo:path}/resolve/...``), else ``other``.

    Only a template the router itself set is used: the set of them is fixed when the app is
    built, so the label set stays bounded whatever paths clients send.
    """
    path = getattr(scope.get("route"), "path", None)
    return path if isinstance(path, str) and path.startswith("/") else OTHER


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Counters and histograms for one app. Updated from the event loop; read by /metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, int], int] = defaultdict(int)
        self.durations: dict[str, Histogram] = {}
        self.ttft: dict[str, Histogram] = {}
        self.itl = Histogram(ITL_BUCKETS)
        self.prompt_tokens: dict[str, int] = defaultdict(int)
        self.completion_tokens: dict[str, int] = defaultdict(int)
        self.drafted_tokens: dict[str, int] = defaultdict(int)
        self.accepted_tokens: dict[str, int] = defaultdict(int)
        self.in_flight = 0

    def observe_request(self, route: str, method: str, status: int, seconds: float, stats: RequestStats) -> None:
        with self._lock:
            self.requests[(route, method, status)] += 1
            self.durations.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)
            if stats.model:
                self.prompt_tokens[stats.model] += stats.prompt_tokens
                self.completion_tokens[stats.model] += stats.completion_tokens
                if stats.drafted_tokens:
                    self.drafted_tokens[stats.model] += stats.drafted_tokens
                    self.accepted_tokens[stats.model] += stats.accepted_tokens
                if stats.ttft_s is not None:
                    self.ttft.setdefault(stats.model, Histogram(LATENCY_BUCKETS)).observe(stats.ttft_s)

    def observe_itl(self, seconds: float) -> None:
        self.itl.observe(seconds)  # one bisect: cheap enough to run per token

    def render(self, *, loaded: list[dict[str, Any]], worker_restarts: int) -> str:
        out: list[str] = []

        def header(name: str, kind: str, text: str) -> None:
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")

        with self._lock:
            header("localrun_requests_total", "counter", "HTTP requests by route, method and status.")
            for (route, method, status), n in sorted(self.requests.items()):
                out.append(
                    f'localrun_requests_total{{route="{_label(route)}",method="{method}",status="{status}"}} {n}'
                )
            header("localrun_request_duration_seconds", "histogram", "Time from request to last byte.")
            for route, h in sorted(self.durations.items()):
                out.extend(h.render("localrun_request_duration_seconds", f'route="{_label(route)}"'))
            header("localrun_time_to_first_token_seconds", "histogram", "Time from request to first generated text.")
            for model, h in sorted(self.ttft.items()):
                out.extend(h.render("localrun_time_to_first_token_seconds", f'model="{_label(model)}"'))
            header("localrun_inter_token_latency_seconds", "histogram", "Gaps between streamed chunks.")
            out.extend(self.itl.render("localrun_inter_token_latency_seconds"))
            header("localrun_prompt_tokens_total", "counter", "Prompt tokens processed.")
            for model, n in sorted(self.prompt_tokens.items()):
                out.append(f'localrun_prompt_tokens_total{{model="{_label(model)}"}} {n}')
            header("localrun_completion_tokens_total", "counter", "Tokens generated.")
            for model, n in sorted(self.completion_tokens.items()):
                out.append(f'localrun_completion_tokens_total{{model="{_label(model)}"}} {n}')
            self._render_speculative(out, header)
            header("localrun_http_requests_in_flight", "gauge", "HTTP requests being served.")
            out.append(f"localrun_http_requests_in_flight {self.in_flight}")
        header("localrun_queue_depth", "gauge", "Requests admitted per model (queued or running).")
        for m in loaded:
            out.append(f'localrun_queue_depth{{model="{_label(str(m.get("name")))}"}} {m.get("active", 0)}')
        header("localrun_models_loaded", "gauge", "Models loaded now.")
        out.append(f"localrun_models_loaded {len(loaded)}")
        header("localrun_worker_restarts_total", "counter", "Workers that died and were started again.")
        out.append(f"localrun_worker_restarts_total {worker_restarts}")
        return "\n".join(out) + "\n"

    def _render_speculative(self, out: list[str], header: Callable[[str, str, str], None]) -> None:
        """Speculative decoding per model: drafted, accepted (= decode passes saved) and the rate."""
        header(
            "localrun_speculative_drafted_tokens_total",
            "counter",
            "Tokens drafted and verified (speculative decoding).",
        )
        for model, n in sorted(self.drafted_tokens.items()):
            out.append(f'localrun_speculative_drafted_tokens_total{{model="{_label(model)}"}} {n}')
        header(
            "localrun_speculative_accepted_tokens_total",
            "counter",
            "Drafted tokens the model kept: each one is a decode pass saved.",
        )
        for model, n in sorted(self.accepted_tokens.items()):
            out.append(f'localrun_speculative_accepted_tokens_total{{model="{_label(model)}"}} {n}')
        header(
            "localrun_speculative_acceptance_ratio", "gauge", "Accepted over drafted tokens, since the server started."
        )
        for model, n in sorted(self.drafted_tokens.items()):
            out.append(
                f'localrun_speculative_acceptance_ratio{{model="{_label(model)}"}} '
                f"{self.accepted_tokens[model] / n:.4f}"
            )


def render_cache(stats: dict[str, dict[str, Any]]) -> str:
    """The prompt cache of each loaded model (``ModelManager.cache_stats``): what it holds per tier
    (gauges) and the disk tier's traffic (counters, from the worker's start)."""
    out: list[str] = []
    gauges = [
        ("localrun_prompt_cache_tokens", "Tokens of cached prefixes, by tier (slots, ram, disk).", "tokens"),
        ("localrun_prompt_cache_bytes", "Bytes of cached prefix state, by tier (ram, disk).", "bytes"),
        ("localrun_prompt_cache_entries", "Cached prefixes kept outside the slots, by tier (ram, disk).", "entries"),
    ]
    tiers = {
        "tokens": (("slots", "slot_tokens"), ("ram", "host_tokens"), ("disk", "disk_tokens")),
        "bytes": (("ram", "host_bytes"), ("disk", "disk_bytes")),
        "entries": (("ram", "host_entries"), ("disk", "disk_entries")),
    }
    for name, text, kind in gauges:
        out += [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
        for model, s in sorted(stats.items()):
            for tier, key in tiers[kind]:
                out.append(f'{name}{{model="{_label(model)}",tier="{tier}"}} {int(s.get(key, 0))}')
    counters = [
        ("localrun_prompt_cache_disk_hits_total", "disk_hits", "Prefixes restored from the disk tier."),
        ("localrun_prompt_cache_disk_misses_total", "disk_misses", "Disk lookups that found nothing usable."),
        ("localrun_prompt_cache_disk_read_bytes_total", "disk_read_bytes", "Bytes read from the disk tier."),
        ("localrun_prompt_cache_disk_written_bytes_total", "disk_written_bytes", "Bytes written to the disk tier."),
        ("localrun_prompt_cache_disk_restored_tokens_total", "disk_restored_tokens", "Tokens restored from disk."),
    ]
    for name, key, text in counters:
        out += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
        for model, s in sorted(stats.items()):
            out.append(f'{name}{{model="{_label(model)}"}} {int(s.get(key, 0))}')
    return "\n".join(out) + "\n"


class Observe:
    """Outermost middleware: per-request metrics and one access-log line."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        stats = RequestStats()
        scope[STATS_KEY] = stats
        status = 0

        async def observed_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                stats.first_byte_at = time.perf_counter()
            elif status >= 400 and stats.reason is None and message["type"] == "http.response.body":
                stats.reason = reason_of(message.get("body", b""))
            await send(message)

        self.metrics.in_flight += 1
        try:
            await self.app(scope, receive, observed_send)
        except Exception:
            status = status or 500  # the error handler outside us answers 500
            raise
        finally:
            self.metrics.in_flight -= 1
            seconds = time.perf_counter() - stats.start
            status = status or 499  # nothing was sent: the client left, or the task was cancelled
            # By now the guards have decided: a refused request has no route and is counted as "other".
            self.metrics.observe_request(route_label(scope), method_label(scope["method"]), status, seconds, stats)
            _log_access(scope, status, seconds, stats)


def _shown(text: str, limit: int = 200) -> str:
    """A client-controlled string safe on one log line: control and non-ASCII characters escaped."""
    text = text[:limit]
    return text if text.isascii() and text.isprintable() else text.encode("unicode_escape").decode("ascii")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}ms"


def reason_of(body: bytes) -> str:
    """The message of an error body in any family's shape (``{"error": {"message"}}``, Ollama's
    ``{"error": "…"}``), else the body's start: what a refused request's log line says."""
    try:
        error = json.loads(body[:8192]).get("error")
    except (ValueError, AttributeError, RecursionError):
        return _shown(body[:200].decode("utf-8", "replace"))
    message = error.get("message") if isinstance(error, dict) else error
    return _shown(str(message or "")) if message else "-"


def _log_access(scope: Scope, status: int, seconds: float, stats: RequestStats) -> None:
    """One line per request, as llama-server and Ollama write it: method, path, status, time, and
    the model with its tokens, or a refusal's reason (the server's default level shows it). At
    DEBUG the same with what a user needs to see what a client sent (route, the model the body
    named, time to first byte). Never a header, so never the key, and never the body's text."""
    debug = access_log.isEnabledFor(logging.DEBUG)
    if not debug and not access_log.isEnabledFor(logging.INFO):
        return
    client = scope.get("client") or ("-", 0)
    request = f"{_shown(scope['method'], 32)} {_shown(scope.get('path', ''))}"
    parts = [f'{client[0]} "{request}" {status} {seconds * 1000:.1f}ms']
    if debug:
        parts.append(f"route={route_label(scope)} ttfb={_ms(stats.ttfb_s)} total={_ms(seconds)}")
        if not stats.model:  # a route that never reached the model (refused, failed): what the body asked for
            parts.append(f"model={_shown(stats.requested_model, 100) if stats.requested_model else '-'}")
    if stats.model:
        rate = stats.decode_rate
        parts.append(
            f"model={stats.model} prompt_tokens={stats.prompt_tokens} completion_tokens={stats.completion_tokens}"
            f" cached_tokens={stats.cached_tokens}"
            + (f" drafted={stats.drafted_tokens} accepted={stats.accepted_tokens}" if stats.drafted_tokens else "")
            + f" ttft={_ms(stats.ttft_s)} tok/s={'-' if rate is None else f'{rate:.1f}'}"
        )
    if stats.reason and status >= 400:
        parts.append(f'reason="{stats.reason}"')
    (access_log.debug if debug else access_log.info)(" ".join(parts))


class UpstreamMetrics:
    """Per upstream and model: requests, errors by kind, TTFT and duration, cooldowns.

    Fed by the upstream pool's observer callback (from request threads, hence the lock);
    in-flight counts and health are read from the pool when /metrics is rendered.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self.errors: dict[tuple[str, str, str], int] = defaultdict(int)
        self.cooldowns: dict[str, int] = defaultdict(int)
        self.ttft: dict[tuple[str, str], Histogram] = {}
        self.durations: dict[tuple[str, str], Histogram] = {}

    def observe(self, upstream: str, model: str, event: str, **values: Any) -> None:
        with self._lock:
            if event == "first_byte":
                self.ttft.setdefault((upstream, model), Histogram(LATENCY_BUCKETS)).observe(values["seconds"])
            elif event == "done":
                self.requests[(upstream, model, values.get("outcome", "ok"))] += 1
                self.durations.setdefault((upstream, model), Histogram(LATENCY_BUCKETS)).observe(values["seconds"])
            elif event == "error":
                self.errors[(upstream, model, values.get("error_kind", "error"))] += 1
            elif event == "cooldown":
                self.cooldowns[upstream] += 1

    def render(self, status: list[dict[str, Any]]) -> str:
        out: list[str] = []

        def header(name: str, kind: str, text: str) -> None:
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")

        def lab(up: str, model: str | None = None) -> str:
            return f'upstream="{_label(up)}"' + (f',model="{_label(model)}"' if model is not None else "")

        with self._lock:
            header("localrun_upstream_requests_total", "counter", "Requests an upstream answered, by outcome.")
            for (up, model, outcome), n in sorted(self.requests.items()):
                out.append(f'localrun_upstream_requests_total{{{lab(up, model)},outcome="{outcome}"}} {n}')
            header(
                "localrun_upstream_errors_total",
                "counter",
                "Failed upstream requests by kind (connect, timeout, http_5xx, stream, auth…).",
            )
            for (up, model, kind), n in sorted(self.errors.items()):
                out.append(f'localrun_upstream_errors_total{{{lab(up, model)},kind="{_label(kind)}"}} {n}')
            header(
                "localrun_upstream_time_to_first_token_seconds",
                "histogram",
                "From sending to an upstream to its first token.",
            )
            for (up, model), h in sorted(self.ttft.items()):
                out.extend(h.render("localrun_upstream_time_to_first_token_seconds", lab(up, model)))
            header(
                "localrun_upstream_request_duration_seconds",
                "histogram",
                "From sending to an upstream to its last token.",
            )
            for (up, model), h in sorted(self.durations.items()):
                out.extend(h.render("localrun_upstream_request_duration_seconds", lab(up, model)))
            header("localrun_upstream_cooldowns_total", "counter", "Times an upstream was put in cooldown.")
            for s in status:
                out.append(f"localrun_upstream_cooldowns_total{{{lab(s['name'])}}} {self.cooldowns.get(s['name'], 0)}")
        header("localrun_upstream_in_flight", "gauge", "Requests at an upstream now.")
        for s in status:
            out.append(f"localrun_upstream_in_flight{{{lab(s['name'])}}} {s['in_flight']}")
        header("localrun_upstream_up", "gauge", "1 when the upstream's last probe passed and it is not cooling down.")
        for s in status:
            out.append(
                f'localrun_upstream_up{{{lab(s["name"])},state="{s["health"]}"}} {1 if s["health"] == "up" else 0}'
            )
        header("localrun_upstream_cooldown_seconds", "gauge", "Seconds of cooldown left.")
        for s in status:
            out.append(f"localrun_upstream_cooldown_seconds{{{lab(s['name'])}}} {s['cooldown_left_s']}")
        return "\n".join(out) + "\n"


def attach_upstream_metrics(manager: ModelManager) -> UpstreamMetrics | None:
    """Subscribe upstream metrics to the manager's upstreams; None when there are none."""
    metrics = UpstreamMetrics()
    return metrics if manager.observe_upstreams(metrics.observe) else None
