"""Does a path stay inside allowed directories? `within` answers; `PathsWithin` denies calls that leave.

A path is judged where the operating system would take it: joined to a base directory when
relative, then resolved by `os.path.realpath`, which follows every symlink that exists and
normalizes `.`, `..` and repeated separators. A root is resolved the same way, so a root that is
itself a symlink is compared by its target. A path holding `..` must also be inside when its `..`
are taken off the name before links are followed, as `os.path.abspath`, Node's `path.resolve` and
MCP's filesystem server do: after a link the two readings part (`link/../..`).

A path that tools read differently is refused before it is resolved: a NUL byte (the system call
ends the path there), a lone surrogate (no text; CEL cannot hold it either), a leading `~` (shells,
`os.path.expanduser` and file servers such as MCP's filesystem server read it as a home
directory), blanks or quotes at either end (tools trim them: MCP's filesystem server, `str.strip()`,
shells), a drive letter (`C:`) or a `file:` URI where `/` is the separator (a root of its own to
Windows and to tools that take URIs), a backslash there (a separator to Windows and to tools that
normalize it), and look-alikes of `/`, `\\` and `.` that Unicode normalization (NFKC) turns into
them or that Unicode lists as confusable with them (`／`, `＼`, `．`, `∕`, ...).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Sequence
from typing import Any, TypeAlias

from interceptor_core.builtins._config import check_identity, each_value, field_names, shown, tool_matcher
from interceptor_core.context import ToolCall
from interceptor_core.decisions import Deny
from interceptor_core.exceptions import ConfigurationError

__all__ = ["PathsWithin", "within"]

_LOOKALIKES = (
    # Every character whose NFKC form holds '/' or '\\' or is '.' or '..' (a test checks this
    # against the Unicode database), then the confusables of '/' and '\\' NFKC leaves alone.
    "\u2024\u2025\u2100\u2101\u2105\u2106\ufe30\ufe52\ufe68\uff0e\uff0f\uff3c\u2044\u2215\u2216\u29f5\u29f8"
)
_READ_DIFFERENTLY = _LOOKALIKES + ("\\" if os.sep == "/" else "")
_UNREADABLE = re.compile("[\0\ud800-\udfff" + re.escape(_READ_DIFFERENTLY) + "]")
_QUOTES = "'\""
_ROOTED_ELSEWHERE = re.compile(r"[A-Za-z]:|file:", re.IGNORECASE) if os.sep == "/" else None
# "C:/x" and "file:///etc/x" are relative names here, but a drive or a URI to Windows and to tools
# that take URIs (the path may be used on another machine than the one checking it).

Roots: TypeAlias = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""One root directory, or a sequence of them."""


def within(path: Any, roots: Roots, *, base: str | os.PathLike[str] | None = None) -> bool:
    """True when `path` (a str, or every path of a list or tuple) stays inside one of `roots`.

    Inside means the resolved path equals a resolved root or lies below it: root `/data` holds
    `/data` and `/data/x`, never `/database`. A relative path or root is joined to `base` (default:
    the current directory when called), so the empty string stands for `base` itself. Resolving
    follows the symlinks that exist (a link inside a root that points outside is outside) and is
    lexical past the first component that does not exist. An empty list is inside (it names no path).

    Never raises for `path`, which is the model's: anything but a str or `os.PathLike` of str (bytes,
    None, a number, a nested list), and a path tools read differently (see this module's docstring:
    a NUL byte, a lone surrogate, a leading `~`, blanks or quotes at either end, a drive letter or
    `file:`, a backslash, a look-alike of `/`, `\\` or `.`) is False. Raises `TypeError` or
    `ValueError` for a bad `roots` or `base`: no roots, a root that is not a str or path, an empty
    root, a NUL byte or lone surrogate, a root starting with `~` (never expanded). Calls
    `os.path.realpath` (file-system metadata reads); blocks on them.

    The answer holds when it is given: a symlink created between the check and the tool's own use of
    the path is not seen. A tool working in a tree others can write should open with `O_NOFOLLOW`
    or resolve again.
    """
    checked = _checked_roots(roots)
    start = _checked_base(base)
    resolved = _resolved_roots(checked, start)
    if resolved is None:
        return False
    if isinstance(path, list | tuple):
        return all(_one_within(item, resolved, start) for item in path)
    return _one_within(path, resolved, start)


class PathsWithin:
    """Denies a call whose path arguments leave the allowed directories (see `within`).

    `fields` names the arguments holding paths (one name or several); an argument the tool does not
    have is skipped, and so is one whose value is None (no path given). A list or tuple value is
    checked path by path. `tools` restricts the check to the tools matching one of its globs
    (`fnmatch.fnmatchcase`; None: every tool). Roots and `base` are checked here and resolved again
    on each call, so a root's symlink is followed as it is then. The denial names the tool, the
    argument, the offending value and the allowed roots.

    Sync; blocks on `os.path.realpath`. Safe from several threads (it holds no mutable state).
    `ConfigurationError` names a bad argument.
    """

    def __init__(
        self,
        fields: str | Sequence[str],
        roots: Roots,
        *,
        tools: str | Sequence[str] | None = None,
        name: str = "paths-within",
        mandatory: bool = False,
        base: str | os.PathLike[str] | None = None,
    ) -> None:
        self.name = check_identity(name, mandatory)
        self.mandatory = mandatory
        self.fields = field_names(fields, interceptor=name)
        try:
            self.roots = _checked_roots(roots)
            self._base = _checked_base(base)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(str(exc), interceptor=name) from None
        self._applies = tool_matcher(tools, interceptor=name)

    def before_tool_call(self, call: ToolCall) -> Deny | None:
        """Deny the call when a named argument holds a path outside every root; None (allow) otherwise."""
        tool = call.tool_name
        if not self._applies(tool):
            return None
        args = call.args
        present = [field for field in self.fields if field in args]
        if not present:
            return None
        roots = _resolved_roots(self.roots, self._base)
        for field in present:
            for value in each_value(args[field]):
                reason = _unreadable(value)
                if reason is not None:
                    return Deny(
                        f"{tool}: argument {field!r} is {shown(value)}, which {reason}. This tool may use paths "
                        f"inside {', '.join(map(repr, self.roots))}."
                    )
                if roots is None or not _one_within(value, roots, self._base):
                    allowed = ", ".join(map(repr, self.roots))
                    if roots is not None and isinstance(value, str) and _inside(_resolve(value, self._base), roots):
                        return Deny(
                            f"{tool}: argument {field!r} is {shown(value)}, which holds '..' after a symbolic link: "
                            "the kernel takes it to the parent of the link's target, tools that normalize the path "
                            f"first outside the directories this tool may use ({allowed}). Write it without '..'."
                        )
                    return Deny(
                        f"{tool}: argument {field!r} is {shown(value)}, which is outside the directories "
                        f"this tool may use ({allowed}). Use a path inside one of them."
                    )
        return None

    def __repr__(self) -> str:
        return f"PathsWithin({self.fields!r}, {self.roots!r}, name={self.name!r})"


def _checked_roots(roots: Roots) -> tuple[str, ...]:
    given = (roots,) if isinstance(roots, str | os.PathLike) else roots
    if not isinstance(given, Sequence):
        raise TypeError(f"roots must be a directory or a sequence of directories, got {roots!r}")
    if not given:
        raise ValueError("roots is empty: no path could be inside")
    checked = []
    for root in given:
        text = os.fspath(root) if isinstance(root, os.PathLike) else root
        if not isinstance(text, str):
            raise TypeError(f"a root must be a str or an os.PathLike of str, got {root!r}")
        if not text:
            raise ValueError("a root is the empty string; write the directory (for the base, '.')")
        _check_text("root", text)
        if text.startswith("~"):
            raise ValueError(f"root {text!r} starts with '~', which is not expanded: write the directory in full")
        checked.append(text)
    return tuple(checked)


def _checked_base(base: str | os.PathLike[str] | None) -> str | None:
    if base is None:
        return None
    text = os.fspath(base) if isinstance(base, os.PathLike) else base
    if not isinstance(text, str):
        raise TypeError(f"base must be a str or an os.PathLike of str, got {base!r}")
    _check_text("base", text)
    return text


def _check_text(what: str, text: str) -> None:
    if "\0" in text:
        raise ValueError(f"{what} {text!r} holds a NUL byte")
    if any("\ud800" <= character <= "\udfff" for character in text):
        raise ValueError(f"{what} {text!r} holds a lone surrogate")


def _resolved_roots(roots: tuple[str, ...], base: str | None) -> tuple[str, ...] | None:
    """Each root resolved against `base`; None when one cannot be (the current directory is gone)."""
    resolved = []
    for root in roots:
        path = _resolve(root, base)
        if path is None:
            return None
        resolved.append(path)
    return tuple(resolved)


def _resolve(path: str, base: str | None, *, lexical: bool = False) -> str | None:
    """`path` joined to `base` and resolved as the kernel does; with `lexical`, its `..` taken off the
    name first (`os.path.abspath`, Node's `path.resolve`, MCP's filesystem server), then links followed."""
    try:
        # os.path.join drops the base before an absolute path; realpath makes a relative base absolute.
        joined = os.path.join(os.getcwd() if base is None else base, path)
        return os.path.normcase(os.path.realpath(os.path.abspath(joined) if lexical else joined))
    except (OSError, ValueError):
        return None


def _inside(resolved: str | None, roots: tuple[str, ...]) -> bool:
    if resolved is None:
        return False
    for root in roots:
        if resolved == root or resolved.startswith(root if root.endswith(os.sep) else root + os.sep):
            return True
    return False


def _unreadable(path: object) -> str | None:
    """Why tools would read `path` differently, completing "..., which ..."; None when they would not."""
    if not isinstance(path, str):
        return None  # not a path at all: _one_within refuses it
    found = _UNREADABLE.search(path)
    if found is not None:
        character = found.group()
        if character == "\0":
            return "holds a NUL byte, where the operating system would end the path: remove it"
        if "\ud800" <= character <= "\udfff":
            return f"holds a lone surrogate (U+{ord(character):04X}), which is no text: send the path as valid Unicode"
        if character == "\\":
            return "holds a backslash, a separator to Windows and to some tools: write '/' between directories"
        return (
            f"holds U+{ord(character):04X} ({unicodedata.name(character).lower()}), which some tools turn into "
            "'/', '\\' or '.': write the ASCII character"
        )
    if path.startswith("~"):
        return "starts with '~', which shells and many tools read as a home directory: write the path in full"
    if path != path.strip():
        return "starts or ends with a blank (a space, tab or line break), which many tools strip: remove it"
    if path and (path[0] in _QUOTES or path[-1] in _QUOTES):
        return "starts or ends with a quote, which some tools strip: send the path without quotes"
    if _ROOTED_ELSEWHERE is not None and _ROOTED_ELSEWHERE.match(path):
        return (
            "starts with a drive letter or 'file:', a root of its own to Windows and to tools taking URIs: "
            "write the path as this system does"
        )
    return None


def _one_within(path: object, roots: tuple[str, ...], base: str | None) -> bool:
    if isinstance(path, os.PathLike):
        try:
            path = os.fspath(path)
        except Exception:
            return False  # a broken __fspath__ names no path
    if not isinstance(path, str) or _unreadable(path) is not None:
        return False
    if not _inside(_resolve(path, base), roots):
        return False
    # After a link, `..` is the parent of the link's target to the kernel and the directory holding
    # the link to a tool that normalizes the name first: both readings must be inside.
    return ".." not in path.split(os.sep) or _inside(_resolve(path, base, lexical=True), roots)
