"""Test-wide settings. Property tests (hypothesis) explore new examples on a
developer's machine; under CI (``CI`` set, as ``.ci/run`` runs) they replay a
fixed set, so a landing is judged on the same examples every time, and a
failure found by a developer's run is kept as a regression test."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


@pytest.fixture(scope="session")
def spark_session():
    """One real SparkSession (local[2]) for every lbmr-analyze test module that embeds
    Spark (each used to start its own: a SparkContext's start, seconds, per module).
    A module sets the SQL option it differs in (shuffle partitions) for its own tests,
    with :func:`tests.analyze_reference.shuffle_partitions`; the context's own settings are the same for all."""
    from lbmr_analyze.job import build_session
    s = build_session("local[2]", [("spark.sql.shuffle.partitions", "4"), ("spark.ui.enabled", "false"),
                                   ("spark.driver.memory", "2g")], progress_bar=False)
    yield s
    s.stop()
