"""Documentation promises: man pages render cleanly, README and CI agree."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from functools import partial
from pathlib import Path

import pytest

from .shell import Shell, logical

ROOT = Path(__file__).resolve().parents[1]
MAN_PAGES = sorted((ROOT / "man").glob("*.[1-8]"))


def test_there_are_man_pages():
    assert {p.name for p in MAN_PAGES} >= {"lbmr-inspect.1"}


@pytest.mark.parametrize("page", MAN_PAGES, ids=lambda p: p.name)
def test_man_page_is_groff_clean(page):
    groff = shutil.which("groff")
    assert groff, "groff is missing: ./scripts/test installs groff-base"
    r = subprocess.run([groff, "-man", "-ww", "-z", str(page)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_every_console_script_has_a_man_page_and_readme_line():
    scripts = console_scripts()
    assert scripts
    readme = (ROOT / "README.md").read_text()
    for s in scripts:
        assert any(p.stem == s for p in MAN_PAGES), f"no man page for {s}"
        assert s in readme, f"README does not mention {s}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "    ./scripts/test\n" in readme and "    ./scripts/run\n" in readme
    assert "./scripts/test" in ci


# --- the README as a newcomer's page ---------------------------------------------------------

README = ROOT / "README.md"
VENV_BIN = Path(sys.executable).parent
#: a page, not a manual: details live in the man pages
MAX_LINES, MAX_PARAGRAPH_LINES, MAX_CELL_WORDS, MAX_WALKTHROUGH = 200, 12, 12, 10


def console_scripts() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    return re.findall(r'^([a-z][a-z0-9-]+) = "', text.split("[project.scripts]")[1].split("\n[")[0], re.M)


def readme_blocks() -> list[list[str]]:
    """The README's blocks: runs of non-blank lines outside fenced code."""
    blocks, cur, fenced = [], [], False
    for ln in README.read_text().splitlines():
        if ln.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if ln.strip():
            cur.append(ln)
        elif cur:
            blocks.append(cur)
            cur = []
    return blocks + ([cur] if cur else [])


def readme_commands() -> list[str]:
    """Every command of the README's indented code blocks, as bash reads them."""
    lines = [ln[4:] for b in readme_blocks() for ln in b if ln.startswith("    ")]
    return logical(lines)


def walkthrough(name: str) -> list[str]:
    """The commands between the README's ``<!-- name: begin`` and ``end`` markers."""
    text = README.read_text()
    block = text.split(f"<!-- {name}: begin", 1)[1].split(f"<!-- {name}: end", 1)[0].splitlines()[1:]
    assert block and all(ln.startswith("    ") for ln in block), block
    return logical([ln[4:] for ln in block])


def test_readme_is_a_short_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README has {len(lines)} lines: move details to man/"
    for block in readme_blocks():
        if block[0].startswith(("    ", "|", "<!--")):
            continue
        assert len(block) <= MAX_PARAGRAPH_LINES, f"a paragraph of {len(block)} lines: {block[0]!r}"
    for block in readme_blocks():
        for row in (ln for ln in block if ln.startswith("|")):
            for cell in row.strip("|").split("|"):
                assert len(cell.split()) <= MAX_CELL_WORDS, f"a table cell of {len(cell.split())} words: {cell!r}"
    sections = re.findall(r"^## (\S+)", README.read_text(), re.M)
    for tool in console_scripts() + ["lbmr_proto"]:
        assert tool in sections, f"no section for {tool}"


def test_each_walkthrough_has_at_most_ten_commands():
    text = README.read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    for sec in sections:
        cmds = logical([ln[4:] for ln in sec.splitlines() if ln.startswith("    ")])
        name = sec.split("\n", 1)[0]
        if name.startswith("Set-up"):
            continue
        assert len(cmds) <= MAX_WALKTHROUGH, f"{name}: {len(cmds)} commands"


def _helps(tools: set[str]) -> dict[str, str]:
    """Each tool's --help (the tools started side by side: each is an interpreter's start)."""
    procs = {t: subprocess.Popen([str(VENV_BIN / t), "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for t in sorted(tools)}
    out = {}
    try:
        for t, p in procs.items():
            stdout, stderr = p.communicate(timeout=120)
            assert p.returncode == 0, (t, stderr)
            out[t] = stdout
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def test_every_readme_command_uses_real_options_and_files():
    """Every option a README command gives one of our tools is in that tool's
    --help, and every file of the project it names exists."""
    tools, seen = set(console_scripts()), set()
    helps = _helps(tools)
    for cmd in readme_commands():
        words = shlex.split(cmd.replace("\\\n", " "), comments=True)
        for path in (w for w in words if w.startswith(("configs/", "bench/", "man/", "scripts/", "./scripts/"))):
            assert (ROOT / path).exists(), f"{path} named in README does not exist"
        segment = []
        for w in words + ["|"]:
            if w not in ("|", "&", "&&", ";"):
                segment.append(w)
                continue
            tool = next((s for s in segment if s in tools), None)
            if tool:
                seen.add(tool)
                help_text = helps[tool]
                for opt in segment[segment.index(tool) + 1:]:
                    if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", opt):
                        assert re.search(rf"(^|[\s,\[]){re.escape(opt.split('=')[0])}\b", help_text), \
                            f"{tool} has no option {opt} (README: {cmd.strip()})"
                    elif re.fullmatch(r"-[a-zA-Z]", opt):
                        assert re.search(rf"(^|[\s,\[]){opt}\b", help_text), \
                            f"{tool} has no option {opt} (README: {cmd.strip()})"
            segment = []
    assert seen == tools, f"README shows no command of {sorted(tools - seen)}"


def test_every_file_the_readme_names_exists():
    """Paths in backquotes, the benchmark table's scripts and its man pages."""
    text = README.read_text()
    paths = set(re.findall(r"`((?:configs|bench|man|scripts|router|tests|\.ci)/[\w./-]+)`", text))
    paths |= set(re.findall(r"man -l (man/[\w.-]+)", text))
    table = [ln.split("|")[1:-1] for ln in text.splitlines() if re.match(r"\| `\w+\.py` \|", ln)]
    assert len(table) >= 7
    paths |= {"bench/" + row[0].strip(" `") for row in table}
    paths |= {"man/" + row[-1].strip(" `") for row in table}
    for path in sorted(paths):
        assert (ROOT / path).exists(), f"README names {path}, which does not exist"


def test_readme_lbmr_proto_example_runs():
    text = README.read_text()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    *lines, last = code.strip().splitlines()
    ns: dict = {}
    exec("\n".join(lines), ns)  # noqa: S102 - the README's own example
    assert last.startswith("L.decode(") and "LBMRDecodeError: offset 0: unknown LBMR packet type 5" in last
    with pytest.raises(ns["L"].LBMRDecodeError, match="offset 0: unknown LBMR packet type 5"):
        exec(last.split("#", 1)[0], ns)  # noqa: S102


def test_readme_lbmr_inspect_commands_run(tmp_path):
    """The lbmr-inspect lines on a capture of two datagrams (not --live)."""
    import lbmr_proto as L
    from lbmr_proto.capture import PcapngWriter, PcapWriter

    tir = L.encode(L.Packet(L.PacketType.NORMAL, 1, tirs=[L.TIR("md.AAPL", L.TcpTransport("10.1.2.3", 14371), 16, 7)]))
    tqr = L.encode(L.Packet(L.PacketType.NORMAL, 1, tqrs=[L.TQR("md.AAPL")]))
    for name, writer in (("trace.pcap", PcapWriter), ("trace.pcapng", PcapngWriter)):
        with writer(tmp_path / name) as w:
            w.write_udp(1.0, "10.1.2.3", 14402, "10.1.2.9", 15380, tir)
            w.write_udp(2.0, "10.1.2.4", 13000, "10.1.2.9", 13000, tqr)
    cmds = [c for c in readme_commands() if c.startswith("lbmr-inspect ")]
    assert len(cmds) >= 5
    env = dict(os.environ, PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))
    for cmd in cmds:
        r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, cwd=tmp_path,
                           env=env, timeout=120)
        assert r.returncode == 0, (cmd, r.stderr)
        assert "md.AAPL" in r.stdout or "NORMAL" in r.stdout, (cmd, r.stdout)


# --- the walk-throughs, run as written (only ports moved to free ones) ---------------------


def _free(kind: int, ip: str) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class Moves:
    """The walk-through's fixed ports moved to free ones; each move must be used."""

    def __init__(self, moves: dict[str, str]) -> None:
        self.moves, self.used = moves, set()

    def __call__(self, cmd: str) -> str:
        for old, new in self.moves.items():
            if old in cmd:
                cmd = cmd.replace(old, new)
                self.used.add(old)
        return cmd

    def check(self) -> None:
        assert self.used == set(self.moves), f"the walk-through no longer names {set(self.moves) - self.used}"


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=2) as r:
        return r.read().decode()


def _answers(url: str, text: str = "") -> bool:
    try:
        return text in _get(url)
    except OSError:
        return False


def venv_env() -> dict:
    return dict(os.environ, PATH=os.pathsep.join([str(VENV_BIN), os.environ.get("PATH", "")]))


def run_walkthrough(shell: Shell, cmds: list[str], moves: Moves, expect: dict[str, str]) -> None:
    """Each command fed to ``shell`` as typed; a foreground command must exit 0
    and print what ``expect`` gives for its first words.  Before a ``curl`` the
    test waits, as a person would, until its endpoint answers (for ``peer_up``,
    until the link is up); after a background ``lbmrd``, until it listens."""
    for cmd in map(moves, cmds):
        words = cmd.split()
        if words[0] == "curl":
            base = "/".join(("http://" + words[2]).split("/", 3)[:3])
            want = "lbmr_router_peer_up 1" if "peer_up" in cmd else ""
            wait_until(partial(_answers, base + "/metrics", want), 60, f"{base} ({want})")
        start = len(shell.out())
        shell.send(cmd)
        if cmd.rstrip().endswith("&"):
            if words[0] == "lbmrd":
                _wait_for_output(shell, start, f"listening on UDP {words[words.index('-i') + 1]}:"
                                 f"{words[words.index('-p') + 1]}")
            continue
        status = shell.status(120)
        assert status == 0, (cmd, shell.out()[start:][-3000:], shell.err()[-3000:])
        key = next((k for k in expect if cmd.startswith(k)), None)
        if key:
            _wait_for_output(shell, start, expect[key])
    moves.check()
    shell.send("wait\n")                                   # every background job has ended
    assert shell.status(60) == 0


def _wait_for_output(shell: Shell, start: int, text: str, seconds: float = 60) -> None:
    shell.wait_for(lambda: text in shell.out()[start:], seconds)


def wait_until(what, seconds: float, label: str) -> None:
    deadline = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < deadline, f"timed out waiting for {label}"
        time.sleep(0.2)


@pytest.fixture
def shell(tmp_path):
    (tmp_path / "configs").mkdir()
    sh = Shell(tmp_path, venv_env())
    yield sh
    sh.close()


def test_lbmrd_walkthrough_runs_as_written(tmp_path, shell):
    for f in ("lbmrd.xml", "lbmrd-nat-example.xml"):
        (tmp_path / "configs" / f).write_bytes((ROOT / "configs" / f).read_bytes())
    port, metrics = _free(socket.SOCK_DGRAM, "127.0.0.1"), _free(socket.SOCK_STREAM, "127.0.0.1")
    moves = Moves({"-p 15380": f"-p {port}", "127.0.0.1:15380": f"127.0.0.1:{port}",
                   "127.0.0.1:9380": f"127.0.0.1:{metrics}"})
    cmds = walkthrough("lbmrd-walkthrough")
    assert [c.split()[0] for c in cmds][:3] == ["lbmrd", "lbmrd", "lbmr-sim"]
    run_walkthrough(shell, cmds, moves, {
        "lbmrd -v": "lbmrd-nat-example.xml: valid",
        "lbmr-sim": "8/8 receivers resolved",
        "curl -s 127.0.0.1:9380/status".replace("9380", str(metrics)): '"clients_total": 8',
        "curl -s 127.0.0.1:9380/metrics".replace("9380", str(metrics)): "lbmrd_relayed_total",
        "kill -HUP": "configuration reloaded",
        "kill -USR1": "dump {",
        "kill %1": "final stats",
    })


def test_router_walkthrough_runs_as_written(tmp_path, shell):
    """Start the shipped pair, a source in TRD1 and a receiver in TRD2 that
    verifies its data, and router B's status and page."""
    l1, l2 = _free(socket.SOCK_DGRAM, "127.0.1.1"), _free(socket.SOCK_DGRAM, "127.0.2.1")
    peer, ma, mb = (_free(socket.SOCK_STREAM, "127.0.0.1") for _ in range(3))
    for name in ("router-a.xml", "router-b.xml"):
        text = (ROOT / "configs" / name).read_text()
        for old, new in (("26123", str(peer)), ('127.0.1.1" port="15380', f'127.0.1.1" port="{l1}'),
                         ('127.0.2.1" port="15380', f'127.0.2.1" port="{l2}'),
                         ("127.0.0.1:9390", f"127.0.0.1:{ma}"), ("127.0.0.1:9391", f"127.0.0.1:{mb}")):
            text = text.replace(old, new)
        (tmp_path / "configs" / name).write_text(text)
    moves = Moves({"127.0.1.1 -p 15380": f"127.0.1.1 -p {l1}", "127.0.2.1 -p 15380": f"127.0.2.1 -p {l2}",
                   "127.0.1.1:15380": f"127.0.1.1:{l1}", "127.0.2.1:15380": f"127.0.2.1:{l2}",
                   "127.0.0.1:9390": f"127.0.0.1:{ma}", "127.0.0.1:9391": f"127.0.0.1:{mb}"})
    cmds = walkthrough("router-walkthrough")
    assert len(cmds) <= MAX_WALKTHROUGH
    # the page: no browser is opened here (the page itself is tested in chromium by
    # tests/test_pages_router.py); the line must name router B's endpoint, and what a
    # browser would get there is fetched instead: the page
    (page,) = [c for c in cmds if c.startswith("xdg-open ")]
    assert moves(page).split()[1] == f"http://127.0.0.1:{mb}/", page
    cmds = [f"curl -s {page.split()[1].removeprefix('http://')}\n" if c is page else c for c in cmds]
    run_walkthrough(shell, cmds, moves, {
        f"curl -s 127.0.0.1:{ma}/metrics": "lbmr_router_peer_up 1",
        "lbmr-sim --daemon 127.0.2.1": "data verified for 1/1 receivers",
        f"curl -s 127.0.0.1:{mb}/status": '"proxies"',
        f"curl -s 127.0.0.1:{mb}/": "<title>lbmr-router monitor</title>",
    })
