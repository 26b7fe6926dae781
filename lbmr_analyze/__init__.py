"""lbmr_analyze: offline analysis of LBMR (UM topic resolution) captures with PySpark.

``lbmr-analyze CAPTURE... --out DIR`` splits pcap/pcapng files into byte ranges,
decodes them on Spark executors with :mod:`lbmr_proto` into flat Parquet records
(partitioned by hour), runs the analyses in Spark SQL and writes
``DIR/report.html`` with PNG plots and the result tables as CSV and JSON.
See lbmr-analyze(1).

Modules: :mod:`.splits` (byte ranges, resynchronisation), :mod:`.rows`
(datagrams -> Arrow batches), :mod:`.analyses` (Spark queries), :mod:`.report`,
:mod:`.job` (session and pipeline), :mod:`.javacheck`, :mod:`.cli`.
Only :mod:`.splits` and :mod:`.rows` run on executors.
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
