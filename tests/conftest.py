"""Test-wide settings. Property tests (hypothesis) explore new examples on a
developer's machine; under CI (``CI`` set, as ``.ci/run`` runs) they replay a
fixed set, so a landing is judged on the same examples every time, and a
failure found by a developer's run is kept as a regression test."""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")
