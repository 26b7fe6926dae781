"""The operators' pages on a daemon's HTTP endpoint (``GET /``): one static
HTML document per daemon, its stylesheet and scripts (package data, served
from the daemon's own origin under ``/static/``), and the JSON they read.

Safe by construction: the page builds every cell with ``textContent`` (no
markup from data), the endpoint's Content-Security-Policy allows only its
own scripts and styles (:data:`lbmr_runtime.http.SECURITY_HEADERS`), and
every string of the JSON goes through :func:`visible` first, so a name
from the wire (a topic, a pattern, a router or context name: any bytes a
peer chose) arrives as printable text: undecodable bytes as ``\\xNN``,
control and bidirectional-override characters as ``\\uNNNN``, at most
:data:`MAX_NAME` characters. Lists are paged (:class:`TableQuery`) or cut
(:func:`bounded`), so a response stays small whatever the daemon holds.
"""

from __future__ import annotations

import heapq
import inspect
import json
import re
import unicodedata
from collections.abc import Callable, Iterable
from importlib import resources

__all__ = ["MAX_NAME", "MAX_ROWS", "TableQuery", "bounded", "page_json", "page_routes", "visible"]

MAX_NAME = 1024  # characters of one string shown at most (the rest is cut, with a mark)
MAX_ROWS = 500  # rows of one page of a table at most
MAX_LIST = 1000  # entries of a list in a summary at most (bounded())
MAX_FILTER = 200  # characters of a filter string at most
SLICE = 5000  # rows a sliced scan looks at between two checkpoints

_PLAIN = re.compile(r"[\x20-\x7e]*")  # the common case: nothing to do


def _escape_char(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{o - 0xDC00:02x}"
    if o == 0x5C:
        return "\\\\"
    cat = unicodedata.category(ch)
    # controls, format characters (bidi overrides and isolates, zero-width ...),
    # surrogates, private use, unassigned, and separators other than the space
    if cat[0] in "CZ" and ch != " ":
        return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"
    return ch


def visible(s: str) -> str:
    """``s`` as printable text: see the module's doc. A backslash is shown
    doubled, so an escape in the result always stands for a character
    that was not printable (a name cannot pass for another)."""
    if len(s) <= MAX_NAME and _PLAIN.fullmatch(s) and "\\" not in s:
        return s
    cut = len(s) > MAX_NAME
    out = "".join(_escape_char(ch) for ch in s[:MAX_NAME])
    return out + "\u2026" if cut else out


def _visible_tree(obj):
    t = type(obj)
    if t is str:
        return visible(obj)
    if t is dict:
        return {(visible(k) if type(k) is str else str(k)): _visible_tree(v) for k, v in obj.items()}
    if t is list or t is tuple:
        return [_visible_tree(v) for v in obj]
    if t is float and obj != obj:  # NaN is not JSON
        return None
    return obj


def page_json(obj) -> bytes:
    """``obj`` as compact JSON for a page, every string (keys too) through
    :func:`visible`."""
    return json.dumps(_visible_tree(obj), separators=(",", ":"), allow_nan=False).encode()


def bounded(items: list, limit: int = MAX_LIST) -> dict:
    """``{"total": n, "items": the first limit}``: a list cut for a summary."""
    return {"total": len(items), "items": list(items[:limit])}


def _int_param(q: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    text = q.get(name)
    if text is None or text == "":
        return default
    if not text.isdigit() or len(text) > 9:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {text[:20]!r}")
    v = int(text)
    if not low <= v <= high:
        raise ValueError(f"{name} must be from {low} to {high}, not {v}")
    return v


class TableQuery:
    """One page of a table: ``offset``, ``limit`` (1 to ``max_limit``, :data:`MAX_ROWS` by default),
    ``q`` (a filter: rows whose text contains it, case-insensitive),
    ``sort`` (a column name of the table's) and ``order`` (``asc`` or
    ``desc``), from a request's query parameters; ValueError on a bad one
    (the endpoint answers 400 with its text)."""

    __slots__ = ("offset", "limit", "q", "sort", "desc")

    def __init__(self, query: dict[str, str], columns: Iterable[str], *, default_sort: str,
                 default_limit: int = 100, max_limit: int = MAX_ROWS) -> None:
        self.offset = _int_param(query, "offset", 0, 0, 10**9)
        self.limit = _int_param(query, "limit", min(default_limit, max_limit), 1, max_limit)
        self.q = query.get("q", "")[:MAX_FILTER].casefold()
        self.sort = query.get("sort") or default_sort
        if self.sort not in columns:
            raise ValueError(f"sort must be one of {', '.join(sorted(columns))}")
        order = query.get("order", "asc")
        if order not in ("asc", "desc"):
            raise ValueError("order must be asc or desc")
        self.desc = order == "desc"

    async def page_in_slices(self, rows: list, key: Callable, text: Callable[[object], str], *,
                             natural: bool = False, lock=None) -> tuple[int, list]:
        """(rows matching the filter, this page of them, sorted by ``key``).
        ``text(row)``: what the filter looks in; ``natural``: ``rows`` come in
        this sort's ascending order already (no filter: only the page is
        looked at). Otherwise every row is looked at once, :data:`SLICE` rows
        at a time with a checkpoint between slices (the daemon's other tasks
        run meanwhile: a filter or sort of 100,000 clients never holds its
        loop for long), by heap selection of offset + limit rows, never a
        sort of the whole list; ``lock`` (a :class:`trio.Lock`): one such
        scan at a time, whoever asks."""
        import trio

        q = self.q
        end = self.offset + self.limit
        if natural and not self.desc and not q:
            return len(rows), rows[self.offset:end]
        pick = heapq.nlargest if self.desc else heapq.nsmallest
        async with lock if lock is not None else _NoLock():
            best: list = []
            matched = 0
            for i in range(0, len(rows), SLICE):
                part = rows[i:i + SLICE]
                if q:
                    part = [r for r in part if q in text(r).casefold()]
                matched += len(part)
                if natural and not self.desc:
                    best = (best + part)[:end]  # already in order: the first ``end`` are the page
                else:
                    best = pick(end, best + part, key=key)
                await trio.sleep(0)
        return matched, best[self.offset:end]


class _NoLock:
    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False


_STATIC = {  # served name -> (file, content type)
    "/static/monitor.css": ("monitor.css", "text/css; charset=utf-8"),
    "/static/monitor.js": ("monitor.js", "text/javascript; charset=utf-8"),
    "/static/icon.svg": ("icon.svg", "image/svg+xml"),
}


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath(name).read_bytes()


def page_routes(page: str, api: dict[str, Callable[[dict[str, str]], object]]) -> dict:
    """The routes of daemon page ``page`` (``lbmrd`` or ``router``): ``/``
    (its HTML), its stylesheet and scripts, and ``/api/<name>`` for every
    ``api`` function of the query parameters (its result as
    :func:`page_json`). The assets are read once, here."""
    routes = {"/": ("text/html; charset=utf-8", _const(_asset(f"{page}.html")))}
    for path, (name, ctype) in _STATIC.items():
        routes[path] = (ctype, _const(_asset(name)))
    routes[f"/static/{page}.js"] = ("text/javascript; charset=utf-8", _const(_asset(f"{page}.js")))
    for name, fn in api.items():
        routes[f"/api/{name}"] = ("application/json", _json_of(fn))
    return routes


def _const(data: bytes):
    return lambda query: data


def _json_of(fn):
    """The route of ``fn`` (a function of the query returning data, or an awaitable of it)
    answering :func:`page_json`."""
    async def route(query):
        data = fn(query)
        if inspect.isawaitable(data):
            data = await data
        return page_json(data)
    return route
