"""tshark as the judge of our bytes.

Helpers for ``tests/test_tshark.py``:

* :func:`run_tshark` runs tshark once over a pcap (``-d udp.port==PORT,lbmr
  -T json --no-duplicate-keys``) and returns one :class:`Frame` per frame:
  the ``lbmr`` layer (or ``None``) and the expert-info / malformed marks found
  anywhere in the frame.
* :func:`flatten` turns a tshark JSON tree into ``{field name: [values in
  document order]}``.
* :func:`expected_fields` is *our own* statement of what tshark must show for a
  :class:`lbmr_proto.Packet`, built from the packet object (never from its
  bytes) with the field names of ``shared/spec/lbmr-wire-format.md`` §10.
  :func:`expected_experts` lists the expert messages tshark must attach.
* :func:`compare` checks "every field equal" after :func:`norm`, except for
  container names, generated fields and the documented :data:`ALLOW_LIST`.
* :func:`tshark_defect` names the documented dissector defects (spec §7.5,
  §11.2, plus one found here) that make tshark show a packet wrongly; such
  packets are kept out of the exact comparison.

The dissector version modelled is the one shipped with tshark 4.0 (the spec's
"R1" revision). Display quirks of that revision that are deterministic are
modelled in :func:`expected_fields` (each one is marked ``QUIRK`` there and
verified by the tests); only genuinely unmodellable display-only items go into
:data:`ALLOW_LIST`.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import lbmr_proto as L
from lbmr_proto import ext as E
from lbmr_proto import lbmc as C
from lbmr_proto.capture import LINKTYPE_RAW, PcapWriter
from lbmr_proto.topts import TIR_OPTION_TYPES

TSHARK_CANDIDATES = ("tshark", "/usr/bin/tshark", "/usr/local/bin/tshark")


class TsharkMissing(RuntimeError):
    """tshark is not installed: the tshark tests must fail, not skip."""


def tshark_path() -> str:
    for c in TSHARK_CANDIDATES:
        p = shutil.which(c)
        if p:
            return p
    raise TsharkMissing(
        "tshark is required by tests/test_tshark.py (the LBMR byte-level judge) but was not "
        "found on PATH or in /usr/bin; install it (e.g. `apt-get install tshark`)"
    )


# --------------------------------------------------------------------------- running tshark


class Frame(NamedTuple):
    """One frame of tshark's JSON output.

    ``lbmr`` is the LBMR layer (``None`` if tshark did not decode LBMR);
    ``experts`` the messages of every ``_ws.expert`` item anywhere in the
    frame (document order); ``malformed`` whether a ``_ws.malformed`` mark is
    present.
    """

    number: int
    lbmr: dict | None
    experts: list[str]
    malformed: bool

    @property
    def flagged(self) -> bool:
        return self.malformed or bool(self.experts)


def _walk_marks(node: Any, experts: list[str]) -> bool:
    """Collect expert messages below ``node``; return True if a malformed mark is seen."""
    malformed = False
    if isinstance(node, list):
        for x in node:
            malformed |= _walk_marks(x, experts)
    elif isinstance(node, dict):
        for k, v in node.items():
            if k.startswith("_ws.malformed"):
                malformed = True
            if k == "_ws.expert":
                for item in v if isinstance(v, list) else [v]:
                    if isinstance(item, dict):
                        msg = item.get("_ws.expert.message", "")
                        experts.extend(msg if isinstance(msg, list) else [msg])
                    else:
                        experts.append(str(item))
            malformed |= _walk_marks(v, experts)
    return malformed


def tshark_frames(pcap_path: str | Path, decode_as: str, extra_args: Iterable[str] = ()):
    """Run tshark once over a pcap (``-d decode_as -T json``); yield per frame
    (frame number, layers, expert messages, malformed mark)."""
    cmd = [tshark_path(), "-r", str(pcap_path), "-d", decode_as, "-T", "json", "--no-duplicate-keys",
           *extra_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    for entry in json.loads(proc.stdout or "[]"):
        layers = entry["_source"]["layers"]
        experts: list[str] = []
        malformed = _walk_marks(layers, experts)
        yield int(layers["frame"]["frame.number"]), layers, experts, malformed


def run_tshark(pcap_path: str | Path, port: int, *, extra_args: Iterable[str] = ()) -> list[Frame]:
    """Dissect ``pcap_path`` with UDP ``port`` decoded as LBMR; one :class:`Frame` per frame."""
    out = []
    for number, layers, experts, malformed in tshark_frames(pcap_path, f"udp.port=={port},lbmr", extra_args):
        lbmr = layers.get("lbmr")
        if isinstance(lbmr, list):  # two LBMR layers in one frame: never expected
            raise AssertionError(f"frame has {len(lbmr)} lbmr layers")
        out.append(Frame(number, lbmr, experts, malformed))
    return out


# --------------------------------------------------------------------------- flattening

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


def flatten(layer: Any) -> dict[str, list[str]]:
    """``{field name: [values in document order]}`` for every leaf of a tshark JSON tree.

    Dict-valued keys are containers (FT_NONE items with children, or text
    labels) and ``*_tree`` keys hold the children of valued items: both are
    descended into, never recorded. Lists (repeated keys under
    ``--no-duplicate-keys``) are walked in order. ``_ws.*`` items (expert info,
    malformed marks) are skipped: :func:`run_tshark` reports them.
    """
    out: dict[str, list[str]] = {}

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for x in node:
                walk(x)
            return
        if not isinstance(node, dict):
            return
        for k, v in node.items():
            if k.startswith("_ws."):
                continue
            if k.endswith("_tree") or isinstance(v, dict):
                walk(v)
                continue
            vals = v if isinstance(v, list) else [v]
            for x in vals:
                if isinstance(x, (dict, list)):
                    walk(x)
                elif _FIELD_NAME.match(k):
                    out.setdefault(k, []).append(x)
                # else: a text-only label item with no value; nothing to compare

    walk(layer)
    return out


# --------------------------------------------------------------------------- normalisation

#: Fields whose value is raw bytes (tshark prints ``aa:bb:..``).
BYTES_FIELDS = frozenset({
    "lbmr.tir.unknown_transport",
    "lbmr.topt.otid.originating_transport", "lbmr.topt.ctxinst.ctxinst",
    "lbmr.topt.ctxinsts.ctxinsts", "lbmr.topt.ctxinstq.ctxinstq", "lbmr.topt.unknown.data",
    "lbmr.opt.src_id.src_id", "lbmr.opt.unknown.data",
    "lbmr.pser.opt.ctxinst.ctxinst", "lbmr.qmgmt.cfg_sig", "lbmr.ctxinfo.instance",
    "lbmr.tnwg.opt_ctxinst.instance", "lbmr.tnwg.opt.data",
    "lbmr.rctxinfo.rec.instance.instance", "lbmr.rctxinfo.rec.unknown.data",
})

_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_DEC = re.compile(r"^-?[0-9]+$")


def norm(value: Any, field: str | None = None) -> Any:
    """Normalise one value (ours or tshark's) for comparison.

    ints/bools -> int; ``"0x.."`` and decimal strings -> int (the same rule on
    both sides, so a topic named ``"12"`` still compares equal); bytes and the
    values of :data:`BYTES_FIELDS` -> lowercase hex without colons; IPv4
    addresses and other strings stay strings.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        if field in BYTES_FIELDS:
            return value.replace(":", "").lower()
        if _HEX.match(value):
            return int(value, 16)
        if _DEC.match(value):
            return int(value)
        return value
    raise TypeError(f"cannot normalise {value!r} ({type(value).__name__}) for {field}")


# --------------------------------------------------------------------------- comparison

#: FT_NONE containers. They only group other fields; when one shows up as a
#: leaf (an empty container, e.g. ``lbmr.tqrs`` of a truncated packet) it
#: carries no value. Excluded from the comparison.
CONTAINER_FIELDS = frozenset({
    "lbmr.hdr", "lbmr.tqrs", "lbmr.tqr", "lbmr.tirs", "lbmr.tir", "lbmr.tir.tcp", "lbmr.tir.lbtrm",
    "lbmr.tir.lbtru", "lbmr.tir.lbtipc", "lbmr.tir.lbtrdma", "lbmr.tir.lbtsmx", "lbmr.topts",
    "lbmr.topt.len", "lbmr.topt.ume", "lbmr.topt.ume_store", "lbmr.topt.ume_store_group",
    "lbmr.topt.latejoin", "lbmr.topt.umq_rcridx", "lbmr.topt.umq_qinfo", "lbmr.topt.cost",
    "lbmr.topt.otid", "lbmr.topt.ctxinst", "lbmr.topt.ctxinsts", "lbmr.topt.ulb",
    "lbmr.topt.ctxinstq", "lbmr.topt.domain_id", "lbmr.topt.exfunc", "lbmr.topt.unknown",
    "lbmr.tmb", "lbmr.tmb.tmr_list", "lbmr.tmb.tmr", "lbmr.qqr", "lbmr.qirs", "lbmr.qir",
    "lbmr.qir.grps", "lbmr.qir.grp", "lbmr.qir.queues", "lbmr.qir.queue",
    "lbmr.pser.opts", "lbmr.pser.opt.optlen", "lbmr.pser.opt.ctxinst",
    "lbmr.qmgmt.il", "lbmr.qmgmt.il_inst", "lbmr.qmgmt.ec", "lbmr.qmgmt.ev", "lbmr.qmgmt.qro",
    "lbmr.tnwg.interest", "lbmr.tnwg.interest_rec", "lbmr.tnwg.ctxinfo", "lbmr.tnwg.trreq",
    "lbmr.tnwg.opt", "lbmr.tnwg.opt_ctxinst", "lbmr.tnwg.opt_address", "lbmr.tnwg.opt_domain",
    "lbmr.tnwg.opt_name", "lbmr.rctxinfo.rec", "lbmr.rctxinfo.rec.address",
    "lbmr.rctxinfo.rec.instance", "lbmr.rctxinfo.rec.odomain", "lbmr.rctxinfo.rec.name",
    "lbmr.rctxinfo.rec.unknown", "lbmr.opt", "lbmr.opt.len", "lbmr.opt.src_id",
    "lbmr.opt.src_type", "lbmr.opt.version", "lbmr.opt.local_domain", "lbmr.opt.unknown",
})

#: Fields tshark generates (not on the wire): excluded.
GENERATED_FIELDS = frozenset({
    "lbmr.tir.channel",  # channel number tshark assigns per transport, from its own tables
    "lbmr.tag",  # tag-table label (only with lbmr.use_lbmr_domain)
})

#: Field names excluded from the comparison because of a display-only quirk
#: that cannot be stated from the packet object: name -> reason. Every entry
#: must really occur (checked by ``test_display_quirks``).
#:
#: It is EMPTY on purpose: every quirk found in tshark 4.0 is either
#: deterministic and modelled in :func:`expected_fields` (search "QUIRK":
#: R1 wildcard-pattern display, domain-id option flags, unknown TIR option
#: flags, one-byte QMGMT queue names, non-ASCII name bytes, unknown PSER /
#: QMGMT experts without a tree item), or a parsing defect that makes values
#: wrong, which :func:`tshark_defect` keeps out of the exact comparison (TNWG
#: cumulative option offsets, packet options after QMGMT, after an unknown ext
#: type or unknown TNWG type, and an empty topic-management block), or it is
#: invisible in field values: spec §11.2 "Length Option item drawn as 12 bytes"
#: (tshark 4.0 clips the item to the 4 bytes that remain; item sizes are not
#: part of the JSON values) and "QIR options rendered under the QIR list"
#: (only the nesting differs; the per-name value lists still match; verified
#: in ``test_display_quirks``).
ALLOW_LIST: dict[str, str] = {}


def compare(flat: dict[str, list], expected: dict[str, list]) -> list[str]:
    """Differences between tshark's flattened fields and :func:`expected_fields` (empty = equal)."""
    problems = []
    ignore = CONTAINER_FIELDS | GENERATED_FIELDS | ALLOW_LIST.keys()
    for name in sorted((flat.keys() | expected.keys()) - ignore):
        got = [norm(v, name) for v in flat.get(name, [])]
        want = [norm(v, name) for v in expected.get(name, [])]
        if got != want:
            problems.append(f"{name}: tshark {got!r} != expected {want!r}")
    return problems


# --------------------------------------------------------------------------- expectations


def shown(raw: bytes | str) -> str:
    """How tshark 4.0 displays ASCII-encoded string bytes: up to the first NUL,
    bytes >= 0x80 as U+FFFD."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogateescape")
    raw = raw.split(b"\0", 1)[0]
    return "".join(chr(b) if b < 0x80 else "\ufffd" for b in raw)


def _wire(s: str) -> bytes:
    return s.encode("utf-8", "surrogateescape")


class _Fields:
    """Ordered accumulator ``name -> [values]``."""

    def __init__(self) -> None:
        self.d: dict[str, list] = {}
        self.experts: list[str] = []

    def add(self, name: str, value: Any) -> None:
        self.d.setdefault(name, []).append(value)

    def many(self, prefix: str, **kv: Any) -> None:
        for k, v in kv.items():
            self.add(f"{prefix}.{k}", v)

    def flags(self, name: str, value: int, bits: Iterable[tuple[str, int]]) -> None:
        """A bitmask field and its boolean sub-fields (tshark shows every bit, 0 or 1)."""
        self.add(name, value)
        for bit, mask in bits:
            self.add(f"{name}.{bit}", 1 if value & mask else 0)


# ---- TIR options (§4.5, §10.4)

_IGN16 = (("ignore", 0x8000),)
_IGN8 = (("ignore", 0x80),)
KNOWN_TIR_OPTIONS = frozenset(range(0x01, 0x0F))

# Option type codes and sizes from the spec tables (§4.5, §8), not from the
# codec's class constants or structs.
_TOPT_CODE = {
    L.UmeOption: 0x01, L.UmeStoreOption: 0x02, L.UmeStoreGroupOption: 0x03, L.LateJoinOption: 0x04,
    L.UmqRcrIdxOption: 0x05, L.UmqQueueInfoOption: 0x06, L.CostOption: 0x07, L.OtidOption: 0x08,
    L.CtxInstOption: 0x09, L.StoreCtxInstOption: 0x0A, L.UlbOption: 0x0B,
    L.QueueCtxInstOption: 0x0C, L.DomainIdOption: 0x0D, L.ExFuncOption: 0x0E,
}
_TOPT_SIZE = {
    L.UmeOption: 32, L.UmeStoreOption: 16, L.UmeStoreGroupOption: 8, L.LateJoinOption: 24,
    L.UmqRcrIdxOption: 8, L.CostOption: 8, L.OtidOption: 36, L.CtxInstOption: 12,
    L.StoreCtxInstOption: 12, L.UlbOption: 28, L.QueueCtxInstOption: 12, L.DomainIdOption: 8,
    L.ExFuncOption: 16,
}
_POPT_CODE = {L.SourceIdOption: 0x81, L.SourceTypeOption: 0x82, L.VersionOption: 0x83,
              L.LocalDomainOption: 0x84}
_POPT_SIZE = {L.SourceIdOption: 12, L.SourceTypeOption: 4, L.VersionOption: 8, L.LocalDomainOption: 8}


def _topt_len(o) -> int:
    if isinstance(o, L.UmqQueueInfoOption):
        return 4 + len(_wire(o.queue))
    if isinstance(o, L.UnknownTirOption):
        return 4 + len(o.data)
    return _TOPT_SIZE[type(o)]


def _popt_len(o) -> int:
    if isinstance(o, L.UnknownPacketOption):
        return 4 + len(o.data)
    return _POPT_SIZE[type(o)]


def _nz(name: str, nul: bool) -> bytes:
    """Wire bytes of a name whose NUL terminator is optional."""
    return _wire(name) + (b"\0" if nul else b"")


def _tnwg_opt_len(o) -> int:
    return {0: 12, 1: 12, 2: 8}.get(o.type) or 4 + (
        len(_nz(o.name, o.name_nul)) if o.type == 3 else len(o.data))


def _rctx_opt_len(o) -> int:
    return {1: 16, 2: 12, 3: 8}.get(o.type) or 4 + (
        len(_nz(o.name, o.name_nul)) if o.type == 4 else len(o.data))


def _pser_opt_len(o) -> int:
    return 10 if o.type in (0, 1) else 2 + len(o.data)


def _tir_options(f: _Fields, options: list) -> None:
    f.many("lbmr.topt.len", type=0, len=4, total_len=4 + sum(_topt_len(o) for o in options))
    for o in options:
        if isinstance(o, L.UmeOption):
            p = "lbmr.topt.ume"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, (("ignore", 0x8000), ("latejoin", 0x4000),
                                            ("store", 0x2000), ("qccap", 0x1000), ("acktosrc", 0x0800)))
            f.many(p, store_tcp_port=o.store_tcp_port, src_tcp_port=o.src_tcp_port,
                   store_tcp_addr=o.store_tcp_addr, src_tcp_addr=o.src_tcp_addr,
                   src_reg_id=o.src_reg_id, transport_idx=o.transport_idx,
                   high_seqnum=o.high_seqnum, low_seqnum=o.low_seqnum)
        elif isinstance(o, L.UmeStoreOption):
            p = "lbmr.topt.ume_store"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, grp_idx=o.grp_idx, store_tcp_port=o.store_tcp_port, store_idx=o.store_idx,
                   store_ip_addr=o.store_ip_addr, src_reg_id=o.src_reg_id)
        elif isinstance(o, L.UmeStoreGroupOption):
            p = "lbmr.topt.ume_store_group"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, grp_idx=o.grp_idx, grp_sz=o.grp_sz, reserved=o.reserved)
        elif isinstance(o, L.LateJoinOption):
            p = "lbmr.topt.latejoin"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, (("ignore", 0x8000), ("acktosrc", 0x4000)))
            f.many(p, src_tcp_port=o.src_tcp_port, reserved=o.reserved, src_ip_addr=o.src_ip_addr,
                   transport_idx=o.transport_idx, high_seqnum=o.high_seqnum, low_seqnum=o.low_seqnum)
        elif isinstance(o, L.UmqRcrIdxOption):
            p = "lbmr.topt.umq_rcridx"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN16)
            f.add(p + ".rcr_idx", o.rcr_idx)
        elif isinstance(o, L.UmqQueueInfoOption):
            p = "lbmr.topt.umq_qinfo"
            q = _wire(o.queue)
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, (("ignore", 0x8000), ("queue", 0x4000),
                                            ("rcvlisten", 0x2000), ("control", 0x1000),
                                            ("srcrcvlisten", 0x0800), ("participants_only", 0x0400)))
            f.add("lbmr.topt.ume_qinfo.queue", shown(q))  # sic: "ume_qinfo" (spec §10.4)
        elif isinstance(o, L.CostOption):
            p = "lbmr.topt.cost"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, hop_count=o.hop_count, cost=o.cost)
        elif isinstance(o, L.OtidOption):
            p = "lbmr.topt.otid"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN16)
            f.add(p + ".originating_transport", o.otid)
        elif isinstance(o, L.CtxInstOption):
            p = "lbmr.topt.ctxinst"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, res=o.res, ctxinst=o.ctxinst)
        elif isinstance(o, L.StoreCtxInstOption):
            p = "lbmr.topt.ctxinsts"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, idx=o.idx, ctxinsts=o.ctxinst)
        elif isinstance(o, L.UlbOption):
            p = "lbmr.topt.ulb"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN16)
            f.many(p, queue_id=o.queue_id, regid=o.regid, ulb_src_id=o.ulb_src_id,
                   src_ip_addr=o.src_ip_addr, src_tcp_port=o.src_tcp_port, reserved=o.reserved)
        elif isinstance(o, L.QueueCtxInstOption):
            p = "lbmr.topt.ctxinstq"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN8)
            f.many(p, idx=o.idx, ctxinstq=o.ctxinst)
        elif isinstance(o, L.DomainIdOption):
            p = "lbmr.topt.domain_id"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            # QUIRK (spec §10.4): .flags is registered 8-bit over the 16-bit
            # field, so tshark shows byte 2 only and no .flags.ignore bit.
            f.add(p + ".flags", o.flags >> 8)
            f.add(p + ".domain_id", o.domain_id)
        elif isinstance(o, L.ExFuncOption):
            p = "lbmr.topt.exfunc"
            f.many(p, type=_TOPT_CODE[type(o)], len=_topt_len(o))
            f.flags(p + ".flags", o.flags, _IGN16)
            f.many(p, src_tcp_port=o.src_tcp_port, reserved=o.reserved, src_ip_addr=o.src_ip_addr)
            f.flags(p + ".functionality_flags", o.functionality_flags,
                    (("ulb", 0x8), ("umq", 0x4), ("ume", 0x2), ("lj", 0x1)))
        elif isinstance(o, L.UnknownTirOption):
            if o.code in KNOWN_TIR_OPTIONS or o.code == 0:
                raise ValueError(f"UnknownTirOption with a code tshark knows: {o.code:#x}")
            p = "lbmr.topt.unknown"
            f.many(p, type=o.code, len=4 + len(o.data))
            # QUIRK: the unknown option's 8-bit .flags (spec §10.4) sits over
            # byte 3, i.e. it shows the LOW byte of the 16-bit flags field.
            f.add(p + ".flags", o.flags & 0xFF)
            if o.data:  # the data item is only added when len > 4
                f.add(p + ".data", o.data)
            f.experts.append(f"Unknown option 0x{o.code:02x}")
        else:
            raise TypeError(f"unexpected TIR option {o!r}")


assert set(TIR_OPTION_TYPES) == KNOWN_TIR_OPTIONS == set(_TOPT_CODE.values())


# ---- TIRs (§4, §10.3)

_TTYPE = {  # transport type codes, spec §4.2
    L.TcpTransport: 0x00, L.TcpSessionTransport: 0x00, L.LbtruTransport: 0x01,
    L.LbtruSessionTransport: 0x01, L.LbtrmTransport: 0x10, L.LbtipcTransport: 0x40,
    L.LbtsmxTransport: 0x04, L.LbtrdmaTransport: 0x20,
}
_TLEN = {  # transport body sizes, spec §4.3
    L.TcpTransport: 6, L.TcpSessionTransport: 10, L.LbtruTransport: 6, L.LbtruSessionTransport: 10,
    L.LbtrmTransport: 16, L.LbtipcTransport: 10, L.LbtsmxTransport: 10, L.LbtrdmaTransport: 10,
}


def _tir(f: _Fields, t: L.TIR) -> None:
    tr = t.transport
    f.add("lbmr.tir.name", shown(t.topic))
    f.add("lbmr.tir.transport_opts", 1 if t.options is not None else 0)
    f.add("lbmr.tir.transport_type", tr.type_code if isinstance(tr, L.UnknownTransport) else _TTYPE[type(tr)])
    f.add("lbmr.tir.tlen", len(tr.data) if isinstance(tr, L.UnknownTransport) else _TLEN[type(tr)])
    f.add("lbmr.tir.ttl", t.ttl)
    f.add("lbmr.tir.index", t.index)
    if t.options is not None:
        _tir_options(f, t.options)
    if isinstance(tr, L.TcpTransport):
        f.many("lbmr.tir.tcp", ip=tr.ip, port=tr.port)
    elif isinstance(tr, L.TcpSessionTransport):
        f.many("lbmr.tir.tcp", ip=tr.ip, session_id=tr.session_id, port=tr.port)
    elif isinstance(tr, L.LbtruTransport):
        f.many("lbmr.tir.lbtru", ip=tr.ip, port=tr.port)
    elif isinstance(tr, L.LbtruSessionTransport):
        f.many("lbmr.tir.lbtru", ip=tr.ip, session_id=tr.session_id, port=tr.port)
    elif isinstance(tr, L.LbtrmTransport):
        f.many("lbmr.tir.lbtrm", srcip=tr.ip, mcastip=tr.mcast_group, sessid=tr.session_id,
               dport=tr.dest_port, sport=tr.src_ucast_port)
    elif isinstance(tr, L.LbtipcTransport):
        f.many("lbmr.tir.lbtipc", host_id=tr.host_id, session_id=tr.session_id, xport_id=tr.xport_id)
    elif isinstance(tr, L.LbtsmxTransport):
        f.many("lbmr.tir.lbtsmx", host_id=tr.host_id, session_id=tr.session_id, xport_id=tr.xport_id)
    elif isinstance(tr, L.LbtrdmaTransport):
        f.many("lbmr.tir.lbtrdma", ip=tr.ip, session_id=tr.session_id, port=tr.port)
    elif isinstance(tr, L.UnknownTransport):
        if tr.type_code in {0x00, 0x01, 0x04, 0x10, 0x20, 0x40}:
            raise ValueError(f"UnknownTransport with a code tshark dissects: {tr.type_code:#x}")
        f.add("lbmr.tir.unknown_transport", tr.data)
        f.experts.append(f"Unknown LBMR TIR transport 0x{tr.type_code:02x}")
    else:
        raise TypeError(f"unexpected transport {tr!r}")


# ---- queue records (§6.2, §10.5)


def _qir(f: _Fields, q: L.QIR, opts: _Fields) -> None:
    p = "lbmr.qir"
    f.many(p, qname=shown(q.queue), tname=shown(q.topic), queue_id=q.queue_id,
           queue_ver=q.queue_ver, queue_prev_ver=q.queue_prev_ver,
           opts=1 if q.options is not None else 0, grp_blks=len(q.groups),
           queue_blks=len(q.queues))
    if q.options is not None:
        # Spec §11.2: QIR options are rendered under the QIR list, not the QIR.
        _tir_options(opts, q.options)
    for g in q.groups:
        f.many(p + ".grp", grp_idx=g.grp_idx, grp_sz=g.grp_sz)
    for b in q.queues:
        f.many(p + ".queue", ip=b.ip, port=b.port, idx=b.idx, grp_idx=b.grp_idx, reserved=b.reserved)


# ---- extended records (§7, §10.6)


def _pser(f: _Fields, x: E.Pser) -> None:
    p = "lbmr.pser"
    topic = _nz(x.topic, x.topic_nul)
    flags = (x.flags & 0x7FFF) | (0x8000 if x.options is not None else 0)
    f.many(p, dep_type=x.dep_type, len=28 + len(topic))
    f.flags(p + ".flags", flags, (("option", 0x8000),))
    f.many(p, source_ip=x.source_ip, store_ip=x.store_ip, transport_idx=x.transport_idx,
           topic_idx=x.topic_idx, source_port=x.source_port, store_port=x.store_port,
           topic=shown(topic))
    if x.options is not None:
        f.many(p + ".opt.optlen", type=x.opt_type, optlen=4 + sum(_pser_opt_len(o) for o in x.options))
        for o in x.options:
            if o.type in (0, 1):
                f.many(p + ".opt.ctxinst", len=10, type=o.type, ctxinst=o.ctxinst)
            # Unknown PSER option types: skipped by len. Their expert info is
            # added with a NULL tree item (spec §11.1 lists it), so it never
            # appears in the JSON tree and nothing is displayed.


_QMGMT_DEP16 = {E.QMGMT_IL: "il_num_insts", E.QMGMT_JREJ: "jrej_code", E.QMGMT_EV: "ev_bias"}


def _qmgmt(f: _Fields, x: E.Qmgmt) -> None:
    p = "lbmr.qmgmt"
    t = x.pckt_type
    known = E.QMGMT_IL <= t <= E.QMGMT_QRO
    flags = x.flags
    if known:
        flags = (flags & ~0x40) | (0x40 if x.queue_name is not None else 0)
    bits = [("i_flag", 0x80), ("n_flag", 0x40)]
    if t == E.QMGMT_IL:
        bits += [("il_l_flag", 0x20), ("il_k_flag", 0x10)]
    f.flags(p + ".flags", flags, bits)
    f.many(p, pckt_type=t, cfg_sig=x.cfgsig, queue_id=x.queue_id, queue_ver=x.queue_ver,
           ip=x.ip, port=x.port, inst_idx=x.inst_idx, grp_idx=x.grp_idx)
    dep16 = len(x.instances) if t == E.QMGMT_IL else x.dep16
    f.add(f"{p}.{_QMGMT_DEP16.get(t, 'pckt_type_dep16')}", dep16)
    if t == E.QMGMT_IL:
        f.add(p + ".il.highest_rcr_tsp", x.highest_rcr_tsp)
        for i in x.instances:
            f.many(p + ".il_inst", ip=i.ip, port=i.port, inst_idx=i.inst_idx, grp_idx=i.grp_idx)
            f.flags(p + ".il_inst.flags", i.flags, (("m_flag", 0x8000), ("q_flag", 0x4000),
                                                    ("p_flag", 0x2000)))
    elif t == E.QMGMT_EC:
        f.add(p + ".ec.queue_new_ver", x.queue_new_ver)
    elif t == E.QMGMT_EV:
        f.many(p + ".ev", highest_rcr_tsp=x.highest_rcr_tsp, age=x.age)
    elif t == E.QMGMT_QRO:
        f.add(p + ".qro.highest_rcr_tsp", x.highest_rcr_tsp)
    # Unknown packet types: expert info with a NULL tree item (invisible in JSON).
    if known:
        name = None if x.queue_name is None else _nz(x.queue_name, x.queue_name_nul)
    else:
        name = x.raw if flags & 0x40 else None
    # QUIRK (not in the spec): the queue name item is only added when more
    # than one byte remains ("qnamelen > 1"), so a 1-byte name is not shown.
    if name is not None and len(name) > 1:
        f.add(p + ".qname", shown(name))


def _ctxinfo(f: _Fields, x: E.CtxInfo) -> None:
    p = "lbmr.ctxinfo"
    name = b"" if x.name is None else _nz(x.name, x.name_nul)
    flags = (x.flags & ~1) | (1 if x.name is not None else 0)
    f.many(p, len=20 + len(name), hop_count=x.hop_count)
    f.flags(p + ".flags", flags, (("query", 0x8000), ("ip", 0x4000), ("instance", 0x2000),
                                  ("tnwg_src", 0x1000), ("tnwg_rcv", 0x0800), ("proxy", 0x0400),
                                  ("name", 0x0001)))
    f.many(p, port=x.port, ip=x.ip, instance=x.instance)
    if x.name is not None:
        f.add(p + ".name", shown(name))


def _trreq(f: _Fields, x: E.TopicResRequest) -> None:
    f.flags("lbmr.topic_res_request.flags", x.flags, (
        ("gw_remote_interest", 0x40), ("context_query", 0x20), ("context_advertisement", 0x10),
        ("gateway_meta", 0x08), ("advertisement", 0x04), ("query", 0x02), ("wildcard_query", 0x01)))


_TNWG_OPT = {0: "opt_ctxinst", 1: "opt_address", 2: "opt_domain", 3: "opt_name"}


def _tnwg(f: _Fields, x: E.Tnwg) -> None:
    p = "lbmr.tnwg"
    opts_len = sum(_tnwg_opt_len(o) for o in x.options)
    if x.type == 0:
        recs = [(r, _nz(r.symbol, r.symbol_nul)) for r in x.interest]
        body_len = 4 + sum(8 + len(sym) for _, sym in recs)
    else:
        body_len = {1: 12 + opts_len, 2: 2 + opts_len}.get(x.type, len(x.raw))
    f.many(p, len=8 + body_len if x.length is None else x.length, type=x.type, reserved=x.reserved)
    if x.type == 0:
        f.many(p + ".interest", len=body_len, count=len(recs))
        for r, sym in recs:
            q = p + ".interest_rec"
            f.add(q + ".len", 8 + len(sym))
            f.flags(q + ".flags", r.flags, (("pattern", 0x80), ("cancel", 0x40), ("refresh", 0x20)))
            f.many(q, pattype=r.pattype, domain_id=r.domain_id, symbol=shown(sym))
        return
    if x.type == 1:
        q = p + ".ctxinfo"
        f.many(q, len=body_len, hop_count=x.hop_count, reserved=x.ctx_reserved)
        f.flags(q + ".flags1", x.flags1, (("query", 0x80000000), ("tnwg_src", 0x40000000),
                                          ("tnwg_rcv", 0x20000000), ("proxy", 0x10000000)))
        f.add(q + ".flags2", x.flags2)
    elif x.type == 2:
        f.add(p + ".trreq.len", body_len)
    else:
        f.experts.append(f"Unknown LBMR TNWG type 0x{x.type:04x}")
        return
    for o in x.options:
        q = f"{p}.{_TNWG_OPT.get(o.type, 'opt')}"
        f.many(q, type=o.type, len=_tnwg_opt_len(o))
        f.flags(q + ".flags", o.flags, _IGN16)
        if o.type == 0:
            f.add(q + ".instance", o.instance)
        elif o.type == 1:
            f.many(q, port=o.port, res=o.res, ip=o.ip)
        elif o.type == 2:
            f.add(q + ".domain_id", o.domain_id)
        elif o.type == 3:
            f.add(q + ".name", shown(_nz(o.name, o.name_nul)))
        else:
            f.add(q + ".data", o.data)


def _route(f: _Fields, x: E.RemoteDomainRoute) -> None:
    p = "lbmr.remote_domain_route"
    n = len(x.domains)
    f.many(p, num_domains=n, ip=x.ip, port=x.port,
           reserved=x.route_index,  # R1 (tshark 4.0) name; R2 calls it route_index
           length=16 + 4 * n if x.length is None else x.length)
    for d in x.domains:
        f.add(p + ".domain", d)


_RCTX_OPT = {1: "address", 2: "instance", 3: "odomain", 4: "name"}


def _rctxinfo(f: _Fields, x: E.RemoteCtxInfo) -> None:
    p = "lbmr.rctxinfo"
    rec_lens = [4 + sum(_rctx_opt_len(o) for o in r.options) for r in x.records]
    f.many(p, len=8 + sum(rec_lens) if x.length is None else x.length, num_recs=len(x.records),
           reserved=x.reserved)
    for r, rec_len in zip(x.records, rec_lens, strict=True):
        q = p + ".rec"
        f.add(q + ".len", rec_len)
        f.flags(q + ".flags", r.flags, (("query", 0x8000),))
        for o in r.options:
            s = f"{q}.{_RCTX_OPT.get(o.type, 'unknown')}"
            f.many(s, type=o.type, len=_rctx_opt_len(o), flags=o.flags)  # no flag bits defined
            if o.type == 1:
                f.many(s, domain_id=o.domain_id, ip=o.ip, port=o.port, res=o.res)
            elif o.type == 2:
                f.add(s + ".instance", o.instance)
            elif o.type == 3:
                f.add(s + ".domain_id", o.domain_id)
            elif o.type == 4:
                f.add(s + ".name", shown(_nz(o.name, o.name_nul)))
            else:
                f.add(s + ".data", o.data)
                f.experts.append(f"Unknown LBMR RCTXINFO option 0x{o.type:02x}")


_EXT_TYPE = {  # spec §1.5
    E.Pser: 0x01, E.Qmgmt: 0x02, E.CtxInfo: 0x03, E.TopicResRequest: 0x04, E.Tnwg: 0x05,
    E.RemoteDomainRoute: 0x06, E.RemoteCtxInfo: 0x07,
}
_EXT = {
    E.Pser: _pser, E.Qmgmt: _qmgmt, E.CtxInfo: _ctxinfo, E.TopicResRequest: _trreq,
    E.Tnwg: _tnwg, E.RemoteDomainRoute: _route, E.RemoteCtxInfo: _rctxinfo,
}


# ---- packet options (§8, §10.7)


def _packet_options(f: _Fields, options: list) -> None:
    p = "lbmr.opt"
    total = 4
    for o in options:
        total += _popt_len(o)
        if isinstance(o, L.SourceIdOption):
            f.many(p + ".src_id", type=_POPT_CODE[type(o)], len=_popt_len(o))
            f.flags(p + ".src_id.flags", o.flags, _IGN16)
            f.add(p + ".src_id.src_id", o.src_id)
        elif isinstance(o, L.SourceTypeOption):
            f.many(p + ".src_type", type=_POPT_CODE[type(o)], len=_popt_len(o))
            f.flags(p + ".src_type.flags", o.flags, _IGN8)
            f.add(p + ".src_type.src_type", o.src_type)
        elif isinstance(o, L.VersionOption):
            f.many(p + ".version", type=_POPT_CODE[type(o)], len=_popt_len(o))
            f.flags(p + ".version.flags", o.flags, (("ignore", 0x8000), ("ume", 0x0001), ("umq", 0x0002)))
            f.add(p + ".version.version", o.version)
        elif isinstance(o, L.LocalDomainOption):
            f.many(p + ".local_domain", type=_POPT_CODE[type(o)], len=_popt_len(o))
            # R1 (tshark 4.0) has no .flags.viral bit (R2 adds it).
            f.flags(p + ".local_domain.flags", o.flags, _IGN16)
            f.add(p + ".local_domain.local_domain_id", o.local_domain_id)
        elif isinstance(o, L.UnknownPacketOption):
            if 0x80 <= o.code <= 0x84:
                raise ValueError(f"UnknownPacketOption with a code tshark knows: {o.code:#x}")
            f.many(p + ".unknown", type=o.code, len=4 + len(o.data),
                   flags="",  # FT_NONE: always shown with an empty value
                   data=o.data)
            f.experts.append(f"Unknown LBMR option type 0x{o.code:02x}")
        else:
            raise TypeError(f"unexpected packet option {o!r}")
    f.many(p + ".len", type=0x80, len=4, total_len=total)


# ---- the packet


def _expect(pkt: L.Packet) -> _Fields:
    f = _Fields()
    t = pkt.type
    h = "lbmr.hdr"
    f.many(h, ver=pkt.version, opts=1 if pkt.options is not None else 0, type=t)
    qopts = _Fields()
    if t in (0, 1):
        recs = pkt.tqrs if t == 0 else pkt.wc_tqrs
        f.many(h, tqrs=len(recs), tirs=len(pkt.tirs))
        for q in pkt.tqrs if t == 0 else ():
            f.add("lbmr.tqr.name", shown(q.topic))
        for w in pkt.wc_tqrs if t == 1 else ():
            f.add("lbmr.tqr.pattern_type", w.pattern_type)
            # QUIRK (spec §5, R1): the pattern item starts at the pattern-type
            # byte, so it shows that byte as a character followed by the
            # pattern. A type byte of 0 ends the string at once (and tshark
            # flags the rest as stray characters).
            pt = w.pattern_type
            if pt == 0:
                f.add("lbmr.tqr.pattern", "")
                if w.pattern:
                    f.experts.append("Trailing stray characters")
            else:
                f.add("lbmr.tqr.pattern", shown(bytes((pt,)) + _wire(w.pattern)))
        for tir in pkt.tirs:
            _tir(f, tir)
    elif t in (2, 3):
        f.many(h, tqrs=0, tirs=0)
    elif t == 4:
        tmb = pkt.tmb if pkt.tmb is not None else L.TopicMgmtBlock()
        f.many(h, tqrs=tmb.hdr_b1, tirs=tmb.hdr_b23)
        tmr_lens = [4 + len(_wire(r.name)) + 1 for r in tmb.tmrs]
        f.many("lbmr.tmb", len=4 + sum(tmr_lens) if tmb.length is None else tmb.length,
               tmrs=len(tmb.tmrs))
        for r, tmr_len in zip(tmb.tmrs, tmr_lens, strict=True):
            q = "lbmr.tmb.tmr"
            f.many(q, len=tmr_len, type=r.type)
            f.flags(q + ".flags", r.flags, (("response", 0x80), ("wildcard_pcre", 0x40),
                                            ("wildcard_regex", 0x20)))
            f.add(q + ".name", shown(r.name))
    elif t == 6:
        f.many(h, qqrs=len(pkt.qqrs), qirs=len(pkt.qirs))
        for q in pkt.qqrs:
            f.add("lbmr.qqr.name", shown(q.queue))
        for q in pkt.qirs:
            _qir(f, q, qopts)
    elif t == 7:
        x = pkt.ext
        handler = _EXT.get(type(x))
        if handler is not None:
            f.add(h + ".ext_type", _EXT_TYPE[type(x)])
            handler(f, x)
        elif isinstance(x, L.UnknownExt):
            if x.ext_type in _EXT_TYPE.values():
                raise ValueError(f"UnknownExt with a type tshark knows: {x.ext_type:#x}")
            f.add(h + ".ext_type", x.ext_type)
            f.experts.append(f"Unknown LBMR extended type 0x{x.ext_type:02x}")
        else:
            raise TypeError(f"unexpected extended record {x!r}")
    else:
        raise ValueError(f"packet type {t} has no tshark model")
    for k, v in qopts.d.items():
        f.d.setdefault(k, []).extend(v)
    f.experts += qopts.experts
    if pkt.options is not None:
        _packet_options(f, pkt.options)
    return f


def expected_fields(pkt: L.Packet) -> dict[str, list[str | int | bytes]]:
    """What tshark 4.0 must show for ``pkt``: field name -> values in document order."""
    return _expect(pkt).d


def expected_experts(pkt: L.Packet) -> list[str]:
    """The expert messages tshark must attach to the tree for ``pkt`` (sorted)."""
    return sorted(_expect(pkt).experts)


# --------------------------------------------------------------------------- tshark's defects


def tshark_defect(pkt: L.Packet) -> str | None:
    """Why tshark 4.0 cannot show ``pkt`` correctly (documented dissector
    defects, spec §7.5/§11.2), or ``None`` if it must show it exactly."""
    x = pkt.ext if pkt.type == 7 else None
    has_trailer = pkt.options is not None
    if pkt.type == 4 and (pkt.tmb is None or not pkt.tmb.tmrs):
        # Not in the spec: the TMR-list item is added with length -1 at the
        # end of the (trimmed) data, which throws -> "Malformed Packet".
        return "TOPIC_MGMT without TMRs: tshark throws on the empty TMR list"
    if isinstance(x, E.Tnwg) and x.type in (1, 2):
        n = len(x.options)
        if n > 2:
            return "TNWG options: cumulative-offset defect misplaces the third and later options"
        if n == 2 and has_trailer:
            return "TNWG options: cumulative-offset defect over-reports the length, trailer lost"
    if not has_trailer:
        return None
    if isinstance(x, E.Qmgmt):
        return "QMGMT: packet-option walk starts 2 bytes late"
    if isinstance(x, L.UnknownExt):
        return "unknown ext type: only 2 bytes consumed, the rest is walked as packet options"
    if isinstance(x, E.Tnwg) and x.type not in (0, 1, 2) and x.raw:
        return "unknown TNWG type: only the header is consumed, the rest is walked as packet options"
    return None


# =========================================================================== LBMC / LBT-TCP
#
# The same judgement for LBMC messages on LBT-TCP streams: :func:`write_lbttcp_pcap`
# writes a TCP connection (handshake, then one segment per given chunk of the
# stream) into a pcap, :func:`run_tshark_lbmc` dissects it, and
# :func:`expected_lbmc_fields` is our own statement, from a
# :class:`lbmr_proto.lbmc.Message` (never from its bytes), of what tshark's
# ``lbmc`` layer must show, with the field names of ``tshark -G fields``.
#
# Facts of the dissector (tshark 4.0, packet-lbttcp.c / packet-lbmc.c) that
# shape the captures: LBT-TCP is found by a test of the LBMC header at the start
# of every TCP segment (also under "decode as"), so a segment that starts
# inside a message is not dissected (nor, often, the rest of the stream): every
# segment we write starts at a message boundary. The test also wants the first
# message's ``next_hdr`` in the dissector's list of header types, which has
# neither NONE nor codes it does not know: a segment may not start with an EOT
# or a control message without headers (:func:`segments` puts those after the
# previous message) nor with a header type outside that list. The payload of
# a data message is shown by the ``data`` dissector inside the ``lbmc`` layer.

LBTTCP_SOURCE_PORT = 14371  # the dissector's default source port range is 14371..14390

_TCP_HDR = struct.Struct("!HHIIBBHHH")
_IP_HDR = struct.Struct("!BBHHHBBH4s4s")


def _checksum(b: bytes) -> int:
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    s = (s & 0xFFFF) + (s >> 16)
    return ~((s & 0xFFFF) + (s >> 16)) & 0xFFFF


def tcp_segment(src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: int,
                payload: bytes = b"") -> bytes:
    """One raw IPv4 packet (pcap link type RAW) holding a TCP segment, checksums valid."""
    s, d = bytes(map(int, src[0].split("."))), bytes(map(int, dst[0].split(".")))
    tcp = _TCP_HDR.pack(src[1], dst[1], seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, 5 << 4, flags, 65535, 0, 0)
    csum = _checksum(s + d + struct.pack("!BBH", 0, 6, len(tcp) + len(payload)) + tcp + payload)
    tcp = tcp[:16] + struct.pack("!H", csum) + tcp[18:]
    ip = _IP_HDR.pack(0x45, 0, 20 + len(tcp) + len(payload), 0, 0x4000, 64, 6, 0, s, d)
    return ip[:10] + struct.pack("!H", _checksum(ip)) + ip[12:] + tcp + payload


def write_lbttcp_pcap(path: str | Path, chunks: Iterable[tuple[bool, bytes]], *,
                      source: tuple[str, int] = ("127.0.0.1", LBTTCP_SOURCE_PORT),
                      receiver: tuple[str, int] = ("127.0.0.1", 40001)) -> int:
    """One TCP connection from ``receiver`` to ``source``: the handshake, then a
    segment per ``(from_source, bytes)`` chunk. Returns the number of frames."""
    seq = {True: 1000, False: 5000}  # next sequence number of each direction
    frames = [tcp_segment(receiver, source, seq[False], 0, 0x02)]
    frames.append(tcp_segment(source, receiver, seq[True], seq[False] + 1, 0x12))
    seq[True] += 1
    seq[False] += 1
    frames.append(tcp_segment(receiver, source, seq[False], seq[True], 0x10))
    for from_source, data in chunks:
        a, b = (source, receiver) if from_source else (receiver, source)
        frames.append(tcp_segment(a, b, seq[from_source], seq[not from_source], 0x18, data))
        seq[from_source] += len(data)
    with PcapWriter(path, linktype=LINKTYPE_RAW) as w:
        for i, f in enumerate(frames):
            w.write_frame(1_700_000_000 + i / 1000, f)
    return len(frames)


def segments(messages: Iterable[bytes]) -> list[bytes]:
    """Encoded messages -> TCP segment payloads: one message each, except that
    a message whose ``next_hdr`` is NONE joins the previous segment (see
    above; so the first message must not be one of those)."""
    out: list[bytes] = []
    for m in messages:
        if m[1] == C.NHDR_NONE and out:
            out[-1] += m
        else:
            out.append(m)
    return out


class LbmcFrame(NamedTuple):
    """One frame of tshark's JSON output for an LBT-TCP capture: the ``lbmc``
    layers (one per message in the segment) and the expert messages and
    malformed mark found anywhere in the frame except TCP's own
    connection-setup notes (SYN, SYN+ACK: "chat" level)."""

    number: int
    lbmc: list[dict]
    experts: list[str]
    malformed: bool

    @property
    def flagged(self) -> bool:
        return self.malformed or bool(self.experts)


_TCP_CHAT = ("Connection establish request (SYN)", "Connection establish acknowledge (SYN+ACK)")


def run_tshark_lbmc(pcap_path: str | Path, *, port: int = LBTTCP_SOURCE_PORT,
                    extra_args: Iterable[str] = ()) -> list[LbmcFrame]:
    """Dissect an LBT-TCP capture, TCP ``port`` decoded as LBT-TCP (else another
    protocol's heuristic may take a segment first: SMPP does, for a data message
    whose first four bytes read as the segment's length); one :class:`LbmcFrame`
    per frame."""
    out = []
    for number, layers, experts, malformed in tshark_frames(pcap_path, f"tcp.port=={port},lbttcp", extra_args):
        lbmc_layers = layers.get("lbmc")
        if not isinstance(lbmc_layers, list):
            lbmc_layers = [] if lbmc_layers is None else [lbmc_layers]
        out.append(LbmcFrame(number, lbmc_layers, [e for e in experts if not e.startswith(_TCP_CHAT)],
                             malformed))
    return out


# ---- what tshark must show for a message (names from `tshark -G fields`)

_LBMC_BYTES_FIELDS = frozenset({"lbmc.stream.ctxinst", "data.data"})
#: generated (not on the wire): the dissector's UIM stream bookkeeping
_LBMC_GENERATED = frozenset({"lbmc.lbm_stream.stream_id", "lbmc.lbm_stream.substream_id"})
_IGN8B = (("ignore", 0x80),)
#: header type codes, from the dissector's list of header names (`tshark -G values`)
_LBMC_CODE = {
    C.FragmentHeader: 1, C.RequestHeader: 4, C.SsfInitHeader: 16, C.SsfCreqHeader: 17,
    C.UmeRxReqHeader: 21, C.UmeLateJoinInfoHeader: 30, C.DomainHeader: 67, C.OriginDomainHeader: 74, C.StreamHeader: 75,
    C.LateJoinRequestHeader: 78, C.DestinationHeader: 100, C.TcpSidHeader: 107,
}


def _lbmc_header(f: _Fields, h, next_hdr: int) -> None:
    def head(p: str, size: int) -> None:
        f.many(p, next_hdr=next_hdr, hdr_len=size)

    if isinstance(h, C.FragmentHeader):
        p = "lbmc.frag"
        head(p, 16)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.many(p, first_sqn=h.first_sqn, offset=h.offset, len=h.length)
    elif isinstance(h, C.RequestHeader):
        p = "lbmc.tcp_request"
        head(p, 16)
        f.add(p + ".flags", h.flags)
        f.add("lbmc.tcp_request_flags.ignore", 1 if h.flags & 0x80 else 0)  # sic: '_flags.'
        f.many(p, transport=h.transport, qidx=h.qidx, port=h.port, reserved=h.reserved, ipaddr=h.ipaddr)
    elif isinstance(h, C.SsfInitHeader):
        p = "lbmc.ssf_init"
        head(p, 20)
        f.add(p + ".transport", h.transport)  # tshark lists it before the flags it follows
        f.flags(p + ".flags", h.flags, (("ignore", 0x80), ("default_inclusions", 0x40),
                                        ("default_exclusions", 0x20)))
        f.many(p, transport_idx=h.transport_idx, client_idx=h.client_idx, ssf_port=h.ssf_port,
               res=h.reserved, ssf_ip=h.ssf_ip)
    elif isinstance(h, C.SsfCreqHeader):
        p = "lbmc.ssf_creq"
        head(p, 16)
        f.flags(p + ".flags", h.flags, _IGN8B)
        f.many(p, mode=h.mode, transport_idx=h.transport_idx, topic_idx=h.topic_idx, client_idx=h.client_idx)
    elif isinstance(h, C.UmeRxReqHeader):
        p = "lbmc.ume_rxreq"
        head(p, 28)
        f.flags(p + ".flags", h.flags, (("ignore", 0x8000), ("t", 0x4000)))
        f.many(p, marker=h.flags & 0xFF, request_idx=h.request_idx, transport_idx=h.transport_idx,
               id_2=h.id_2, seqnum=h.seqnum, rx_port=h.rx_port, res=h.reserved, rx_ip=h.rx_ip)
    elif isinstance(h, C.UmeLateJoinInfoHeader):
        p = "lbmc.ume_lj_info"
        head(p, 16)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.many(p, low_seqnum=h.low_seqnum, high_seqnum=h.high_seqnum, qidx=h.qidx)
    elif isinstance(h, C.DomainHeader):
        p = "lbmc.domain"
        head(p, 8)
        f.flags(p + ".flags", h.flags, (("ignore", 0x8000), ("active", 0x4000)))
        f.add(p + ".domain", h.domain_id)
    elif isinstance(h, C.OriginDomainHeader):
        p = "lbmc.odomain"
        head(p, 8)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.add(p + ".domain", h.domain_id)
    elif isinstance(h, C.StreamHeader):
        p = "lbmc.stream"
        head(p, 20)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.many(p, stream_id=h.stream_id, sqn=h.sqn, ctxinst=h.ctxinst)
    elif isinstance(h, C.LateJoinRequestHeader):
        p = "lbmc.lji_req"
        head(p, 36)
        f.flags(p + ".flags", h.flags, (("ignore", 0x8000), ("l_flag", 0x1), ("m_flag", 0x2), ("o_flag", 0x4)))
        f.many(p, request_idx=h.request_idx, transport_idx=h.transport_idx, topic_idx=h.topic_idx,
               req_ip=h.req_ip, req_port=h.req_port, res=h.reserved, tx_low_sqn=h.tx_low_sqn,
               rx_req_max=h.rx_req_max, rx_req_outstanding_max=h.rx_req_outstanding_max)
    elif isinstance(h, C.DestinationHeader):
        p = "lbmc.destination"
        head(p, 28)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.many(p, domain_id=h.domain_id, ipaddr=h.ipaddr, port=h.port, hops_taken=h.hops_taken,
               orig_domain_id=h.orig_domain_id, orig_ipaddr=h.orig_ipaddr, orig_port=h.orig_port,
               reserved=h.reserved)
    elif isinstance(h, C.TcpSidHeader):
        p = "lbmc.tcp_sid"
        head(p, 8)
        f.flags(p + ".flags", h.flags, _IGN16)
        f.add(p + ".sid", h.session_id)
    elif isinstance(h, C.UnknownHeader):
        # shown as "unhandled" with an error expert (the dissector has no code for it)
        head("lbmc.unhandled", 2 + len(h.data))
        f.add("lbmc.unhandled.data", "")  # FT_NONE
        f.experts.append(f"Invalid LBMC header type 0x{h.code:02x}")
    else:
        raise TypeError(f"unexpected LBMC header {h!r}")


def _lbmc_expect(msg) -> _Fields:
    f = _Fields()
    codes = [h.code if isinstance(h, C.UnknownHeader) else _LBMC_CODE[type(h)] for h in msg.headers]
    codes.append(msg.end)
    size = len(C.encode(msg))  # msglen is the only derived value; everything else from the object
    f.many("lbmc", version=0, type=msg.kind, next_hdr=codes[0], msglen=size)
    if msg.kind in C.DATA_KINDS:
        f.many("lbmc", tidx=msg.tidx, sqn=msg.sqn)
    for i, h in enumerate(msg.headers):
        _lbmc_header(f, h, codes[i + 1])
    if msg.payload:
        f.many("data", data=msg.payload, len=len(msg.payload))
    return f


def expected_lbmc_fields(msg) -> dict[str, list]:
    """What tshark 4.0's ``lbmc`` layer must show for ``msg``: field -> values."""
    return _lbmc_expect(msg).d


def expected_lbmc_experts(msg) -> list[str]:
    return sorted(_lbmc_expect(msg).experts)


def compare_lbmc(layer: dict, msg) -> list[str]:
    """Differences between one tshark ``lbmc`` layer and ``msg`` (empty = equal)."""
    flat = flatten(layer)
    want = expected_lbmc_fields(msg)
    problems = []
    for name in sorted((flat.keys() | want.keys()) - _LBMC_GENERATED):
        if name.count(".") == 1 and name.split(".")[1] in (
                "frag", "tcp_request", "ssf_init", "ssf_creq", "ume_rxreq", "ume_lj_info", "domain", "odomain",
                "stream", "lji_req", "destination", "tcp_sid", "unhandled"):
            continue  # FT_NONE containers of the headers
        kind = "bytes" if name in _LBMC_BYTES_FIELDS else None
        got = [v.replace(":", "").lower() if kind else norm(v, name) for v in flat.get(name, [])]
        exp = [v.hex() if kind else norm(v, name) for v in want.get(name, [])]
        if got != exp:
            problems.append(f"{name}: tshark {got!r} != expected {exp!r}")
    return problems


# --------------------------------------------------------------------------- transport fields


def tshark_field_rows(pcap_path: str | Path, decode_as: Iterable[str], fields: list[str],
                      display_filter: str = "") -> dict[int, dict[str, list[int | str]]]:
    """tshark's ``fields`` of every frame matching ``display_filter``, with each
    ``decode_as`` rule (e.g. ``udp.port==14400,lbtrm``): frame number ->
    {field: [values in order]} (numbers as ints, decimal or 0x hex; absent
    fields omitted)."""
    cmd = [tshark_path(), "-r", str(pcap_path)]
    for rule in decode_as:
        cmd += ["-d", rule]
    if display_filter:
        cmd += ["-Y", display_filter]
    cmd += ["-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,", "-e", "frame.number"]
    for f in fields:
        cmd += ["-e", f]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    out: dict[int, dict[str, list[int | str]]] = {}
    for line in proc.stdout.splitlines():
        cols = line.split("\t")
        row: dict[str, list[int | str]] = {}
        for name, text in zip(fields, cols[1:], strict=True):
            if text:
                row[name] = [_number(v) for v in text.split(",")]
        out[int(cols[0])] = row
    return out


def _number(v: str) -> int | str:
    try:
        return int(v, 0)
    except ValueError:
        return v
