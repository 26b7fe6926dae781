"""Linux network namespaces for tests: isolated loopback (with multicast) and veth links.

    from tests.netns import NetNS, netns_factory, veth   # netns_factory is a pytest fixture

    def test_x(netns_factory):
        ns = netns_factory()                      # lo up, multicast on, 224.0.0.0/4 via lo
        r = ns.run([sys.executable, "-c", "print(1)"])
        a, b = netns_factory(), netns_factory()
        veth(a, "198.18.0.1/24", b, "198.18.0.2/24")

Everything happens inside namespaces created here: interfaces are created directly in
them (``ip -n NS link add ... peer ... netns OTHER``), never in the caller's namespace,
whose interfaces and routes are never touched. Names are ``lbmrk-<pid>-<n>``.
:meth:`NetNS.close` (also on ``with`` exit and at the end of a test using the fixture)
kills the processes started with :meth:`NetNS.popen`, then any other process still in
the namespace (all were started by this test through the namespace), and deletes it.
Every command has a timeout. Needs root (or CAP_SYS_ADMIN) and iproute2.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

import pytest

IP = "ip"
PREFIX = "lbmrk"
CMD_TIMEOUT = 30.0  # seconds, for every ip(8) command
_counter = itertools.count()
_veth_counter = itertools.count()


class NetNSError(RuntimeError):
    """An ip(8) command failed."""


def _ip(*args: str, timeout: float = CMD_TIMEOUT) -> str:
    try:
        r = subprocess.run([IP, *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise NetNSError("ip(8) is missing: install iproute2") from None
    except subprocess.TimeoutExpired:
        raise NetNSError(f"ip {' '.join(args)}: timed out after {timeout} s") from None
    if r.returncode != 0:
        raise NetNSError(f"ip {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Delete ``lbmrk-<pid>-<n>`` namespaces left behind by test processes that no
    longer exist (e.g. killed with SIGKILL). Returns the deleted names."""
    try:
        listing = _ip("netns", "list")
    except NetNSError:
        return []
    gone = []
    for line in listing.splitlines():
        m = re.match(rf"({PREFIX}-(\d+)-\d+)\b", line.strip())
        if m and int(m.group(2)) != os.getpid() and not _pid_alive(int(m.group(2))):
            try:
                _ip("netns", "del", m.group(1))
                gone.append(m.group(1))
            except NetNSError:
                pass
    return gone


class NetNS:
    """One named network namespace (see the module docstring).

    ``multicast``: ``lo`` gets the MULTICAST flag and 224.0.0.0/4 is routed to it
    (``lo_route``); with ``multicast=False`` lo is up without the flag and without
    the route (to check that multicast users refuse it).
    """

    def __init__(self, name: str | None = None, *, multicast: bool = True,
                 lo_route: bool | None = None) -> None:
        self.name = name or f"{PREFIX}-{os.getpid()}-{next(_counter)}"
        self.multicast = multicast
        self.lo_route = multicast if lo_route is None else lo_route
        self.procs: list[subprocess.Popen] = []
        self.created = False
        self.closed = False

    # ------------------------------------------------------------ lifecycle

    def create(self) -> NetNS:
        if self.created:
            return self
        _ip("netns", "add", self.name)
        self.created = True
        try:
            _ip("-n", self.name, "link", "set", "lo", "up", "multicast",
                "on" if self.multicast else "off")
            if self.lo_route:
                _ip("-n", self.name, "route", "add", "224.0.0.0/4", "dev", "lo")
        except BaseException:
            self.close()
            raise
        return self

    def __enter__(self) -> NetNS:
        return self.create()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self, grace: float = 5.0) -> None:
        """Stop every process started in the namespace and delete it (idempotent)."""
        if self.closed or not self.created:
            self.closed = True
            return
        self.closed = True
        try:
            for p in self.procs:
                _stop(p, grace)
            for pid in self.pids():
                _kill_pid(pid, grace)
        finally:
            try:
                _ip("netns", "del", self.name)
            except NetNSError:
                if self.name in self.list_names():
                    raise

    @staticmethod
    def list_names() -> list[str]:
        return [ln.split()[0] for ln in _ip("netns", "list").splitlines() if ln.strip()]

    # ------------------------------------------------------------ running

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``ip netns exec NAME argv...``."""
        return [IP, "netns", "exec", self.name, *map(str, argv)]

    def run(self, argv: Sequence[str], *, timeout: float = 60.0, check: bool = False,
            capture_output: bool = True, text: bool = True, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the namespace and wait (at most ``timeout`` seconds;
        the process is killed and TimeoutExpired raised after that)."""
        self._check_open()
        return subprocess.run(self.argv(argv), timeout=timeout, check=check,
                              capture_output=capture_output, text=text, **kw)

    def popen(self, argv: Sequence[str], **kw) -> subprocess.Popen:
        """Start ``argv`` inside the namespace (in its own session, so its whole
        process group can be stopped); stopped by :meth:`close`."""
        self._check_open()
        kw.setdefault("start_new_session", True)
        p = subprocess.Popen(self.argv(argv), **kw)
        self.procs.append(p)
        return p

    def pids(self) -> list[int]:
        """The processes currently in the namespace."""
        try:
            out = _ip("netns", "pids", self.name)
        except NetNSError:
            return []
        return [int(x) for x in out.split() if x.isdigit()]

    def ip(self, *args: str) -> str:
        """``ip -n NAME args...`` (stdout)."""
        self._check_open()
        return _ip("-n", self.name, *args)

    def veth(self, cidr: str, peer: NetNS, peer_cidr: str, **kw) -> tuple[str, str]:
        """A veth pair from this namespace to ``peer``; see :func:`veth`."""
        return veth(self, cidr, peer, peer_cidr, **kw)

    def _check_open(self) -> None:
        if not self.created or self.closed:
            raise NetNSError(f"namespace {self.name} is not open")

    def __repr__(self) -> str:
        return f"NetNS({self.name!r})"


def veth(ns_a: NetNS, cidr_a: str, ns_b: NetNS, cidr_b: str, *,
         names: tuple[str, str] | None = None, mtu: int | None = None) -> tuple[str, str]:
    """Link two namespaces with a veth pair, ``cidr_a`` (e.g. "198.18.0.1/24") on
    the end in ``ns_a`` and ``cidr_b`` on the end in ``ns_b``; both ends up, with
    multicast. The pair is created inside ``ns_a`` and its peer moved straight into
    ``ns_b``, so the caller's namespace never sees it. Returns the two interface
    names (deleted with the namespaces)."""
    if names is None:
        n = next(_veth_counter)
        names = (f"lbv{os.getpid() % 100000}a{n}", f"lbv{os.getpid() % 100000}b{n}")
    a, b = names
    if max(len(a), len(b)) > 15:
        raise ValueError(f"interface names longer than 15 characters: {names}")
    ns_a.ip("link", "add", a, "type", "veth", "peer", "name", b, "netns", ns_b.name)
    for ns, dev, cidr in ((ns_a, a, cidr_a), (ns_b, b, cidr_b)):
        if mtu is not None:
            ns.ip("link", "set", dev, "mtu", str(mtu))
        ns.ip("addr", "add", cidr, "dev", dev)
        ns.ip("link", "set", dev, "up", "multicast", "on")
    return a, b


def _stop(p: subprocess.Popen, grace: float) -> None:
    """SIGTERM then SIGKILL one process we started (and its process group, when
    it leads one of its own)."""
    if p.poll() is not None:
        return
    own_group = False
    try:
        own_group = os.getpgid(p.pid) == p.pid
    except ProcessLookupError:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            if own_group:
                os.killpg(p.pid, sig)
            else:
                p.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_pid(pid: int, grace: float) -> None:
    """SIGTERM, then SIGKILL, a process left in our namespace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _pid_alive(pid):
                return
            time.sleep(0.05)


@pytest.fixture
def netns_factory(request) -> Iterator[Callable[..., NetNS]]:
    """A function making open :class:`NetNS` objects (keyword arguments as for
    :class:`NetNS`); all are closed at the end of the test, newest first. If a
    namespace cannot be created the test fails (never skips) with the reason."""
    made: list[NetNS] = []

    def finish() -> None:
        errors = []
        for ns in reversed(made):
            try:
                ns.close()
            except Exception as e:  # keep cleaning the others
                errors.append(f"{ns.name}: {e}")
        if errors:
            raise NetNSError("namespace cleanup failed: " + "; ".join(errors))

    request.addfinalizer(finish)
    remove_stale()

    def make(**kw) -> NetNS:
        ns = NetNS(**kw)
        made.append(ns)
        try:
            return ns.create()
        except NetNSError as e:
            pytest.fail(f"cannot create the network namespace {ns.name}: {e}; these tests need "
                        "root (CAP_SYS_ADMIN) and iproute2's 'ip netns'", pytrace=False)

    yield make
