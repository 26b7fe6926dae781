"""lbmrd configuration files as an attacker or a careless operator writes them:
XML declarations that would read other files, FIFOs, huge files, and files
big enough to expose quadratic checks."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbmrd.config import MAX_CONFIG_BYTES, ConfigError, load_config, network_conflicts, parse_config
from tests.lbmrd_networks import networks_file

from .helpers import LBMRD


class FifoWatch:
    """A FIFO that records whether anyone opened it for reading: a writer
    polls it with O_NONBLOCK, which succeeds only while a reader has it open
    (and then feeds the reader a byte and closes, so nothing hangs)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self.opened = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # ENXIO: no reader
                time.sleep(0.005)
                continue
            self.opened = True
            try:
                os.write(fd, b"x")
            except OSError:
                pass
            os.close(fd)
            time.sleep(0.005)

    def close(self) -> None:
        time.sleep(0.1)  # a last look
        self._stop.set()
        self._thread.join()


def xxe_forms(target: Path) -> dict[str, bytes]:
    t = str(target)
    body = '<lbmrd version="1.0">\n  <daemon>\n    <log>&x;</log>\n  </daemon>\n</lbmrd>\n'
    plain = '<lbmrd version="1.0"/>\n'
    return {
        "external-dtd": f'<?xml version="1.0"?>\n<!DOCTYPE lbmrd SYSTEM "file://{t}">\n{plain}'.encode(),
        "relative-dtd": f'<?xml version="1.0"?>\n<!DOCTYPE lbmrd SYSTEM "{target.name}">\n{plain}'.encode(),
        "public-dtd": f'<?xml version="1.0"?>\n<!DOCTYPE lbmrd PUBLIC "-//x//y" "{t}">\n{plain}'.encode(),
        "parameter-entity": (f'<?xml version="1.0"?>\n<!DOCTYPE lbmrd [<!ENTITY % p SYSTEM "file://{t}"> '
                             f'%p;]>\n{plain}').encode(),
        "external-entity": (f'<?xml version="1.0"?>\n<!DOCTYPE lbmrd [<!ENTITY x SYSTEM "{t}">]>\n'
                            f"{body}").encode(),
        "after-comment": f'<?xml version="1.0"?>\n<!-- hello -->\n<!DOCTYPE lbmrd SYSTEM "{t}">\n{plain}'.encode(),
        "utf-16": ("\ufeff" + f'<?xml version="1.0" encoding="UTF-16"?>\n<!DOCTYPE lbmrd SYSTEM '
                   f'"{t}">\n{plain}').encode("utf-16-le"),
        "latin-1": (f'<?xml version="1.0" encoding="ISO-8859-1"?>\n<!DOCTYPE lbmrd SYSTEM "{t}">\n'
                    f"{plain}").encode("latin-1"),
    }


@pytest.mark.parametrize("form", list(xxe_forms(Path("x"))))
def test_xxe_forms_are_refused_without_opening_the_file(tmp_path, form):
    watch = FifoWatch(tmp_path / "secret")
    conf = tmp_path / "lbmrd.xml"
    conf.write_bytes(xxe_forms(watch.path)[form])
    try:
        r = subprocess.run(LBMRD + ["-v", str(conf)], capture_output=True, text=True, timeout=30,
                           cwd=tmp_path)
    finally:
        watch.close()
    assert not watch.opened, f"{form}: the parser opened {watch.path}"
    assert r.returncode == 1, r
    assert "declarations are not allowed" in r.stderr, r.stderr
    assert f"{conf}:" in r.stderr


def test_an_unsupported_encoding_is_refused(tmp_path):
    text = '<?xml version="1.0" encoding="EBCDIC-US"?>\n<lbmrd version="1.0"/>\n'.encode("cp037")
    with pytest.raises(ConfigError, match="EBCDIC|UTF-16 or UTF-32|unsupported encoding"):
        parse_config(text, "x.xml")
    with pytest.raises(ConfigError, match='unsupported encoding "UTF-7"'):
        parse_config(b'<?xml version="1.0" encoding="UTF-7"?>\n<lbmrd version="1.0"/>', "x.xml")


def test_a_fifo_as_the_config_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "lbmrd.xml"
    os.mkfifo(fifo)
    r = subprocess.run(LBMRD + ["-v", str(fifo)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "is a FIFO" in r.stderr, r
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_size_limit(tmp_path):
    big = tmp_path / "big.xml"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: nothing is read to refuse it
    with pytest.raises(ConfigError, match=f"more than the limit of {MAX_CONFIG_BYTES} bytes"):
        load_config(big)
    with pytest.raises(ConfigError, match="more than the limit"):
        parse_config(b" " * (MAX_CONFIG_BYTES + 1), "x.xml")


def _cpu_to_load(path) -> float:
    """Least CPU seconds of two loads of ``path``."""
    best = float("inf")
    for _ in range(2):
        t = time.process_time()
        load_config(path)
        best = min(best, time.process_time() - t)
    return best


def test_fifty_thousand_networks_validate_in_linear_time(tmp_path):
    """The checks are linear: 50,000 networks (with 500 overlaps and 5,000 NAT
    rules) cost at most about 4 times what 12,500 cost (a quadratic check
    would cost 16 times; 16,000 networks took 38 s before). A ratio measured
    in the same run, so a busy machine slows both sides alike; about a
    second of CPU on this project's machine (bench: lbmrd -v)."""
    small, big = tmp_path / "small.xml", tmp_path / "big.xml"
    small.write_text(networks_file(12_500, overlap_every=100))
    big.write_text(networks_file(50_000, overlap_every=100))
    t = time.process_time()
    cfg = load_config(big)
    big_cpu = time.process_time() - t
    assert sum(len(d.networks) for d in cfg.domains) == 50_500
    overlaps = [w for _, w in cfg.warnings if "overlaps" in w]
    assert len(overlaps) > 400
    assert cfg.domain_of("10.0.1.7") == "d0"
    ratio = big_cpu / _cpu_to_load(small)
    assert ratio < 8, f"50,000 networks cost {ratio:.1f} times 12,500"


def test_many_dtd_errors_are_capped_and_linear(tmp_path):
    text = ('<?xml version="1.0"?>\n<lbmrd version="1.0">\n<domains>\n'
            '<domain name="a"><network>10.0.0.0/8</network></domain>\n'
            + "<bogus/>\n" * 16_000 + "</domains>\n</lbmrd>\n")
    t = time.process_time()
    with pytest.raises(ConfigError) as info:
        parse_config(text, "x.xml")
    assert time.process_time() - t < 2.0
    errs = info.value.errors
    assert len(errs) == 101 and "15900 more" in errs[-1][1]
    assert errs[0] == (5, errs[0][1]) and "unknown element <bogus>" in errs[0][1]


# the quadratic check this replaced, kept as the reference
def reference_conflicts(nets):
    out = []
    for i, (net, name) in enumerate(nets):
        for j in range(i):
            other, oname = nets[j]
            if (oname == name and other == net) or (oname != name and other.overlaps(net)):
                out.append((i, j))
                break
    return out


net_st = st.builds(lambda a, p: ipaddress.IPv4Network((a, p), strict=False),
                   st.integers(0, 2**32 - 1).map(lambda v: v & 0xFF0000FF), st.integers(0, 32))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(net_st, st.sampled_from("abc")), max_size=40))
def testnetwork_conflicts_match_the_pairwise_check(nets):
    assert network_conflicts(nets) == reference_conflicts(nets)


def test_shadowed_rules_are_still_reported():
    text = networks_file(2000)
    cfg = parse_config(text, "x.xml")
    shadow = [w for _, w in cfg.warnings if "never applies" in w]
    assert shadow == []  # distinct addresses: nothing shadowed
    text = text.replace('<match address="10.9.0.1" port="1001"/>', '<match address="10.9.0.0" port="1001"/>')
    text = text.replace('destination="d1"><rule><match address="10.9.0.0" port="1001"/>',
                        'destination="d0"><rule><match address="10.9.0.0" port="1001"/>')
    cfg = parse_config(text, "x.xml")
    shadow = [w for _, w in cfg.warnings if "never applies" in w]
    assert len(shadow) == 1 and "10.9.0.0:*" in shadow[0]
