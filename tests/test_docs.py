"""Documentation promises: man pages render cleanly, README and CI agree."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

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
    text = (ROOT / "pyproject.toml").read_text()
    scripts = re.findall(r'^([a-z][a-z0-9-]+) = "', text.split("[project.scripts]")[1].split("\n[")[0], re.M)
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
