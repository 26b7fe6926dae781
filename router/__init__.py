"""router: lbmr-router, a Topic Resolution Domain (TRD) router in the role of UM's DRO.

Sans-IO protocol logic: :mod:`router.tr` (an endpoint portal's topic
resolution), :mod:`router.endpoint_portal` (that portal shared by the links it
serves: one context per endpoint), :mod:`router.bridge` (a link's view of the
portal joined to the peer: advert ids, proxies, interest), :mod:`router.peerlink` (the peer-link protocol: frames,
codec, connection, writer queue, streams). The trio shell:
:mod:`router.portal_task` (an endpoint's TR socket and timers),
:mod:`router.daemon` (a portal link's nursery and its tasks), :mod:`router.link` (one
connected peer link), :mod:`router.relay` (proxy listeners and the data
relay). :mod:`router.config` reads the XML file, :mod:`router.cli` is the
command.
"""
