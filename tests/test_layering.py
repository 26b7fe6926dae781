"""The house reads top-down: lbmr_proto (wire format and UM's resolver model,
sans-IO) at the bottom; lbmr_runtime (the daemons' and tools' shared runtime)
next; lbmrd, router, lbmr_tools and lbmr_analyze on top, each depending only
downward and only on public names. Checked from the source's own imports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["lbmr_proto", "lbmr_runtime", "lbmrd", "router", "lbmr_tools", "lbmr_analyze"]
#: what each package may import of the project's packages (besides itself)
ALLOWED = {
    "lbmr_proto": set(),
    "lbmr_runtime": {"lbmr_proto"},
    "lbmrd": {"lbmr_proto", "lbmr_runtime"},
    "router": {"lbmr_proto", "lbmr_runtime"},
    "lbmr_tools": {"lbmr_proto", "lbmr_runtime"},
    "lbmr_analyze": {"lbmr_proto", "lbmr_runtime"},
}
#: no I/O, no event loop, no clock in the wire format and the UM model
SANS_IO_FORBIDDEN = {"trio", "socket", "time", "asyncio", "selectors", "select", "ssl"}


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names imported from it, line) for every absolute import."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.module, [a.name for a in node.names], node.lineno))
    return out


def modules(pkg: str) -> list[Path]:
    return sorted((ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("pkg", PACKAGES)
def test_packages_depend_only_downward_and_on_public_names(pkg):
    bad = []
    for path in modules(pkg):
        for mod, names, line in imports(path):
            top = mod.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line}"
            if top in PACKAGES and top != pkg:
                if top not in ALLOWED[pkg]:
                    bad.append(f"{where}: {pkg} imports {mod}")
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                private += [p for p in mod.split(".")[1:] if p.startswith("_")]
                if private:
                    bad.append(f"{where}: private name(s) {private} of {mod}")
    assert not bad, "\n".join(bad)


def test_lbmr_proto_is_sans_io():
    bad = []
    for path in modules("lbmr_proto"):
        if path.name == "scapy.py":  # the optional scapy layer binds to scapy, which has I/O
            continue
        for mod, _, line in imports(path):
            if mod.split(".")[0] in SANS_IO_FORBIDDEN:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


#: address conversions of the socket module: pure functions, no I/O
PURE_SOCKET_NAMES = {"inet_aton", "inet_ntoa", "inet_pton", "inet_ntop", "AF_INET"}


def socket_uses(path: Path) -> set[str]:
    """The names of the socket module a file uses (``socket.X`` and ``from socket import X``)."""
    tree = ast.parse(path.read_text(), str(path))
    used = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "socket":
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == "socket":
            used |= {a.name for a in node.names}
    return used


def test_the_router_core_and_lbmrd_core_are_sans_io():
    """The protocol logic is plain objects: no trio, sockets (beyond address
    conversions) or clocks."""
    core = [ROOT / "lbmrd" / "relay.py", ROOT / "lbmrd" / "clients.py", ROOT / "lbmrd" / "nat.py",
            *sorted((ROOT / "router" / "core").glob("*.py")),
            *sorted((ROOT / "router" / "peerlink").glob("*.py"))]
    bad = []
    for path in core:
        for mod, _, line in imports(path):
            top = mod.split(".")[0]
            if top == "socket":
                extra = socket_uses(path) - PURE_SOCKET_NAMES
                if extra:
                    bad.append(f"{path.relative_to(ROOT)}:{line}: uses socket.{sorted(extra)}")
            elif top in SANS_IO_FORBIDDEN | {"lxml"}:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_router_core_folder_imports_only_itself_and_the_peer_link_protocol():
    """router/core is the router's sans-IO logic as a folder: besides the
    standard library and lbmr_proto it imports its own modules and
    router.peerlink, never the trio shell (daemon, links, relay, tasks)."""
    bad = []
    for path in sorted((ROOT / "router" / "core").glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                target = "." * node.level + (node.module or "")
                ok = node.level == 1 or (node.level == 2 and (node.module or "").split(".")[0] == "peerlink"
                                         or node.level == 2 and node.module is None
                                         and [a.name for a in node.names] == ["peerlink"])
                if not ok:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {target}")
            elif isinstance(node, ast.ImportFrom | ast.Import):
                mods = [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                for mod in mods:
                    if mod and mod.split(".")[0] == "router" and not mod.startswith(("router.core", "router.peerlink")):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: imports {mod}")
    assert not bad, "\n".join(bad)


def test_lbmr_proto_modules_import_one_another_without_cycles():
    """lbmr_proto's modules (capture and the private modules it is built from,
    the codec and its helpers) import one another in one direction only: the
    relative imports form no cycle, so each module reads on top of the ones it
    imports."""
    pkg = ROOT / "lbmr_proto"
    graph: dict[str, set[str]] = {}
    for path in modules("lbmr_proto"):
        if path.name == "__init__.py":  # the package's own face imports everything
            continue
        deps = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                names = [node.module] if node.module else [a.name for a in node.names]
                deps.update(n.split(".")[0] for n in names if (pkg / f"{n.split('.')[0]}.py").exists())
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> list[str] | None:
        if mod in path:
            return path[path.index(mod):] + [mod]
        if mod in done:
            return None
        for dep in sorted(graph.get(mod, ())):
            cycle = visit(dep, path + [mod])
            if cycle:
                return cycle
        done.add(mod)
        return None

    cycles = [c for c in (visit(m, []) for m in sorted(graph)) if c]
    assert not cycles, " -> ".join(cycles[0])
    assert {"_capfile", "_pcapread", "_udpframing"} <= graph["capture"] | graph["_pcapread"]


#: an import of a test module, in code or in a script a test runs: ``from tests.x.test_y import``,
#: ``from .test_y import``, ``import tests.test_y``, ``from tests.x import test_y``
TEST_MODULE_IMPORT = re.compile(
    r"^[ \t]*(?:from[ \t]+(?:tests(?:\.\w+)*\.|\.+(?:\w+\.)*)test_\w+[ \t]+import"
    r"|import[ \t]+tests(?:\.\w+)*\.test_\w+"
    r"|from[ \t]+(?:tests(?:\.\w+)*|\.+\w*(?:\.\w+)*)[ \t]+import[ \t]+\(?[^\n]*\btest_\w+)", re.M)


def test_the_pattern_finds_imports_of_test_modules():
    found = ["from tests.router.system.test_e2e import udp", "    from .test_dataplane import tcp_proxy",
             "import tests.test_analyze", "from tests.router.core import test_bridge",
             "from . import test_sim as S", "from ..core.test_tr import PortalTR"]
    not_found = ["from tests.helpers import free_port", "from tests.router.helpers import udp",
                 "from . import strategies as S", "from tests import netns", "def test_x():"]
    assert [s for s in found if not TEST_MODULE_IMPORT.search(s)] == []
    assert [s for s in not_found if TEST_MODULE_IMPORT.search(s)] == []


def test_no_test_module_imports_another():
    """Tests share their drivers through support modules (tests/helpers.py,
    tests/router/helpers.py, analyze_reference, transport_captures, browser,
    router_chain, certificates, lbmrd_networks, strategies, netns,
    tshark_judge, report_tables), never by importing a test module: each test module reads on its own and
    can be moved or split without breaking another. Scripts a test runs in a
    subprocess (source text in a string) count too."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        for m in TEST_MODULE_IMPORT.finditer(text):
            line = text[: m.start()].count("\n") + 1
            bad.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0).strip()}")
    assert not bad, "\n".join(bad)


def test_the_router_tests_package_does_not_shadow_the_router():
    """tests/router is the package ``tests.router``: ``import router`` is still
    the project's router, in the test process and in a fresh one started from
    the checkout as the namespace and CLI tests start theirs."""
    import router
    import tests.router

    assert Path(router.__file__).resolve() == ROOT / "router" / "__init__.py"
    assert Path(tests.router.__file__).resolve() == ROOT / "tests" / "router" / "__init__.py"
    out = subprocess.run([sys.executable, "-c", "import router, tests.router; print(router.__file__)"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    assert Path(out.strip()).resolve() == ROOT / "router" / "__init__.py"
