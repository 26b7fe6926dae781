"""Safe loading of lbmr-kit's XML configuration files, for every grammar.

A file is read only if it is a regular file of at most
:data:`MAX_CONFIG_BYTES`; markup declarations (DOCTYPE, ENTITY, ...) are
refused before any parser sees it, so nothing outside the file is ever
opened; the parser expands no entities and uses no network. Validation is
ours: :class:`Grammar` holds a built-in DTD and the tables that turn
libxml2's messages into the grammar's own terms; :func:`mass_errors` reports
files with more faults than :data:`MAX_ERRORS` without libxml2's
per-message cost. Every check is linear in the size of the file.

Errors are :class:`ConfigError` (``path:line: message``).
"""

from __future__ import annotations

import difflib
import io
import os
import re
import stat
import threading

from lxml import etree

#: Largest configuration file read, bytes.
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: Validation errors reported per file; the rest are counted.
MAX_ERRORS = 100
XINCLUDE_NS = "http://www.w3.org/2001/XInclude"


class ConfigError(ValueError):
    """An invalid configuration file.

    ``str(err)`` is ``"{path}:{line}: {message}"`` for the first error (by line);
    ``err.errors`` lists every ``(line, message)`` found in the same stage.  Line 0
    means "no particular line" (e.g. the file cannot be read).
    """

    def __init__(self, path: str, line: int, message: str,
                 errors: list[tuple[int, str]] | None = None) -> None:
        super().__init__(path, line, message)
        self.path = str(path)
        self.line = int(line or 0)
        self.message = message
        self.errors: list[tuple[int, str]] = list(errors) if errors else [(self.line, message)]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}"

    def format_all(self) -> str:
        """Every error, one ``path:line: message`` line each."""
        return "\n".join(f"{self.path}:{ln}: {msg}" for ln, msg in self.errors)


def raise_errors(path: str, errors: list[tuple[int, str]]) -> None:
    """Raise :class:`ConfigError` with every error, the first (by line) in front."""
    errors = sorted(errors, key=lambda e: e[0])
    line, msg = errors[0]
    raise ConfigError(path, line, msg, errors)


# --------------------------------------------------------------------------- reading


def safe_parser() -> etree.XMLParser:
    """An lxml parser that expands no entities, loads no DTD and uses no network."""
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        attribute_defaults=False,
        huge_tree=False,
        collect_ids=False,
    )


def element_text(el: etree._Element) -> str:
    """The element's text (with its children's), stripped."""
    if not len(el):
        return (el.text or "").strip()
    return "".join(el.itertext()).strip()


def read_config_file(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a configuration file: a regular file of at most ``limit``
    bytes. A FIFO, device or directory is refused without waiting on it (it
    is opened non-blocking and checked before anything is read)."""
    p = os.fspath(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise ConfigError(p, 0, f"cannot read the configuration file: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise ConfigError(p, 0, f"the configuration file is {kind}: give a regular file")
        if st.st_size > limit:
            raise ConfigError(p, 0, f"the configuration file is {st.st_size} bytes, more than the "
                                    f"limit of {limit} bytes")
        chunks = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigError(p, 0, f"the configuration file is more than {limit} bytes (the limit)")
        return b"".join(chunks)
    except OSError as e:
        raise ConfigError(p, 0, f"cannot read the configuration file: {e.strerror or e}") from e
    finally:
        os.close(fd)


_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe\x00\x00", "utf-32-le"),
         (b"\x00\x00\xfe\xff", "utf-32-be"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))
_ASCII_ENCODINGS = frozenset({"utf-8", "utf8", "us-ascii", "ascii", "iso-8859-1", "latin1",
                              "latin-1", "iso-8859-15", "windows-1252", "cp1252"})
_ENCODING_DECL = re.compile(rb"""^<\?xml[^>]*?\sencoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")
_DECLARATION = re.compile(r"<!(DOCTYPE|ENTITY|ELEMENT|ATTLIST|NOTATION)\b")


def check_declarations(data: bytes, path: str, what: str) -> None:
    """Refuse markup declarations before the XML parser sees the file.

    A DOCTYPE (internal subset, external DTD) or an entity declaration can
    make a parser open local files or wait on a FIFO; our DTD is applied by
    us, never taken from the file. The text is searched in the encoding the
    parser would use: UTF-8, UTF-16/32 with a byte-order mark, or an
    ASCII-compatible encoding named in the XML declaration; any other
    encoding is refused.
    """
    text = None
    for bom, codec in _BOMS:
        if data.startswith(bom):
            try:
                text = data[len(bom):].decode(codec)
            except UnicodeDecodeError as e:
                raise ConfigError(path, 0, f"the file is not valid {codec.upper()}: {e.reason}") from None
            break
    if text is None:
        if b"\x00" in data[:4]:
            raise ConfigError(path, 1, "the file looks like UTF-16 or UTF-32 without a byte-order "
                                       "mark: write it in UTF-8")
        m = _ENCODING_DECL.match(data)
        if m and m.group(1).decode("ascii").lower() not in _ASCII_ENCODINGS:
            raise ConfigError(path, 1, f'unsupported encoding "{m.group(1).decode("ascii")}": '
                                       "write the file in UTF-8")
        text = data.decode("latin-1")  # the markup is ASCII in every accepted encoding
    m = _DECLARATION.search(text)
    if m:
        head = text[:m.start()]
        line = head.count("\n") + head.count("\r") - head.count("\r\n") + 1  # LF, CRLF or CR
        raise ConfigError(path, line, f"<!{m.group(1)} declarations are not allowed in {what} "
                                      "configuration files (the DTD is built in; a DOCTYPE or "
                                      "entity could make the parser read other files): remove it")


def parse_xml(data: bytes, path: str, what: str) -> etree._Element:
    """The root element of configuration ``data`` (from ``path``, for
    messages; ``what`` names the file kind): size limit, declarations
    refused, safe parser; ``ConfigError`` listing every syntax error."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(path, 0, f"the configuration is {len(data)} bytes, more than the limit "
                                   f"of {MAX_CONFIG_BYTES} bytes")
    check_declarations(data, path, what)
    parser = safe_parser()
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as e:
        entries = [(x.line, x.column, x.message.strip()) for x in parser.error_log]
        if not entries:
            entries = [(e.lineno or 0, (e.position or (0, 0))[1], e.msg)]
        errors = [(ln, f"XML syntax error: {msg} (column {col})") for ln, col, msg in entries]
        raise ConfigError(path, errors[0][0], errors[0][1], errors) from None


def refuse_entities_and_xinclude(path: str, root: etree._Element, what: str) -> None:
    """``ConfigError`` for every entity reference and XInclude element."""
    line = root.sourceline or 0
    errors: list[tuple[int, str]] = []
    for node in root.iter():
        if isinstance(node, etree._Entity):
            errors.append((node.sourceline or line,
                           f"entity reference {node.text} is not supported: {what} files may use "
                           "only the predefined XML entities and character references"))
        elif isinstance(node.tag, str) and etree.QName(node).namespace == XINCLUDE_NS:
            errors.append((node.sourceline or line,
                           f"XInclude is not supported in {what} configuration files"))
    if errors:
        raise_errors(path, errors)


# --------------------------------------------------------------------------- trees


def local_name(el: etree._Element) -> str:
    return etree.QName(el).localname


class TreeIndex:
    """Look-ups a message translator makes many times, built once per tree:
    the elements starting on each line, and (on demand) the first line of
    each value of an attribute. Keeps the cost of N validation errors
    linear in the file's size."""

    def __init__(self, tree: etree._ElementTree) -> None:
        self.tree = tree
        self.by_line: dict[int, list[etree._Element]] = {}
        for el in tree.iter(etree.Element):
            self.by_line.setdefault(el.sourceline, []).append(el)
        self._firsts: dict[tuple[str, str], dict[str, int]] = {}

    def first_lines(self, tag: str, attr: str) -> dict[str, int]:
        """``value -> first line`` of ``attr`` over the ``tag`` elements (document order)."""
        key = (tag, attr)
        out = self._firsts.get(key)
        if out is None:
            out = self._firsts[key] = {}
            for el in self.tree.getroot().iter(tag):
                v = el.get(attr)
                if v:
                    out.setdefault(v, el.sourceline or 0)
        return out


_INDEX = threading.local()  # the last tree indexed by this thread (reloads run in a worker)


def tree_index(tree: etree._ElementTree) -> TreeIndex:
    """The :class:`TreeIndex` of ``tree`` (one cached per thread)."""
    idx = getattr(_INDEX, "value", None)
    if idx is None or idx.tree is not tree:
        idx = _INDEX.value = TreeIndex(tree)
    return idx


def elements_at(tree: etree._ElementTree, name: str, line: int) -> list[etree._Element]:
    """Elements named ``name`` (local name or prefix:name) starting on ``line``."""
    return [el for el in tree_index(tree).by_line.get(line, ())
            if local_name(el) == name or el.prefix and f"{el.prefix}:{local_name(el)}" == name]


# --------------------------------------------------------------------------- DTD validation

#: libxml2's DTD validation messages.
RE_CONTENT = re.compile(r"Element (\S+) content does not follow the DTD, expecting .*, got ?(.*)$")
RE_PCDATA = re.compile(r"Element (\S+) was declared #PCDATA but contains non text nodes")
RE_EMPTY = re.compile(r"Element (\S+) was declared EMPTY this one has content")
RE_NO_ELEM = re.compile(r"No declaration for element (\S+)")
RE_NO_ATTR = re.compile(r"No declaration for attribute (\S+) of element (\S+)")
RE_MISSING_ATTR = re.compile(r"Element (\S+) does not carry attribute (\S+)")
RE_SYNTAX = re.compile(r"Syntax of value for attribute (\S+) of (\S+) is not valid")
RE_ID_DUP = re.compile(r"ID (\S+) already defined")
RE_IDREF = re.compile(r'IDREF attribute (\S+) references an unknown ID "(.*)"')
RE_ENUM = re.compile(r'Value "(.*)" for attribute (\S+) of (\S+) is not among the enumerated set')


def _may_be_empty(node) -> bool:
    """Whether a DTD content-model node accepts no child elements at all."""
    if node is None or node.occur in ("opt", "mult") or node.type == "pcdata":
        return True
    if node.type == "element":
        return False
    if node.type == "seq":
        return _may_be_empty(node.left) and _may_be_empty(node.right)
    return _may_be_empty(node.left) or _may_be_empty(node.right)  # "or"


def _model_names(node) -> set[str]:
    if node is None:
        return set()
    if node.type == "element":
        return {node.name}
    return _model_names(node.left) | _model_names(node.right)


class DtdShape:
    """What a DTD says in a form a linear pre-check can use: per element its
    allowed children, attributes, required attributes, and whether it must
    have a child element."""

    def __init__(self, dtd: etree.DTD) -> None:
        decls = {e.name: e for e in dtd.iterelements()}
        self.children = {n: _model_names(e.content) for n, e in decls.items()}
        self.attrs = {n: {a.name for a in e.iterattributes()} for n, e in decls.items()}
        self.required = {n: [a.name for a in e.iterattributes() if a.default == "required"]
                         for n, e in decls.items()}
        self.needs_child = {n for n, e in decls.items()
                            if e.type == "element" and not _may_be_empty(e.content)}


def mass_errors(tree: etree._ElementTree, shape: DtdShape, limit: int = MAX_ERRORS
                ) -> list[tuple[int, str]] | None:
    """Count, in one pass, the faults that each cost libxml2 a separate
    validation message (unknown or misplaced elements and attributes, missing
    required attributes, elements missing all their children). More than
    ``limit``: the first ``limit`` of them, worded for people, and a count
    of the rest -- the file is not worth a full DTD validation, whose
    per-message cost would make a crafted file take minutes. Otherwise None.
    """
    found: list[tuple[int, str]] = []
    count = 0
    children, attrs, required, needs = shape.children, shape.attrs, shape.required, shape.needs_child
    root = tree.getroot()
    if root.tag not in children:
        return None  # the root check reports this
    for el in tree.iter(etree.Element):
        tag = el.tag
        allowed = children.get(tag)
        if allowed is None:
            continue  # reported by its parent
        msgs = []
        has_child = False
        for c in el:
            ctag = c.tag
            if not isinstance(ctag, str):
                continue
            has_child = True
            if ctag not in children:
                msgs.append((c.sourceline or 0, f"unknown element <{ctag}> in <{tag}>"))
            elif ctag not in allowed:
                msgs.append((c.sourceline or 0, f"<{tag}> may not contain <{ctag}>"))
        if el.attrib or required[tag]:
            line = el.sourceline or 0
            known = attrs[tag]
            msgs += [(line, f'unknown attribute "{a}" on <{tag}>') for a in el.attrib if a not in known]
            msgs += [(line, f'<{tag}> needs the "{a}" attribute') for a in required[tag]
                     if a not in el.attrib]
        if not has_child and tag in needs:
            msgs.append((el.sourceline or 0, f"<{tag}> is empty: it must contain an element"))
        if msgs:
            count += len(msgs)
            if len(found) < limit:
                found += msgs
    if count <= limit:
        return None
    found = sorted(found, key=lambda e: e[0])[:limit]
    found.append((found[-1][0], f"... and {count - limit} more errors of this kind (the first "
                                f"{limit} are shown; the file was not validated further)"))
    return found


def has_unknown_child(el: etree._Element, known) -> bool:
    """Whether ``el`` has a child element whose tag is not in ``known``."""
    return any(isinstance(c.tag, str) and c.tag not in known for c in el)


def did_you_mean(word: str, choices, fmt: str = "<{}>") -> str:
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.75)
    return f"did you mean {fmt.format(close[0])}?" if close else ""


class Grammar:
    """One configuration language: its built-in DTD and the tables that say
    libxml2's validation messages in the language's own terms.

    ``content``: per element, what it must contain (words); ``attrs``: per
    element, its attributes in the order messages list them (default: the
    DTD's, sorted); ``attr_hints``: extra words for a missing attribute;
    ``element_hints``: the reason an unknown element is not accepted (e.g.
    a setting of another product); ``attr_as_child``: advice for an
    attribute that should be a child element; ``suggest``: add "did you
    mean" for near misses. Subclasses may refine :meth:`content_error`,
    :meth:`empty_example` and :meth:`special`.
    """

    def __init__(self, name: str, dtd_text: str, *, content: dict[str, str],
                 attrs: dict[str, list[str]] | None = None,
                 attr_hints: dict[tuple[str, str], str] | None = None,
                 element_hints: dict[str, str] | None = None,
                 attr_as_child: dict[tuple[str, str], str] | None = None,
                 suggest: bool = False) -> None:
        self.name = name
        self.dtd = etree.DTD(io.StringIO(dtd_text))
        self.lock = threading.Lock()  # DTD.error_log belongs to the DTD object, not to one call
        self.shape = DtdShape(self.dtd)
        self.decls = {e.name: e for e in self.dtd.iterelements()}
        self.known = frozenset(self.decls)
        self.children = self.shape.children
        self.enums = {(n, a.name): a.values() for n, e in self.decls.items()
                      for a in e.iterattributes() if a.type == "enumeration"}
        self.content = content
        self.attrs = attrs if attrs is not None else {
            n: sorted(a.name for a in e.iterattributes()) for n, e in self.decls.items()}
        self.attr_hints = attr_hints or {}
        self.element_hints = element_hints or {}
        self.attr_as_child = attr_as_child or {}
        self.suggest = suggest

    # ------------------------------------------------------------ validation

    def errors(self, tree: etree._ElementTree) -> list[tuple[int, str]]:
        """Validate ``tree`` against the DTD: ``(line, message)`` pairs in
        these terms, sorted by line (at most :data:`MAX_ERRORS`, then a
        count). A tree with more faults than that is reported by
        :func:`mass_errors` without running libxml2's validator."""
        mass = mass_errors(tree, self.shape)
        if mass is not None:
            return mass
        with self.lock:
            if self.dtd.validate(tree):
                return []
            raw = [(e.line, e.message) for e in self.dtd.error_log]
        raw.sort(key=lambda e: e[0])
        more = len(raw) - MAX_ERRORS
        raw = raw[:MAX_ERRORS]
        out = []
        for line, msg in raw:
            text = self.translate(msg, line, tree)
            if text is not None:
                out.append((line, text))
        if not out:  # never drop the only explanation
            out = [(line, f"{msg} (DTD validation)") for line, msg in raw]
        if not out:
            out = [(0, f"the file does not follow the {self.name} DTD")]
        out.sort(key=lambda e: e[0])
        if more > 0:
            out.append((out[-1][0], f"... and {more} more DTD validation errors (the first "
                                    f"{MAX_ERRORS} are shown)"))
        return out

    # ------------------------------------------------------------ messages

    def translate(self, msg: str, line: int, tree: etree._ElementTree) -> str | None:
        """These terms for one libxml2 message; None = covered by another message."""
        msg = msg.strip()
        special = self.special(msg, line, tree)
        if special is not _NOT_SPECIAL:
            return special
        if m := RE_CONTENT.match(msg):
            name = m.group(1)
            els = elements_at(tree, name, line)
            if any(has_unknown_child(e, self.known) for e in els):
                return None  # the unknown element is reported
            return self.content_error(name, m.group(2), els)
        if m := RE_PCDATA.match(msg):
            name = m.group(1)
            if any(has_unknown_child(e, self.known) for e in elements_at(tree, name, line)):
                return None
            return f"<{name}> must contain only text, not elements"
        if m := RE_EMPTY.match(msg):
            name = m.group(1)
            if any(has_unknown_child(e, self.known) for e in elements_at(tree, name, line)):
                return None
            return f"<{name}> must be empty: write {self.empty_example(name)}"
        if m := RE_NO_ELEM.match(msg):
            return self._unknown_element(m.group(1), line, tree)
        if m := RE_NO_ATTR.match(msg):
            return self._unknown_attribute(m.group(1), m.group(2))
        if m := RE_MISSING_ATTR.match(msg):
            name, attr = m.group(1), m.group(2)
            return f'<{name}> needs the "{attr}" attribute{self.attr_hints.get((name, attr), "")}'
        if m := RE_ENUM.match(msg):
            value, attr, name = m.group(1), m.group(2), m.group(3)
            values = self.enums.get((name, attr), [])
            want = ", ".join(f'"{v}"' for v in values) or "another value"
            return f'invalid {attr}="{value}" on <{name}>: expected one of {want}'
        return f"{msg} (DTD validation)"

    def special(self, msg: str, line: int, tree: etree._ElementTree):
        """A subclass's own wording for a message, or ``_NOT_SPECIAL``."""
        return _NOT_SPECIAL

    def content_error(self, name: str, got: str, els: list[etree._Element]) -> str:
        """Why the children of ``<name>`` (the elements ``els`` on that line) are wrong;
        ``got`` is libxml2's list of what it found."""
        return f"<{name}> must contain {self.content.get(name, 'other content')}; found {_got(got)}"

    def empty_example(self, name: str) -> str:
        attrs = " ".join(f'{a}=".."' for a in self.attrs.get(name, ()))
        return f"<{name} {attrs}/>" if attrs else f"<{name}/>"

    def _unknown_element(self, name: str, line: int, tree: etree._ElementTree) -> str:
        els = elements_at(tree, name, line)
        parent = els[0].getparent() if els else None
        local = local_name(els[0]) if els else name
        shown = f"{els[0].prefix}:{local}" if els and els[0].prefix else name
        text = f"unknown element <{shown}>"
        if parent is None or not isinstance(parent.tag, str):
            return text
        p = local_name(parent)
        text += f" in <{p}>"
        hint = self.element_hints.get(local)
        if hint:
            return f"{text}: {hint}"
        if self.suggest:
            guess = did_you_mean(local, self.children.get(p) or self.known)
            if guess:
                return f"{text}: {guess}"
        if p in self.content:
            return f"{text}, which may contain {self.content[p]}"
        decl = self.decls.get(p)
        if decl is not None and decl.type == "empty":
            return f"{text}, which must be empty"
        if decl is not None:
            return f"{text}, which takes only text"
        return text

    def _unknown_attribute(self, attr: str, name: str) -> str | None:
        if attr == "xmlns" or attr.startswith("xmlns:"):
            return f"XML namespace declaration {attr} on <{name}>: {self.name} files use no namespaces"
        if name not in self.known:
            return None  # the unknown element is reported
        text = f'unknown attribute "{attr}" on <{name}>'
        if (name, attr) in self.attr_as_child:
            return f"{text}: {self.attr_as_child[name, attr]}"
        allowed = self.attrs.get(name)
        where = f"allowed: {', '.join(allowed)}" if allowed else "it takes no attributes"
        guess = did_you_mean(attr, allowed or (), '"{}"') if self.suggest else ""
        return f"{text} ({where}){': ' + guess if guess else ''}"


_NOT_SPECIAL = object()


def _got(text: str) -> str:
    items = text.strip().strip("()").split()
    if not items:
        return "nothing"
    return ", ".join("text" if i in ("CDATA", "#PCDATA") else f"<{i}>" for i in items)
