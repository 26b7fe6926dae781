"""Paths and Hadoop-style URIs for inputs and output, on driver and executors.

``/data/caps``, ``file:///data/caps``, ``hdfs://nn:8020/caps`` and
``s3a://bucket/caps`` are all accepted.  The driver first resolves every URI with
Hadoop's own FileSystem API (:func:`hadoop_resolve`: ``FileSystem.resolvePath``
in Spark's JVM, with Spark's Hadoop configuration), so mount tables such as
``viewfs://`` and any scheme configured with ``spark.hadoop.fs.<scheme>.impl``
lead to the file system that really holds the data.  Python code (the driver's
listing, the executors' reading and Parquet writing, the report) then goes
through :mod:`pyarrow.fs` (``s3a://`` is opened as pyarrow's ``s3://``;
``hdfs://`` needs libhdfs, as on any Hadoop node): a resolved scheme pyarrow has
no file system for is a clear error (:class:`UnsupportedURI`).  Spark itself
reads the records back through Hadoop with :func:`spark_uri`, which is always
fully qualified, so a local path is never resolved against a cluster's default
file system.

Remote captures are read by copying the bytes a task needs (the file's first
64 KiB and its byte range plus a margin for resynchronisation) into a sparse
local temporary file, so the memory-mapped reader works unchanged; gzip
captures (``.gz``) are decompressed into a local temporary file (one task per
file: gzip cannot be cut into byte ranges).
"""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
import zlib
from urllib.parse import urlparse

#: Bytes fetched past a remote split's end for resynchronisation (bytes).
REMOTE_MARGIN = 8 << 20
_HEAD = 1 << 16


def is_uri(text: str) -> bool:
    """True for ``scheme://...`` (any scheme, including file://)."""
    p = urlparse(str(text))
    return len(p.scheme) > 1 and str(text).startswith(p.scheme + "://")


def is_local(text: str) -> bool:
    return not is_uri(text) or urlparse(str(text)).scheme == "file"


def local_path(text: str) -> str:
    """A local path or ``file://`` URI as an absolute local path."""
    if is_uri(text):
        from urllib.parse import unquote
        return os.path.abspath(unquote(urlparse(text).path))
    return os.path.abspath(os.fspath(text))


class UnsupportedURI(ValueError):
    """A URI whose file system the executors' Python (pyarrow) cannot open."""


def filesystem(text: str):
    """(pyarrow FileSystem, path within it) for a local path or a URI; raises
    :class:`UnsupportedURI` for a scheme pyarrow has no file system for (or cannot
    reach, e.g. ``hdfs://`` without libhdfs)."""
    import pyarrow as pa
    import pyarrow.fs as pafs
    if is_local(text):
        return pafs.LocalFileSystem(), local_path(text)
    uri = str(text)
    if uri.startswith(("s3a://", "s3n://")):
        uri = "s3://" + uri.split("://", 1)[1]
    try:
        return pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as e:
        raise UnsupportedURI(
            f"{text}: lbmr-analyze's executors read and write through pyarrow, which cannot open it "
            f"({str(e).splitlines()[0] if str(e) else type(e).__name__}); use a path, file://, hdfs:// "
            f"(with libhdfs), s3a://, gs:// or abfs://, or a Hadoop mount (viewfs://) that leads to one") from None


def hadoop_resolve(spark, text: str) -> str:
    """``text`` as Hadoop's FileSystem API resolves it in Spark's JVM
    (``FileSystem.resolvePath``: mount tables such as viewfs:// followed), for the
    path or, when it does not exist yet (an output folder), its nearest existing
    ancestor with the rest appended.  Local paths and ``file://`` URIs, and schemes
    Hadoop has no file system for here (pyarrow may still have one: s3a:// without
    hadoop-aws), are returned unchanged."""
    if not is_uri(text) or urlparse(str(text)).scheme == "file":
        return text
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    path = jvm.org.apache.hadoop.fs.Path(str(text))
    try:
        fs = path.getFileSystem(conf)
    except Exception:  # noqa: BLE001 - Py4J: UnsupportedFileSystemException and kin
        return text
    rest: list[str] = []
    cur = path
    while True:
        try:
            resolved = str(fs.resolvePath(cur).toString())
            break
        except Exception as e:  # noqa: BLE001
            parent = cur.getParent()
            if "FileNotFoundException" not in str(e) or parent is None:
                return text
            rest.insert(0, str(cur.getName()))
            cur = parent
    import re
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):/(?!/)", resolved)
    if m:                                        # Hadoop's "file:/x" (no authority): "file:///x"
        resolved = f"{m.group(1)}:///{resolved[m.end():]}"
    return join(resolved, *rest) if rest else resolved


def join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


def normal(text: str) -> str:
    """The canonical form used in tables: local inputs as absolute paths, URIs as given."""
    return local_path(text) if is_local(text) and not str(text).startswith("file://") else (
        str(text) if is_uri(text) else local_path(text))


def spark_uri(text: str) -> str:
    """A fully qualified URI for Spark (``file:///abs/path`` for local paths)."""
    if is_uri(text):
        return str(text)
    from pathlib import Path
    return Path(local_path(text)).as_uri()


def parent_and_name(text: str) -> tuple[str, str]:
    t = str(text).rstrip("/")
    i = t.rfind("/")
    return t[:i] if i > 0 else "/", t[i + 1:]


class LocalCopy:
    """A context manager giving a local file path for a capture: the file itself
    when local and not compressed, else a temporary copy (remote: the first 64 KiB
    and ``[start, end + REMOTE_MARGIN)`` at their offsets in a sparse file; gzip:
    the whole decompressed stream).  Raises OSError (with the reason) when the
    capture cannot be opened."""

    def __init__(self, path: str, start: int = 0, end: int | None = None) -> None:
        self.path, self.start, self.end = path, start, end
        self.tmp: str | None = None

    def __enter__(self) -> str:
        gz = self.path.lower().endswith(".gz")
        if is_local(self.path) and not gz:
            p = local_path(self.path)
            if os.path.isdir(p):                   # a folder that could not be listed
                os.listdir(p)                      # its OSError says why
                raise IsADirectoryError(21, "is a folder", p)
            with open(p, "rb"):
                pass                               # dangling link, permission: OSError here
            return p
        fd, self.tmp = tempfile.mkstemp(prefix="lbmr-analyze-cap-")
        try:
            with os.fdopen(fd, "wb") as out:
                if gz:
                    self._gunzip(out)
                else:
                    self._fetch(out)
        except BaseException:
            os.unlink(self.tmp)
            self.tmp = None
            raise
        return self.tmp

    def _open_input(self):
        fs, p = filesystem(self.path)
        return fs.open_input_file(p)

    def _gunzip(self, out) -> None:
        src = open(local_path(self.path), "rb") if is_local(self.path) else self._open_input()
        with src, gzip.GzipFile(fileobj=src) as g:
            try:
                shutil.copyfileobj(g, out, 1 << 20)
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                raise OSError(f"gzip: {e}") from None

    def _fetch(self, out) -> None:
        with self._open_input() as f:
            size = f.size()
            out.truncate(size)
            end = size if self.end is None else min(size, self.end + REMOTE_MARGIN)
            for a, b in ((0, min(_HEAD, size)), (max(self.start, 0), end)):
                pos = a
                while pos < b:
                    n = min(8 << 20, b - pos)
                    out.seek(pos)
                    out.write(f.read_at(n, pos))
                    pos += n

    def __exit__(self, *exc) -> None:
        if self.tmp is not None:
            os.unlink(self.tmp)
