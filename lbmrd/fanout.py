"""Batched, non-blocking UDP fan-out: one payload to many destinations.

On Linux it calls ``sendmmsg(2)`` through ctypes with per-group arrays of
``struct mmsghdr`` that are built once per group membership change and share
a single ``iovec``; sending a datagram to N clients costs one or a few
system calls and no per-destination Python work. Elsewhere it falls back to
one non-blocking ``sendto`` per destination. :class:`Outbox` gathers the
copies of many datagrams (each to a few clients) for one ``sendmmsg`` call,
and :class:`BatchReceiver` reads what the socket holds with ``recvmmsg(2)``.
Nothing here awaits: a full socket buffer (EAGAIN) is reported back to the
caller.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import sys
from array import array

from .clients import Group

MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
BATCH = 1024  # UIO_MAXIOV: the kernel's limit of messages per sendmmsg call


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _Msghdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_Iovec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _Msghdr), ("msg_len", ctypes.c_uint)]


def _load_sendmmsg():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sendmmsg
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_sendmmsg = _load_sendmmsg()
HAVE_SENDMMSG = _sendmmsg is not None


def _bytes_data_offset() -> int | None:
    """Offset of a bytes object's data from its id() in CPython, checked;
    None where that does not hold (then a ctypes pointer is made per send)."""
    probe = b"lbmrd-fanout-probe"
    off = bytes.__basicsize__ - 1
    try:
        if ctypes.string_at(id(probe) + off, len(probe)) == probe:
            return off
    except Exception:  # noqa: BLE001 - any failure: use the portable path
        pass
    return None


_BYTES_OFF = _bytes_data_offset() if sys.implementation.name == "cpython" else None
_MSG_SIZE = ctypes.sizeof(_Mmsghdr)
_PTR = ctypes.sizeof(ctypes.c_void_p)


_NAME_OFF = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_name.offset
_IOV_OFF = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_iov.offset
_LEN_OFF = _Mmsghdr.msg_len.offset
_SOCKADDR_IN = struct.Struct("!2xH4s8x")  # (port, IPv4 address) of a struct sockaddr_in
_MSG_WORDS = _MSG_SIZE // 8  # an mmsghdr in 64-bit words
_NAME_WORD = _NAME_OFF // 8  # its msg_name, in 64-bit words
_IOV_WORD = _IOV_OFF // 8  # its msg_iov, in 64-bit words
_MSG_U32 = _MSG_SIZE // 4  # an mmsghdr in 32-bit words
_NAMELEN_U32 = (_Mmsghdr.msg_hdr.offset + _Msghdr.msg_namelen.offset) // 4  # its msg_namelen
_LEN_U32 = _LEN_OFF // 4  # its msg_len
#: whether mmsghdr fields can be written and read as strided 64/32-bit words (x86-64, arm64)
_WORDS = _PTR == 8 and _MSG_SIZE % 8 == 0 and _NAME_OFF % 8 == 0 and _IOV_OFF % 8 == 0 and _LEN_OFF % 4 == 0


def _mmsghdrs(cap: int, names: int, iov: int) -> bytearray:
    """``cap`` struct mmsghdr (one iovec each, the iovec at address ``iov``),
    message i naming the 16-byte socket address at ``names + 16 * i``."""
    proto = _Mmsghdr()
    proto.msg_hdr.msg_namelen = 16
    proto.msg_hdr.msg_iov = ctypes.cast(iov, ctypes.POINTER(_Iovec))
    proto.msg_hdr.msg_iovlen = 1
    raw = bytearray(bytes(proto)) * cap
    if _WORDS:
        # every mmsghdr's name pointer in one strided store (no Python loop)
        with memoryview(raw) as view, view.cast("Q") as words:
            words[_NAME_WORD::_MSG_WORDS] = array("Q", range(names, names + 16 * cap, 16))
    else:
        for i in range(cap):
            o = i * _MSG_SIZE + _NAME_OFF
            raw[o:o + _PTR] = (names + 16 * i).to_bytes(_PTR, sys.byteorder)
    return raw


class _GroupArrays:
    """ctypes arrays for one group: socket addresses and mmsghdrs sharing one
    iovec. Kept in step with the group through its ``dirty`` positions; grown
    (rebuilt) only when the group outgrows the capacity."""

    __slots__ = ("cap", "names", "names_view", "iov", "msgs", "base", "names_addr")

    def __init__(self, group: Group) -> None:
        members = group.members
        n = len(members)
        self.cap = cap = max(16, 2 * n)
        self.names = ctypes.create_string_buffer(16 * cap)
        ctypes.memmove(self.names, b"".join([c.sockaddr for c in members]), 16 * n)
        self.names_addr = names = ctypes.addressof(self.names)
        self.names_view = memoryview(self.names).cast("B")
        self.iov = _Iovec()
        raw = _mmsghdrs(cap, names, ctypes.addressof(self.iov))  # all share the one iovec
        self.msgs = (ctypes.c_char * len(raw)).from_buffer(raw)  # the mmsghdrs, no copy
        self.base = ctypes.addressof(self.msgs)
        group.dirty.clear()

    def sync(self, group: Group) -> bool:
        """Apply the group's changes; False when it outgrew the capacity."""
        members = group.members
        if len(members) > self.cap or group.dirty[:1] == [-1]:
            return False
        n = len(members)
        names = self.names_addr
        for i in group.dirty:
            if i < n:
                ctypes.memmove(names + 16 * i, members[i].sockaddr, 16)
        group.dirty.clear()
        return True


def _arrays(group: Group) -> _GroupArrays:
    """The group's arrays, brought in step with its members (rebuilt when
    it outgrew them)."""
    arr = group.sender_cache
    if arr is None or (group.dirty and not arr.sync(group)):
        arr = group.sender_cache = _GroupArrays(group)
    return arr


def _send_mmsghdrs(fd: int, base: int, start: int, stop: int) -> tuple[int, int, str | None]:
    """``sendmmsg(2)`` of messages ``start..stop-1`` of the mmsghdr array at
    address ``base``, in calls of at most :data:`BATCH`, up to the first
    error. Returns (sent, next index, error): the sent messages are
    ``start..start+sent-1``; error is None when all went out, "EAGAIN" when
    the buffer is full (next index: the first not sent), or an errno name
    for the destination at ``start+sent`` (next index skips it)."""
    i = start
    while i < stop:
        r = _sendmmsg(fd, base + _MSG_SIZE * i, min(stop - i, BATCH), MSG_DONTWAIT)
        if r < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                return i - start, i, "EAGAIN"
            if e == errno.EINTR:
                continue
            return i - start, i + 1, errno.errorcode.get(e, str(e))
        i += r
    return i - start, i, None


def _payload_address(payload: bytes) -> tuple[int, object]:
    """The address of ``payload``'s bytes and the object that keeps them
    alive (the payload itself, or a ctypes copy off CPython)."""
    if _BYTES_OFF is not None and type(payload) is bytes:
        return id(payload) + _BYTES_OFF, payload
    buf = ctypes.create_string_buffer(bytes(payload), len(payload))
    return ctypes.addressof(buf), buf


class Outbox:
    """Relay copies queued while one received batch is handled, then sent
    together: many datagrams to a few clients each cost one ``sendmmsg(2)``
    call for all of them instead of one call per datagram.

    :meth:`add` copies the destinations' socket addresses (16 bytes each)
    and points their messages at one iovec per payload, so the groups may
    change before :meth:`send`. Holds at most ``cap`` messages; the
    payloads stay referenced until sent or cleared. Linux with sendmmsg
    only (see :data:`HAVE_SENDMMSG`)."""

    def __init__(self, fd: int, cap: int = BATCH) -> None:
        self.fd = fd
        self.cap = cap
        self._names_buf = ctypes.create_string_buffer(16 * cap)
        self._names = memoryview(self._names_buf).cast("B")
        self._iov_raw = bytearray(ctypes.sizeof(_Iovec) * cap)  # one iovec per payload
        self._iov_addr = ctypes.addressof((ctypes.c_char * len(self._iov_raw)).from_buffer(self._iov_raw))
        self._iov_words = memoryview(self._iov_raw).cast("Q")
        raw = _mmsghdrs(cap, ctypes.addressof(self._names_buf), self._iov_addr)
        self._base = ctypes.addressof((ctypes.c_char * len(raw)).from_buffer(raw))
        self._words = memoryview(raw).cast("Q")
        self._u32 = memoryview(raw).cast("I")
        self._keep: list[object] = []  # per iovec: what keeps its payload alive
        self.count = 0  # messages queued
        self.done = 0  # messages sent or skipped

    @property
    def pending(self) -> int:
        return self.count - self.done

    def add(self, parts, skip=None) -> bool:
        """Queue each (payload, group) of ``parts`` for every member of the
        group but ``skip`` (a client, or None); False, with nothing queued,
        when they do not all fit."""
        i = self.count
        e = len(self._keep)
        need = 0
        for _, group in parts:
            need += len(group.members) - (skip is not None and skip.group is group)
        if i + need > self.cap or e + len(parts) > self.cap:
            return False
        names, keep, iov_words, words = self._names, self._keep, self._iov_words, self._words
        for payload, group in parts:
            n = len(group.members)
            p = skip.pos if skip is not None and skip.group is group else n
            k = n if p == n else n - 1
            if k <= 0:
                continue
            src = _arrays(group).names_view
            if p:  # the members before the skipped one, then those after it
                names[16 * i:16 * (i + p)] = src[:16 * p]
            if p < k:
                names[16 * (i + p):16 * (i + k)] = src[16 * (p + 1):16 * n]
            addr, held = _payload_address(payload)
            keep.append(held)
            iov_words[2 * e] = addr
            iov_words[2 * e + 1] = len(payload)
            at = _IOV_WORD + _MSG_WORDS * i
            words[at:at + _MSG_WORDS * k:_MSG_WORDS] = array("Q", (self._iov_addr + 16 * e,)) * k
            i += k
            e += 1
        self.count = i
        return True

    def send(self) -> tuple[int, int, str | None]:
        """Send the queued messages; returns (datagrams sent, bytes sent,
        error): error is None when all went out (the outbox is then empty),
        "EAGAIN" when the socket buffer is full (call again later), or an
        errno name for one destination, which is skipped."""
        i = self.done
        sent, self.done, err = _send_mmsghdrs(self.fd, self._base, i, self.count)
        at = _LEN_U32 + _MSG_U32 * i
        nbytes = sum(self._u32[at:at + _MSG_U32 * sent:_MSG_U32])  # msg_len of each: set by the kernel
        if err is None:
            self.clear()
        return sent, nbytes, err

    def clear(self) -> None:
        """Forget everything queued (sent or not)."""
        self.count = self.done = 0
        self._keep.clear()


class Fanout:
    """Sends through one non-blocking UDP socket. ``send`` returns how many
    datagrams went out and the (group, start, stop) ranges still pending
    because the socket buffer was full."""

    def __init__(self, sock: socket.socket, use_sendmmsg: bool = True) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.use_sendmmsg = use_sendmmsg and HAVE_SENDMMSG and _WORDS
        self.outbox = Outbox(self.fd) if self.use_sendmmsg else None

    def send_range(self, payload: bytes, group: Group, start: int, stop: int) -> tuple[int, int, str | None]:
        """Send ``payload`` to members ``start..stop-1`` of ``group``.

        Returns (sent, next index, error): error is None when all went out,
        "EAGAIN" when the buffer is full (retry from next index later), or an
        errno name for a per-destination failure (that destination is skipped).
        """
        if not self.use_sendmmsg:
            return self._send_range_plain(payload, group, start, stop)
        arr = _arrays(group)
        arr.iov.iov_base, keep = _payload_address(payload)  # kept referenced for the call
        arr.iov.iov_len = len(payload)
        return _send_mmsghdrs(self.fd, arr.base, start, stop)

    def _send_range_plain(self, payload: bytes, group: Group, start: int, stop: int):
        group.dirty.clear()  # no arrays to keep in step on this path
        group.sender_cache = None
        sendto = self.sock.sendto
        members = group.members
        sent = 0
        for i in range(start, stop):
            try:
                sendto(payload, members[i].addr)
            except BlockingIOError:
                return sent, i, "EAGAIN"
            except OSError as e:
                return sent, i + 1, errno.errorcode.get(e.errno or 0, str(e))
            sent += 1
        return sent, stop, None


def os_error_name(e: OSError) -> str:
    return errno.errorcode.get(e.errno or 0, os.strerror(e.errno or 0))


def _load_recvmmsg():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).recvmmsg
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_recvmmsg = _load_recvmmsg()


class BatchReceiver:
    """Receive up to ``batch`` datagrams per system call (``recvmmsg(2)``),
    non-blocking; falls back to ``recvfrom`` where recvmmsg is missing.

    :meth:`receive` returns a list of (payload bytes, (ip, port)) -- empty
    when nothing is waiting -- and raises OSError for socket errors. The
    message headers are read and reset as strided arrays of 32-bit words,
    without a ctypes attribute access per datagram.
    """

    def __init__(self, sock: socket.socket, batch: int = 32, size: int = 65535) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.batch = batch
        self.size = size
        self._ips: dict[bytes, str] = {}
        if _recvmmsg is None or not _WORDS:
            self._base = None
            return
        self.bufs = ctypes.create_string_buffer(batch * size)
        self.names = ctypes.create_string_buffer(16 * batch)
        self.iovs = (_Iovec * batch)()
        b0 = ctypes.addressof(self.bufs)
        for i in range(batch):
            self.iovs[i].iov_base = b0 + i * size
            self.iovs[i].iov_len = size
        raw = _mmsghdrs(batch, ctypes.addressof(self.names), 0)
        iovs = ctypes.addressof(self.iovs)
        with memoryview(raw) as view, view.cast("Q") as words:  # message i -> iovec i
            words[_IOV_WORD::_MSG_WORDS] = array("Q", range(iovs, iovs + 16 * batch, 16))
        self._raw = raw
        self._base = ctypes.addressof((ctypes.c_char * len(raw)).from_buffer(raw))
        self._u32 = memoryview(raw).cast("I")
        self._bufs = memoryview(self.bufs).cast("B")
        self._names = memoryview(self.names).cast("B")
        self._sixteen = array("I", [16]) * batch
        self._used = 0  # messages whose msg_namelen the kernel may have overwritten

    def receive(self) -> list[tuple[bytes, tuple[str, int]]]:
        if self._base is None:
            try:
                return [self.sock.recvfrom(self.size)]
            except BlockingIOError:
                return []
        u32 = self._u32
        used = self._used
        if used:  # the kernel overwrote msg_namelen of the messages it filled
            u32[_NAMELEN_U32:_NAMELEN_U32 + _MSG_U32 * used:_MSG_U32] = self._sixteen[:used]
        n = _recvmmsg(self.fd, self._base, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            self._used = 0
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            raise OSError(e, os.strerror(e))
        self._used = n
        lens = u32[_LEN_U32:_LEN_U32 + _MSG_U32 * n:_MSG_U32]
        bufs = self._bufs
        ips = self._ips
        out = []
        b = 0
        size = self.size
        for (port, ip4), length in zip(_SOCKADDR_IN.iter_unpack(self._names[:16 * n]), lens, strict=True):
            ip = ips.get(ip4)
            if ip is None:
                if len(ips) > 65536:
                    ips.clear()
                ip = ips[ip4] = socket.inet_ntoa(ip4)
            out.append((bufs[b:b + length].tobytes(), (ip, port)))
            b += size
        return out
