"""The value checkers of a ``<peer>`` portal of lbmr-router's configuration:
:func:`parse_peer` (``<single-tcp>`` with its ``<initiator>`` or
``<acceptor>``, socket buffers, ``<max-queue>``, ``<gateway-keepalive>``; the
portal's ``<acl>`` through :meth:`router.config.checker.Checker.portal_acl`)
and the ``<tls>`` checker, which opens the PEM files it names (when the
:class:`~router.config.checker.Checker` checks files) to report a missing,
unreadable, wrong or encrypted-without-password file before the router starts.

Times are in milliseconds, sizes in bytes.
"""

from __future__ import annotations

import os
import re
import ssl
import stat

from lxml import etree

from lbmr_runtime.xmlconfig import element_text

from .checker import INT_MAX, Checker, parse_unicast
from .model import (
    DEFAULT_KEEPALIVE_INTERVAL_MS,
    DEFAULT_KEEPALIVE_TIMEOUT_MS,
    DEFAULT_MAX_QUEUE,
    DEFAULT_RECONNECT_INTERVAL_MS,
    MIN_MAX_QUEUE,
    AcceptorConfig,
    InitiatorConfig,
    KeepaliveConfig,
    PeerConfig,
    TlsConfig,
)

_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY_RE = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )?PRIVATE KEY-----")
_PEM_ENCRYPTED = (b"-----BEGIN ENCRYPTED PRIVATE KEY-----", b"Proc-Type: 4,ENCRYPTED")


def parse_tls(c: Checker, el: etree._Element, *, peer: bool = True) -> TlsConfig | None:
    """A ``<tls>`` element (a peer's; ``peer=False``: the monitor's ``<metrics-tls>``,
    where ``<trusted-certificates>`` names the CA of the clients' certificates and
    without it no client certificate is asked for)."""
    cert_el, key_el = el.find("certificate"), el.find("certificate-key")
    pw_el, ca_el = el.find("certificate-key-password"), el.find("trusted-certificates")
    ciphers_el = el.find("cipher-suites")
    cert, key = c.file_path(cert_el), c.file_path(key_el)
    ca = c.file_path(ca_el) if ca_el is not None else None
    password = element_text(pw_el) if pw_el is not None else None
    ciphers = element_text(ciphers_el) if ciphers_el is not None else None
    if ciphers is not None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).set_ciphers(ciphers)
        except ssl.SSLError:
            c.error(ciphers_el, f'<cipher-suites> "{ciphers}" selects no cipher suite known to '
                                "this OpenSSL: give OpenSSL cipher names separated by commas "
                                "or colons")
    if ca_el is None and peer:
        c.warn(el, "<tls> has no <trusted-certificates>: the peer's certificate is checked "
                   "against the system CA store; give your own CA bundle for mutual "
                   "authentication between your routers")
    if c.check_files:
        if cert is not None:
            data = c.read_pem(cert_el, cert, "this router's certificate")
            if data is not None and _PEM_CERT not in data:
                c.error(cert_el, f'<certificate> file "{cert}" holds no PEM certificate '
                                 f'("{_PEM_CERT.decode()}")')
        if key is not None:
            data = c.read_pem(key_el, key, "the private key of the certificate")
            if data is not None:
                if not _PEM_KEY_RE.search(data):
                    c.error(key_el, f'<certificate-key> file "{key}" holds no PEM private key '
                                    '("-----BEGIN PRIVATE KEY-----")')
                elif any(mark in data for mark in _PEM_ENCRYPTED) and not password:
                    c.error(key_el, f'<certificate-key> file "{key}" is encrypted: give its '
                                    "password in <certificate-key-password>")
                elif password and not any(mark in data for mark in _PEM_ENCRYPTED):
                    c.warn(pw_el, f'<certificate-key-password> is not needed: "{key}" is '
                                  "not encrypted")
                try:
                    mode = os.stat(key).st_mode
                except OSError:
                    mode = 0
                if os.name == "posix" and mode & (stat.S_IRWXG | stat.S_IRWXO):
                    c.warn(key_el, f'private key file "{key}" is accessible to other users '
                                   f"(mode {stat.S_IMODE(mode):04o}): chmod 600 it")
        if ca is not None:
            data = c.read_pem(ca_el, ca, "the CA bundle that the peer's certificate must chain to")
            if data is not None and _PEM_CERT not in data:
                c.error(ca_el, f'<trusted-certificates> file "{ca}" holds no PEM certificate '
                               f'("{_PEM_CERT.decode()}")')
    if cert is None or key is None:
        return None
    return TlsConfig(cert, key, password, ca, ciphers, el.sourceline or 0)


def parse_peer(c: Checker, peer: etree._Element) -> PeerConfig:
    name = c.name(peer.find("name"), "a name for this peer portal")
    cost = c.text_int(peer.find("cost"), 1, f"a positive cost 1..{INT_MAX}", 1, INT_MAX)
    st = peer.find("single-tcp")
    interface = c.interface(st.find("interface"))
    buf_what = f"bytes 0..{INT_MAX} (0 = the OS default)"
    rcv = c.text_int(st.find("receive-buffer"), 0, buf_what, 0, INT_MAX)
    snd = c.text_int(st.find("send-buffer"), 0, buf_what, 0, INT_MAX)
    tls_el = st.find("tls")
    tls = parse_tls(c, tls_el) if tls_el is not None else None
    initiator = acceptor = None
    ini = st.find("initiator")
    acc = st.find("acceptor")
    if ini is not None:
        addr_el = ini.find("address")
        try:
            address = parse_unicast(element_text(addr_el), "the IPv4 address of the peer router (behind a "
                                               "NAT: the address the NAT forwards)")
        except ValueError as e:
            c.error(addr_el, f"<address> {e}")
            address = "0.0.0.0"
        port = c.text_int(ini.find("port"), 0, "a TCP port 1..65535", 1, 65535)
        reconnect = c.attr_ms(ini, "reconnect-interval", DEFAULT_RECONNECT_INTERVAL_MS)
        initiator = InitiatorConfig(address, port, reconnect, ini.sourceline or 0)
    elif acc is not None:
        port = c.text_int(acc.find("listen-port"), 0, "a TCP port 1..65535", 1, 65535)
        acceptor = AcceptorConfig(port, acc.sourceline or 0)
    max_queue = c.text_int(peer.find("max-queue"), DEFAULT_MAX_QUEUE,
                           f"bytes {MIN_MAX_QUEUE}..{INT_MAX} (the largest datagram must fit)",
                           MIN_MAX_QUEUE, INT_MAX)
    keepalive = KeepaliveConfig()
    ka = peer.find("gateway-keepalive")
    if ka is not None:
        interval = c.attr_ms(ka, "interval", DEFAULT_KEEPALIVE_INTERVAL_MS, lo=0)
        timeout = c.attr_ms(ka, "timeout", DEFAULT_KEEPALIVE_TIMEOUT_MS, lo=0)
        keepalive = KeepaliveConfig(ka.get("idle", "yes") == "yes", interval, timeout,
                                    ka.sourceline or 0)
        if interval and timeout and timeout <= interval:
            c.error(ka, f"<gateway-keepalive> timeout {timeout} ms must be greater than the "
                        f"interval {interval} ms: the link would be declared dead before a "
                        "keepalive can be answered (about 3 x the interval is advised)")
        elif interval and timeout and timeout < 3 * interval:
            c.warn(ka, f"<gateway-keepalive> timeout {timeout} ms is less than 3 x the interval "
                       f"{interval} ms: one late keepalive may close the link")
        elif not timeout:
            c.warn(ka, "<gateway-keepalive> timeout 0: a dead peer is only noticed when TCP "
                       "reports an error, which may take very long")
        if not interval and timeout:
            c.warn(ka, "<gateway-keepalive> interval 0: this router sends no keepalives, so "
                       "the peer's keepalive timeout may close an idle link")
    return PeerConfig(
        name=name, initiator=initiator, acceptor=acceptor, interface=interface,
        receive_buffer=rcv, send_buffer=snd,
        tcp_keepalive=st.find("keepalive") is not None, nodelay=st.find("nodelay") is not None,
        tls=tls, keepalive=keepalive, max_queue=max_queue, line=peer.sourceline or 0, cost=cost,
        acl=c.portal_acl(peer, name),
    )
