"""<relay fanout max-queue>: parsed, defaulted (fan-out on, the DRO's
1000000-byte max-queue), bad values named with file and line."""

from __future__ import annotations

import io

from lxml import etree

from router.config import load_config
from router.config.grammar import DTD_TEXT
from router.config.model import EndpointConfig
from tests.helpers import write
from tests.router.helpers import doc, endpoint, expect_error, peer


def relay(attrs: str) -> str:
    return f'      <relay port-low="15000" port-high="15009" {attrs}/>\n'


def test_fanout_is_on_with_the_dros_queue_by_default(tmp_path):
    cfg = load_config(write(tmp_path, "d.xml", doc(portals=endpoint(extra=relay("")) + peer())))
    assert cfg.endpoint.fanout is True and cfg.endpoint.fanout_max_queue == 1_000_000
    cfg = load_config(write(tmp_path, "n.xml", doc()))  # no <relay> at all
    assert cfg.endpoint.fanout is True and cfg.endpoint.fanout_max_queue == 1_000_000
    assert EndpointConfig.__dataclass_fields__["fanout"].default is True
    attrs = {(e.name, a.name): a for e in etree.DTD(io.StringIO(DTD_TEXT)).iterelements()
             for a in e.iterattributes()}
    assert attrs["relay", "fanout"].values() == ["on", "off"]
    assert attrs["relay", "fanout"].default_value == "on"
    assert attrs["relay", "max-queue"].default_value == "1000000"


def test_fanout_off_and_a_queue_size_are_read(tmp_path):
    text = doc(portals=endpoint(extra=relay('fanout="off" max-queue="65536"')) + peer())
    cfg = load_config(write(tmp_path, "o.xml", text))
    assert cfg.endpoint.fanout is False and cfg.endpoint.fanout_max_queue == 65536


def test_bad_fanout_values_name_the_file_and_line(tmp_path):
    text = doc(portals=endpoint(extra=relay('fanout="maybe"')) + peer())
    expect_error(tmp_path, "f.xml", text, "<relay", "fanout", "maybe")
    text = doc(portals=endpoint(extra=relay('max-queue="1000"')) + peer())
    expect_error(tmp_path, "q.xml", text, "<relay", "<relay> max-queue", "at least one 65535-byte message")
    text = doc(portals=endpoint(extra=relay('max-queue="lots"')) + peer())
    expect_error(tmp_path, "l.xml", text, "<relay", "<relay> max-queue")
