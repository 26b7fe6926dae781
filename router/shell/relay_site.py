"""Where one endpoint's data relay works on one link: the router around it, as
the relay's tasks see it (:class:`RelaySite`).

A relay (:mod:`router.relays.endpoint_relay` and the relays it holds) moves bytes; what it
asks of the router, and what it tells it, goes through the router core's
public calling contract (:class:`router.core.router_core.RouterCore`), as
the link and portal tasks' input does: which source is behind one of our
advertisements (:meth:`RouterCore.advert_source`), which live advertisement
a proxy's new stream names (:meth:`RouterCore.proxy_advert`), and that a
source ended a relayed session (:meth:`RouterCore.session_ended`, followed
by a wake-up of the core's task). The link the relay uses is the one its
link task holds now: None while the link is down.
"""

from __future__ import annotations

import trio

from ..core.router_core import RouterCore
from .link_task import LinkTask
from .wake import Wake

__all__ = ["RelaySite"]


class RelaySite:
    """Endpoint ``endpoint``'s relay on the link of ``link_task``, in the
    router whose core is ``core`` (its task woken by ``wake``)."""

    __slots__ = ("core", "wake", "link_task", "endpoint")

    def __init__(self, core: RouterCore, wake: Wake, link_task: LinkTask, endpoint: str) -> None:
        self.core, self.wake, self.link_task, self.endpoint = core, wake, link_task, endpoint

    @property
    def link(self):
        """The link up now (:class:`router.link.Link` or, for an endpoint pair,
        :class:`router.shell.pair_link.PairLink`), or None."""
        return self.link_task.link

    def advert_source(self, advert_id: int):
        """The transport (an LBMR transport body) of the source behind our
        advertisement ``advert_id`` on this link, or None."""
        return self.core.advert_source(self.link_task.spec.id, self.endpoint, advert_id)

    def advert_request_port(self, advert_id: int):
        """Where the source behind our advertisement ``advert_id`` on this link takes
        late-join and OTR requests (:meth:`RouterCore.advert_request_port`), or None."""
        return self.core.advert_request_port(self.link_task.spec.id, self.endpoint, advert_id)

    def proxy_advert(self, proxy_id: int) -> int | None:
        """The advert id a new stream of our proxy ``proxy_id`` names (a live
        advertisement of its session), or None."""
        return self.core.proxy_advert(self.link_task.spec.id, self.endpoint, proxy_id)

    def session_ended(self, advert_id: int) -> None:
        """A source of ours ended the relayed session of ``advert_id``, or refused it."""
        self.core.session_ended(self.link_task.spec.id, self.endpoint, advert_id, trio.current_time())
        self.wake.set()
