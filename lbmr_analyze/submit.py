"""The ``spark-submit`` entry point of lbmr-analyze (spark-submit runs a ``.py`` file,
not a console script)::

    spark-submit --master yarn \
        --driver-java-options "-Dlog4j2.configurationFile=$(lbmr-analyze --log4j-config)" \
        "$(lbmr-analyze --submit-script)" hdfs:///caps --out hdfs:///tr

(``--driver-java-options`` makes Spark's driver log only errors from its start;
without it Spark's start-up lines show until the session sets the level.)

It takes the same arguments as ``lbmr-analyze`` (see lbmr-analyze(1)); the driver's
Python must have lbmr-kit installed, the executors' only pyarrow.
"""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    # spark-submit puts this file's folder first on sys.path: drop it, so that the
    # package's modules are imported as lbmr_analyze.*, never as top-level modules
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    from lbmr_analyze.cli import main

    main(prog_name="lbmr-analyze")
