"""What a bridge (:class:`router.core.bridge.Bridge`) hands out, sans-IO: its typed
outputs, drained in the order they were produced (:meth:`router.core.bridge.Bridge.outputs`)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import peerlink as P

__all__ = ["SendFrame", "StartProxy", "StopProxy", "ProxyUp", "ProxyDown", "Notice", "BridgeOutput", "Addr"]

#: an IPv4 address (dotted quad) and a port
Addr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class SendFrame:
    """Send ``frame`` to the peer."""

    frame: P.Frame


@dataclass(frozen=True, slots=True)
class StartProxy:
    """Bind a listener at the relay address for ``advert`` (a source behind the
    peer), then call :meth:`router.core.bridge.Bridge.proxy_listening` with its address."""

    advert: P.Advertisement


@dataclass(frozen=True, slots=True)
class StopProxy:
    """Close the listener of proxy ``proxy_id`` (the advert id it was started for)
    and its streams: no advertisement of its session is served any more."""

    proxy_id: int


@dataclass(frozen=True, slots=True)
class ProxyUp:
    """The peer's ``advert`` is advertised in our TRD with transport ``body`` (a
    proxy's relay address): for multi-hop routing, which passes it on."""

    advert: P.Advertisement
    body: object


@dataclass(frozen=True, slots=True)
class ProxyDown:
    """The peer's advertisement ``advert_id`` is no longer advertised in our TRD."""

    advert_id: int


@dataclass(frozen=True, slots=True)
class Notice:
    """An event for the router's event log: ``kind`` (e.g. ``source_gone``), ``detail``."""

    kind: str
    detail: str


BridgeOutput = SendFrame | StartProxy | StopProxy | ProxyUp | ProxyDown | Notice
