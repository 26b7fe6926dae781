"""router: lbmr-router, a Topic Resolution Domain (TRD) router in the role of UM's DRO.

Sans-IO protocol logic: :mod:`router.tr` (an endpoint portal's topic
resolution), :mod:`router.bridge` (the portal joined to the peer: advert ids,
proxies, interest), :mod:`router.peerlink` (the peer-link protocol: frames,
codec, connection, writer queue, streams). The trio shell:
:mod:`router.daemon` (the nursery and its tasks), :mod:`router.link` (one
connected peer link), :mod:`router.relay` (proxy listeners and the data
relay). :mod:`router.config` reads the XML file, :mod:`router.cli` is the
command.
"""
