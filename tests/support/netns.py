"""Other hosts on one machine, made of network namespaces joined by veth pairs, nothing else.

:func:`other_host`: one namespace joined to this one (an upstream on another host, 10.232.N.0/30).
:func:`two_hosts`: two namespaces joined to each other (the mirror's host A and host B):

    host A (lr-a-XXXX)  10.231.N.1/30 ── veth ── 10.231.N.2/30  host B (lr-b-XXXX)

Each namespace has only ``lo`` and its end of the pair, so B has no route but to A, and
neither can reach any address outside them. The addresses exist only inside these two
namespaces. :func:`two_hosts` tears everything down, whatever happens in the test.

Where namespaces are not permitted (no root, a locked-down container), it yields a
loopback stand-in and says so on stderr and as a pytest warning — the test still runs,
over 127.0.0.1, and its output names the fallback; it never skips silently.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Hosts:
    a_ip: str
    b_ip: str
    a_prefix: list[str] = field(default_factory=list)
    b_prefix: list[str] = field(default_factory=list)
    b_dev: str | None = None
    isolated: bool = True
    a_dev: str | None = None

    def b_rx_bytes(self) -> int:
        """Bytes host B has received on its link to A (its veth, or lo in the fallback)."""
        dev = self.b_dev or "lo"
        out = subprocess.run(
            [*self.b_prefix, "cat", f"/sys/class/net/{dev}/statistics/rx_bytes"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
        return int(out.stdout.strip())

    def throttle_b(self, rate: str) -> bool:
        """Limit what B receives; False where that cannot be done. A qdisc shapes what a device
        sends, so the pacing sits on A's end of the pair (B's end would slow only B's ACKs)."""
        if not self.isolated:
            return False
        done = subprocess.run(
            [
                *self.a_prefix,
                "tc",
                "qdisc",
                "replace",
                "dev",
                self.a_dev,
                "root",
                "tbf",
                "rate",
                rate,
                "burst",
                "64kb",
                "latency",
                "400ms",
            ],
            capture_output=True,
            timeout=10,
        )
        return done.returncode == 0

    def unthrottle_b(self) -> None:
        if self.isolated:
            subprocess.run(
                [*self.a_prefix, "tc", "qdisc", "del", "dev", self.a_dev, "root"], capture_output=True, timeout=10
            )


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@dataclass
class Host:
    address: str  # where the server listens, as seen from here
    prefix: list[str]  # command prefix that runs a program on that host
    isolated: bool  # a real namespace (False: loopback fallback)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=20)


@contextlib.contextmanager
def other_host() -> Iterator[Host]:
    """A namespace host at 10.232.N.2 (N from this process id), or loopback where not permitted."""
    n = os.getpid() % 250 + 1
    ns, here, there = f"lrup{os.getpid()}", f"lru{os.getpid() % 100000}a", f"lru{os.getpid() % 100000}b"
    if shutil.which("ip") is None or os.geteuid() != 0:
        print("network namespaces not permitted here (need root and `ip`): upstream runs on loopback instead")
        yield Host("127.0.0.1", [], False)
        return
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", here, "type", "veth", "peer", "name", there)
        _ip("link", "set", there, "netns", ns)
        _ip("addr", "add", f"10.232.{n}.1/30", "dev", here)
        _ip("link", "set", here, "up")
        _ip("-n", ns, "addr", "add", f"10.232.{n}.2/30", "dev", there)
        _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        _cleanup(ns, here)
        print(f"network namespace not permitted ({exc}): upstream runs on loopback instead")
        yield Host("127.0.0.1", [], False)
        return
    try:
        print(f"upstream host: network namespace {ns} at 10.232.{n}.2 over veth {here}")
        yield Host(f"10.232.{n}.2", ["ip", "netns", "exec", ns], True)
    finally:
        _cleanup(ns, here)


def _cleanup(ns: str, link: str) -> None:
    for args in (("link", "del", link), ("netns", "del", ns)):
        subprocess.run(["ip", *args], capture_output=True, timeout=20)


@contextlib.contextmanager
def two_hosts():
    tag = secrets.token_hex(3)
    a, b, va, vb = f"lr-a-{tag}", f"lr-b-{tag}", f"lra{tag}", f"lrb{tag}"
    net = 1 + secrets.randbelow(250)
    a_ip, b_ip = f"10.231.{net}.1", f"10.231.{net}.2"
    made: list[str] = []
    try:
        for ns in (a, b):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, ip in ((a, va, a_ip), (b, vb, b_ip)):
            _ip("-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
    except (OSError, subprocess.CalledProcessError) as exc:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
        why = getattr(exc, "stderr", b"") or str(exc).encode()
        msg = (
            f"NETWORK NAMESPACES UNAVAILABLE ({why.decode(errors='replace').strip()[:200]}): falling back to "
            "LOOPBACK, host A and B share this machine's network"
        )
        print(msg, file=sys.stderr)
        warnings.warn(msg, stacklevel=2)
        yield Hosts("127.0.0.1", "127.0.0.1", isolated=False)
        return
    try:
        yield Hosts(a_ip, b_ip, ["ip", "netns", "exec", a], ["ip", "netns", "exec", b], vb, a_dev=va)
    finally:
        for ns in made:
            pids = subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20
            ).stdout.split()
            for pid in pids:  # only processes this test started live in its namespaces
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@contextlib.contextmanager
def no_network():
    """A namespace with only ``lo`` (up): no route anywhere, DNS fails at once. Yields the
    command prefix; without namespaces it says so and yields None (the caller decides)."""
    ns = f"lr-off-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", ns)
    except (OSError, subprocess.CalledProcessError) as exc:
        msg = f"NETWORK NAMESPACES UNAVAILABLE ({exc}): cannot take the network away from a command here"
        print(msg, file=sys.stderr)
        warnings.warn(msg, stacklevel=2)
        yield None
        return
    try:
        _ip("-n", ns, "link", "set", "lo", "up")
        yield ["ip", "netns", "exec", ns]
    finally:
        for pid in subprocess.run(
            ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=20
        ).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
