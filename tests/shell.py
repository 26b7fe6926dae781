"""Commands of the documents fed to one ``bash``, as a user types them.

Used by the tests that run the README's walk-throughs and lbmr-analyze(1)'s
cluster commands as written.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path


def logical(lines: list[str]) -> list[str]:
    """Commands as bash reads them: a line ending in a backslash goes on."""
    out, cur = [], ""
    for ln in lines:
        cur += ln + "\n"
        if not ln.endswith("\\"):
            out.append(cur)
            cur = ""
    assert not cur, "the block ends inside a command"
    return out


class Shell:
    """One bash reading commands from a pipe, its output in two files (opened for
    appending, as ``>>`` does: spark-submit's driver writes its standard error
    beside the JVM's only to a terminal, a pipe or such a file)."""

    def __init__(self, cwd: Path, env: dict) -> None:
        self.out_path, self.err_path = cwd / "shell.out", cwd / "shell.err"
        self._files = [open(self.out_path, "ab"), open(self.err_path, "ab")]
        self.proc = subprocess.Popen(["bash", "-s"], stdin=subprocess.PIPE, stdout=self._files[0],
                                     stderr=self._files[1], cwd=cwd, env=env, text=True,
                                     start_new_session=True)
        self.marks = 0

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd)
        self.proc.stdin.flush()

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_for(self, what, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not what():
            assert self.proc.poll() is None, ("bash ended", self.out()[-2000:], self.err()[-4000:])
            assert time.monotonic() < deadline, ("timed out", self.out()[-2000:], self.err()[-4000:])
            time.sleep(0.5)

    def status(self, seconds: float) -> int:
        """Wait for the command sent last to end; its exit status."""
        self.marks += 1
        mark = f"doc-test-status-{self.marks}"
        self.send(f'echo "{mark} $?"\n')
        self.wait_for(lambda: mark in self.out(), seconds)
        return int(re.search(rf"{mark} (\d+)", self.out()).group(1))

    def close(self) -> None:
        """End bash and everything it started (bounded: TERM, then KILL)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()  # reap bash: a zombie stays in its group and would keep the group "alive"
                try:
                    os.killpg(self.proc.pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
        self.proc.wait(10)
        for f in self._files:
            f.close()
