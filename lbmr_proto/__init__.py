"""lbmr_proto: the LBMR (Ultra Messaging topic resolution) wire format.

Pure and sans-IO: :func:`decode` bytes into a :class:`Packet` of typed
records and :func:`encode` them back (``encode(decode(b)) == b``). All
integers on the wire are big-endian. :mod:`lbmr_proto.fast` scans datagrams
without building objects (for daemons); :mod:`lbmr_proto.capture` reads and
writes pcap/pcapng files; :mod:`lbmr_proto.um` is UM's topic-resolution model
(timing, destinations, OTIDs, the datagram packer) shared by lbmr-sim and the router.
:mod:`lbmr_proto.lbmc` is UM's message format (LBMC: the messages of TCP and
LBT-RU sessions), :mod:`lbmr_proto.lbmc_stream` the framer for LBT-TCP streams
(runs of whole messages, not copied); :mod:`lbmr_proto.lbtru` and
:mod:`lbmr_proto.lbtrm` are the LBT-RU and LBT-RM datagrams.
"""

from . import lbmc
from .constants import ExtType, PacketType, SourceType, Transport, WildcardType
from .errors import LBMRDecodeError, LBMREncodeError, WireDecodeError
from .ext import (
    CtxInfo,
    InterestRecord,
    Pser,
    PserOption,
    Qmgmt,
    QmgmtInstance,
    RctxOption,
    RctxRecord,
    RemoteCtxInfo,
    RemoteDomainRoute,
    Tnwg,
    TnwgOption,
    TopicResRequest,
    UnknownExt,
)
from .lbmc import LbmcDecodeError
from .lbmc import Message as LbmcMessage
from .lbmc_stream import StreamFramer as LbmcStreamFramer
from .packet import Packet, decode, encode
from .popts import (
    LocalDomainOption,
    SourceIdOption,
    SourceTypeOption,
    UnknownPacketOption,
    VersionOption,
)
from .records import (
    QIR,
    QQR,
    TIR,
    TMR,
    TQR,
    LbtipcTransport,
    LbtrdmaTransport,
    LbtrmTransport,
    LbtruSessionTransport,
    LbtruTransport,
    LbtsmxTransport,
    QirGroup,
    QirQueue,
    TcpSessionTransport,
    TcpTransport,
    TopicMgmtBlock,
    UnknownTransport,
    WcTQR,
)
from .topts import (
    CostOption,
    CtxInstOption,
    DomainIdOption,
    ExFuncOption,
    LateJoinOption,
    OtidOption,
    QueueCtxInstOption,
    StoreCtxInstOption,
    UlbOption,
    UmeOption,
    UmeStoreGroupOption,
    UmeStoreOption,
    UmqQueueInfoOption,
    UmqRcrIdxOption,
    UnknownTirOption,
)

__all__ = [name for name in dir() if not name.startswith("_")]
