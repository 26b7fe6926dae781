"""The shared runtime of lbmr-kit's daemons and tools.

Above :mod:`lbmr_proto` (the wire format and UM's resolver model) and below
``lbmrd``, ``router``, ``lbmr_tools`` and ``lbmr_analyze``, each of which may
import it; it imports none of them.

* :mod:`lbmr_runtime.xmlconfig` -- safe XML configuration loading: file
  reading with limits, markup declarations refused, one DTD runner and one
  libxml2 message translator driven by per-grammar tables, ``ConfigError``
  with file:line;
* :mod:`lbmr_runtime.values` -- number, IPv4 host and CIDR network parsers
  with readable errors;
* :mod:`lbmr_runtime.process` -- exit codes, UTC text/JSON logging, and
  ``run_daemon`` (trio.run with the daemons' exit codes);
* :mod:`lbmr_runtime.http` -- a bounded, read-only HTTP/1.0 GET endpoint
  (security headers, optional token and TLS) and the Prometheus text writer;
* :mod:`lbmr_runtime.monitor` -- the operators' pages (static HTML, CSS and
  scripts as package data) and the bounded, printable JSON they read;
* :mod:`lbmr_runtime.events` -- the recent-events ring;
* :mod:`lbmr_runtime.loglimit` -- a sans-IO limit on log lines per event
  kind (N per window, the rest counted into one summary line);
* :mod:`lbmr_runtime.eventlog` -- those limited lines on trio's clock, with
  the task that logs each window's summary when it ends;
* :mod:`lbmr_runtime.netif` -- local interfaces, interface specs, multicast
  interface checks and multicast socket set-up.
"""
