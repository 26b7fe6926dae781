"""Batched, non-blocking UDP fan-out: one payload to many destinations.

On Linux it calls ``sendmmsg(2)`` through ctypes with per-group arrays of
``struct mmsghdr`` that are built once per group membership change and share
a single ``iovec``; sending a datagram to N clients costs one or a few
system calls and no per-destination Python work. Elsewhere it falls back to
one non-blocking ``sendto`` per destination. Nothing here awaits: a full
socket buffer (EAGAIN) is reported back to the caller.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
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


class _GroupArrays:
    """ctypes arrays for one group: socket addresses and mmsghdrs sharing one
    iovec. Kept in step with the group through its ``dirty`` positions; grown
    (rebuilt) only when the group outgrows the capacity."""

    __slots__ = ("cap", "names", "iov", "msgs", "base", "names_addr")

    def __init__(self, group: Group) -> None:
        members = group.members
        n = len(members)
        self.cap = cap = max(16, 2 * n)
        self.names = ctypes.create_string_buffer(16 * cap)
        ctypes.memmove(self.names, b"".join([c.sockaddr for c in members]), 16 * n)
        self.names_addr = names = ctypes.addressof(self.names)
        self.iov = _Iovec()
        iov = ctypes.addressof(self.iov)
        # every mmsghdr: name -> its 16-byte slot, iov -> the shared iovec
        proto = _Mmsghdr()
        proto.msg_hdr.msg_namelen = 16
        proto.msg_hdr.msg_iov = ctypes.cast(iov, ctypes.POINTER(_Iovec))
        proto.msg_hdr.msg_iovlen = 1
        raw = bytearray(bytes(proto)) * cap
        name_off = _Mmsghdr.msg_hdr.offset + _Msghdr.msg_name.offset
        if _PTR == 8 and _MSG_SIZE % 8 == 0 and name_off % 8 == 0:
            # every mmsghdr's name pointer in one strided store (no Python loop)
            with memoryview(raw) as view, view.cast("Q") as words:
                words[name_off // 8::_MSG_SIZE // 8] = array("Q", range(names, names + 16 * cap, 16))
        else:
            for i in range(cap):
                o = i * _MSG_SIZE + name_off
                raw[o:o + _PTR] = (names + 16 * i).to_bytes(_PTR, sys.byteorder)
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


class Fanout:
    """Sends through one non-blocking UDP socket. ``send`` returns how many
    datagrams went out and the (group, start, stop) ranges still pending
    because the socket buffer was full."""

    def __init__(self, sock: socket.socket, use_sendmmsg: bool = True) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.use_sendmmsg = use_sendmmsg and HAVE_SENDMMSG

    def send_range(self, payload: bytes, group: Group, start: int, stop: int) -> tuple[int, int, str | None]:
        """Send ``payload`` to members ``start..stop-1`` of ``group``.

        Returns (sent, next index, error): error is None when all went out,
        "EAGAIN" when the buffer is full (retry from next index later), or an
        errno name for a per-destination failure (that destination is skipped).
        """
        if not self.use_sendmmsg:
            return self._send_range_plain(payload, group, start, stop)
        arr = group.sender_cache
        if arr is None or (group.dirty and not arr.sync(group)):
            arr = group.sender_cache = _GroupArrays(group)
        if _BYTES_OFF is not None and type(payload) is bytes:
            arr.iov.iov_base = id(payload) + _BYTES_OFF  # payload stays referenced for the call
        else:
            buf = ctypes.c_char_p(bytes(payload))
            arr.iov.iov_base = ctypes.cast(buf, ctypes.c_void_p).value
        arr.iov.iov_len = len(payload)
        sent = 0
        i = start
        size = _MSG_SIZE
        while i < stop:
            count = min(stop - i, BATCH)
            r = _sendmmsg(self.fd, arr.base + size * i, count, MSG_DONTWAIT)
            if r < 0:
                e = ctypes.get_errno()
                if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS):
                    return sent, i, "EAGAIN"
                if e == errno.EINTR:
                    continue
                return sent, i + 1, errno.errorcode.get(e, str(e))  # skip the failing one
            sent += r
            i += r
        return sent, i, None

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
    when nothing is waiting -- and raises OSError for socket errors.
    """

    def __init__(self, sock: socket.socket, batch: int = 32, size: int = 65535) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.batch = batch
        self.size = size
        self._ips: dict[bytes, str] = {}
        if _recvmmsg is None:
            return
        self.bufs = ctypes.create_string_buffer(batch * size)
        self.names = ctypes.create_string_buffer(16 * batch)
        self.iovs = (_Iovec * batch)()
        self.msgs = (_Mmsghdr * batch)()
        b0 = ctypes.addressof(self.bufs)
        n0 = ctypes.addressof(self.names)
        for i in range(batch):
            self.iovs[i].iov_base = b0 + i * size
            self.iovs[i].iov_len = size
            h = self.msgs[i].msg_hdr
            h.msg_iov = ctypes.pointer(self.iovs[i])
            h.msg_iovlen = 1
            h.msg_name = n0 + 16 * i
        self._base = ctypes.addressof(self.msgs)
        self._b0 = b0

    def receive(self) -> list[tuple[bytes, tuple[str, int]]]:
        if _recvmmsg is None:
            try:
                return [self.sock.recvfrom(self.size)]
            except BlockingIOError:
                return []
        msgs = self.msgs
        for i in range(self.batch):  # the kernel overwrites msg_namelen
            msgs[i].msg_hdr.msg_namelen = 16
        n = _recvmmsg(self.fd, self._base, self.batch, MSG_DONTWAIT, None)
        if n < 0:
            e = ctypes.get_errno()
            if e in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return []
            raise OSError(e, os.strerror(e))
        names = self.names.raw[:16 * n]
        ips = self._ips
        out = []
        string_at = ctypes.string_at
        b0 = self._b0
        size = self.size
        for i in range(n):
            ip4 = names[16 * i + 4:16 * i + 8]
            ip = ips.get(ip4)
            if ip is None:
                if len(ips) > 65536:
                    ips.clear()
                ip = ips[ip4] = socket.inet_ntoa(ip4)
            port = (names[16 * i + 2] << 8) | names[16 * i + 3]
            out.append((string_at(b0 + i * size, msgs[i].msg_len), (ip, port)))
        return out
