"""`within` and `PathsWithin`: the bypasses of a directory allow-list, each tried."""

from __future__ import annotations

import os
import stat
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from interceptor_core import ConfigurationError, Deny, Gate, tool
from interceptor_core.builtins import PathsWithin, within
from interceptor_core.decisions import Allow
from interceptor_core.testing import check_before, make_call


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A real directory tree: root/data (allowed) holding a file, root/precious.txt outside it."""
    root = Path(os.path.realpath(tmp_path))
    (root / "data" / "sub").mkdir(parents=True)
    (root / "data" / "notes.txt").write_text("ok")
    (root / "database").mkdir()
    (root / "precious.txt").write_text("secret")
    return root


class TestWithin:
    def test_a_path_below_the_root_is_inside(self, tree: Path) -> None:
        """A file in the root, a subdirectory and the root itself are all inside."""
        data = str(tree / "data")
        assert within(f"{data}/notes.txt", [data])
        assert within(f"{data}/sub", [data])
        assert within(data, [data])

    def test_a_path_that_does_not_exist_yet_is_judged_by_its_name(self, tree: Path) -> None:
        """A file the tool would create is inside when its name resolves inside."""
        data = str(tree / "data")
        assert within(f"{data}/new/deeper/file.txt", [data])
        assert not within(f"{data}/new/../../precious.txt", [data])

    def test_dot_slash_relative_to_an_outside_base_is_outside(self, tree: Path) -> None:
        """`./precious.txt` from the parent of the root is the protected file: outside."""
        assert not within("./precious.txt", [str(tree / "data")], base=str(tree))

    def test_dot_slash_relative_to_an_inside_base_is_inside(self, tree: Path) -> None:
        """The same relative path from a base inside the root is inside."""
        assert within("./precious.txt", [str(tree / "data")], base=str(tree / "data"))

    def test_dot_dot_back_out_is_outside(self, tree: Path) -> None:
        """`sub/../precious.txt` from the parent resolves to the protected file."""
        assert not within("sub/../precious.txt", [str(tree / "data")], base=str(tree))
        assert within("sub/../notes.txt", [str(tree / "data")], base=str(tree / "data"))

    def test_the_absolute_form_of_a_protected_path_is_outside(self, tree: Path) -> None:
        """An absolute path ignores the base: the protected file by its full name is outside."""
        assert not within(str(tree / "precious.txt"), [str(tree / "data")], base=str(tree / "data"))

    def test_climbing_out_of_the_root_is_outside(self, tree: Path) -> None:
        """`<root>/../precious.txt` starts inside and ends outside."""
        data = str(tree / "data")
        assert not within(f"{data}/../precious.txt", [data])
        assert not within("../precious.txt", [data], base=data)

    def test_repeated_leading_slashes_are_the_file_system_root(self) -> None:
        """`//etc/passwd` is /etc/passwd: outside /data, inside /etc."""
        assert not within("//etc/passwd", ["/data"])
        assert within("//etc/passwd", ["/etc"])
        assert within("/etc//./passwd", ["/etc"])

    def test_a_root_does_not_hold_a_sibling_sharing_its_prefix(self, tree: Path) -> None:
        """Root /x/data holds /x/data/f, never /x/database or /x/database/f."""
        data = str(tree / "data")
        assert not within(str(tree / "database"), [data])
        assert not within(str(tree / "database" / "f"), [data])
        assert not within("/database", ["/data"])

    def test_a_symlink_inside_the_root_pointing_outside_is_outside(self, tree: Path) -> None:
        """A link planted in the root is followed: its target decides."""
        (tree / "data" / "escape").symlink_to(tree / "precious.txt")
        (tree / "data" / "up").symlink_to(tree)
        data = str(tree / "data")
        assert not within(f"{data}/escape", [data])
        assert not within(f"{data}/up/precious.txt", [data])
        assert not within("escape", [data], base=data)

    def test_a_symlink_inside_the_root_pointing_inside_is_inside(self, tree: Path) -> None:
        """A link that stays in the root is fine."""
        (tree / "data" / "alias").symlink_to(tree / "data" / "notes.txt")
        assert within(str(tree / "data" / "alias"), [str(tree / "data")])

    def test_dot_dot_after_a_symlink_follows_the_link_as_the_kernel_does(self, tree: Path) -> None:
        """`link/..` is the parent of the link's target, not the directory holding the link."""
        outside = tree / "elsewhere" / "deep"
        outside.mkdir(parents=True)
        (tree / "data" / "jump").symlink_to(outside)
        data = str(tree / "data")
        # Lexically data/jump/../notes.txt is data/notes.txt; the kernel opens elsewhere/notes.txt.
        assert not within(f"{data}/jump/../notes.txt", [data])

    def test_dot_dot_after_a_symlink_must_be_inside_read_either_way(self, tree: Path) -> None:
        """`deep/../../precious.txt`, deep a link to data/sub/deeper: the kernel stays in data, a tool that
        normalizes the name first (os.path.abspath, Node's path.resolve) opens the protected file."""
        (tree / "data" / "sub" / "deeper").mkdir()
        (tree / "data" / "deep").symlink_to(tree / "data" / "sub" / "deeper")
        data = str(tree / "data")
        assert not within("deep/../../precious.txt", [data], base=data)
        assert not within(f"{data}/deep/../../precious.txt", [data])
        assert within("deep/../notes.txt", [data], base=data)
        assert within("sub/../notes.txt", [data], base=data)

    def test_a_root_that_is_a_symlink_is_compared_by_its_target(self, tree: Path) -> None:
        """A root given through a link holds what its target holds, and paths named either way."""
        (tree / "link-to-data").symlink_to(tree / "data")
        link = str(tree / "link-to-data")
        assert within(str(tree / "data" / "notes.txt"), [link])
        assert within(f"{link}/notes.txt", [link])
        assert within(f"{link}/notes.txt", [str(tree / "data")])
        assert not within(str(tree / "precious.txt"), [link])

    def test_every_path_of_a_list_must_be_inside(self, tree: Path) -> None:
        """One bad path in a list makes the list outside; an empty list names no path."""
        data = str(tree / "data")
        assert within([f"{data}/a", f"{data}/b"], [data])
        assert not within([f"{data}/a", f"{data}/../precious.txt"], [data])
        assert not within((f"{data}/a", str(tree / "precious.txt")), [data])
        assert within([], [data])

    def test_trailing_slashes_do_not_matter(self, tree: Path) -> None:
        """A root or a path written with a trailing slash means the same directory."""
        data = str(tree / "data")
        assert within(f"{data}/sub/", [f"{data}/"])
        assert within(f"{data}/", [data])
        assert not within(f"{tree}/database/", [f"{data}/"])

    def test_the_empty_string_is_the_base(self, tree: Path) -> None:
        """An empty path names the base: inside only when the base is."""
        data = str(tree / "data")
        assert within("", [data], base=data)
        assert within("", [data], base=f"{data}/sub")
        assert not within("", [data], base=str(tree))

    def test_relative_paths_and_roots_default_to_the_current_directory(
        self, tree: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without a base, the current directory is where relative paths and roots start."""
        monkeypatch.chdir(tree)
        assert within("data/notes.txt", ["data"])
        assert not within("precious.txt", ["data"])
        assert within("precious.txt", ["."])

    def test_a_relative_base_starts_at_the_current_directory(self, tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A relative base is itself joined to the current directory."""
        monkeypatch.chdir(tree)
        assert within("notes.txt", [str(tree / "data")], base="data")
        assert not within("../precious.txt", [str(tree / "data")], base="data")

    @pytest.mark.parametrize("path", ["~", "~/x", "~root/x", "~/../data/notes.txt"])
    def test_a_leading_tilde_is_refused(self, tree: Path, path: str) -> None:
        """`~/x` is a directory called ~ to open(), the home directory to a shell, `expanduser` and MCP's
        filesystem server: refused even where both readings would be inside."""
        data = str(tree / "data")
        assert not within(path, [data], base=data)
        assert not within(path, [data, os.path.expanduser("~")], base=data)

    def test_a_tilde_past_the_start_is_an_ordinary_name(self, tree: Path) -> None:
        """Only a leading `~` is expanded by anyone: `data/~/x` is a directory called ~."""
        data = str(tree / "data")
        assert within(f"{data}/~/x", [data])
        assert within("./~", [data], base=data)

    @pytest.mark.parametrize(
        "path",
        [
            "{data}/..\\..\\precious.txt",
            "{data}\\notes.txt",
            "{data}/\uff0e\uff0e\uff0fprecious.txt",
            "{data}/..\uff0fprecious.txt",
            "{data}/\u2025/precious.txt",
            "{data}/x\u2215..\u2215..\u2215precious.txt",
            "{data}/x\u2044y",
            "{data}/\uff3c",
            "{data}/\u2100",
        ],
    )
    def test_backslashes_and_look_alike_separators_are_refused(self, tree: Path, path: str) -> None:
        """To POSIX they are ordinary names inside the root; to Windows, NFKC-normalizing tools or a
        reader of confusables some are '..' and '/'. Each is refused."""
        data = str(tree / "data")
        assert not within(path.format(data=data), [data])

    @pytest.mark.parametrize(
        "path",
        [
            " /etc/passwd",
            "\t../precious.txt",
            "..\u3000",
            "../precious.txt\n",
            "'/etc/passwd'",
            '"../precious.txt"',
            "'../precious.txt",
            "C:/Windows/win.ini",
            "c:..",
            "file:///etc/passwd",
            "FILE:../precious.txt",
        ],
    )
    def test_blanks_or_quotes_at_an_end_a_drive_or_a_file_uri_are_refused(self, tree: Path, path: str) -> None:
        """Each is a name inside the base to POSIX; trimmed (MCP's filesystem server, `str.strip()`), on
        Windows or to a tool taking URIs it leaves the root. Refused, and the empty path still is the base."""
        data = str(tree / "data")
        assert not within(path, [data], base=data)
        assert within("", [data], base=data)
        assert within("a b/'q'.txt", [data], base=data)

    def test_every_character_nfkc_turns_into_a_separator_or_dots_is_refused(self, tree: Path) -> None:
        """The look-alike list is complete against this Python's Unicode database."""
        data = str(tree / "data")
        turned = [
            character
            for character in map(chr, range(0x80, 0x110000))
            if not 0xD800 <= ord(character) <= 0xDFFF
            and ((normal := unicodedata.normalize("NFKC", character)) in (".", "..") or "/" in normal or "\\" in normal)
        ]
        assert len(turned) >= 12
        assert [c for c in turned if within(f"{data}/a{c}b", [data])] == []

    @pytest.mark.parametrize("path", ["{data}/a\0b", "{data}/a\ud800", "{data}/\udcff", "\0", "{data}/x\0/../../etc"])
    def test_a_nul_or_a_lone_surrogate_is_refused(self, tree: Path, path: str) -> None:
        """Both are refused wherever they stand (the system call would stop at the NUL; a surrogate is no
        text), in a str and in a list."""
        data = str(tree / "data")
        assert not within(path.format(data=data), [data])
        assert not within([f"{data}/notes.txt", path.format(data=data)], [data])

    def test_values_that_are_not_paths_are_outside(self, tree: Path) -> None:
        """NUL bytes, bytes, None, numbers and nested lists are never inside, and never raise."""
        data = str(tree / "data")
        for value in (f"{data}/a\0b", f"{data}/x".encode(), None, 42, [[f"{data}/a"]], [f"{data}/a", None]):
            assert not within(value, [data])

    def test_long_paths_are_judged_whole(self, tree: Path) -> None:
        """Thousands of components, in or out, and a name longer than the system allows."""
        data = str(tree / "data")
        assert within(f"{data}/" + "a/" * 5000 + "b", [data])
        assert not within(f"{data}/" + "a/" * 5000 + "../" * 5001 + "precious.txt", [data])
        assert within(f"{data}/" + "n" * 10_000, [data])
        assert not within(f"{data}/" + "n" * 10_000 + "/../../precious.txt", [data])

    def test_path_objects_are_paths(self, tree: Path) -> None:
        """An `os.PathLike` of str is judged as its text."""
        assert within(tree / "data" / "notes.txt", [tree / "data"])
        assert not within(tree / "precious.txt", tree / "data")

    def test_one_root_may_be_given_alone(self, tree: Path) -> None:
        """A single root as a string is one root, not a sequence of characters."""
        assert within(str(tree / "data" / "x"), str(tree / "data"))

    def test_several_roots_each_allow(self, tree: Path) -> None:
        """A path inside any of the roots is inside."""
        roots = [str(tree / "data"), str(tree / "database")]
        assert within(str(tree / "database" / "f"), roots)
        assert not within(str(tree / "precious.txt"), roots)

    @pytest.mark.parametrize(
        ("roots", "error"),
        [
            ([], ValueError),
            ([""], ValueError),
            (["/a\0"], ValueError),
            (["/a\udcff"], ValueError),
            (["~/data"], ValueError),
            ([42], TypeError),
            (42, TypeError),
        ],
    )
    def test_bad_roots_raise(self, roots: Any, error: type[Exception]) -> None:
        """No roots, an empty root, a NUL byte, a lone surrogate, a `~` that would never be expanded or a
        root that is not a path is the author's mistake."""
        with pytest.raises(error):
            within("/data/x", roots)

    def test_a_bad_base_raises(self) -> None:
        """A base that is not a path, or holds a NUL byte, raises."""
        with pytest.raises(TypeError):
            within("x", ["/data"], base=42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="NUL"):
            within("x", ["/data"], base="/da\0ta")


@pytest.fixture(scope="module")
def property_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real, symlink-free directory for the property (module-scoped: hypothesis runs it many times)."""
    return os.path.realpath(tmp_path_factory.mktemp("within-property"))


segments = st.lists(
    st.one_of(st.just(".."), st.just("."), st.text(alphabet="abcxyz_-", min_size=1, max_size=4)),
    max_size=8,
)


class TestWithinProperty:
    @given(parts=segments, slashes=st.sampled_from(["/", "//"]))
    def test_relative_paths_agree_with_lexical_normalization(
        self, property_root: str, parts: list[str], slashes: str
    ) -> None:
        """For paths of plain names and `..` that do not exist, within agrees with normpath."""
        path = slashes.join(parts)
        joined = os.path.normpath(os.path.join(property_root, path))
        expected = joined == property_root or joined.startswith(property_root + os.sep)
        assert within(path, [property_root], base=property_root) == expected


@pytest.fixture(scope="module")
def linked_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, frozenset[tuple[int, int]]]:
    """{root}/data (the root) with a file, a subdirectory, links out (to a file and to {root}) and a
    link in; and the (device, inode) of everything inside data that is not a link."""
    root = Path(os.path.realpath(tmp_path_factory.mktemp("within-kernel")))
    data = root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "notes.txt").write_text("ok")
    (root / "precious.txt").write_text("secret")
    (data / "escape").symlink_to(root / "precious.txt")
    (data / "up").symlink_to(root)
    (data / "alias").symlink_to(data / "notes.txt")
    inside = {(data.stat().st_dev, data.stat().st_ino)}
    for directory, names, files in os.walk(data):
        for name in names + files:
            entry = os.lstat(os.path.join(directory, name))
            if not stat.S_ISLNK(entry.st_mode):
                inside.add((entry.st_dev, entry.st_ino))
    return str(root), frozenset(inside)


PATH_PIECES = [
    *("data", "sub", "notes.txt", "escape", "up", "alias", "precious.txt", "new", "..", ".", "", "~"),
    *("\\", "\uff0f", "\uff0e\uff0e", "\u2215", "\0", "\ud800", "\udcff", "\u200b", "\n", " ", "a" * 300),
]
ADVERSARIAL_PATHS = st.lists(
    st.one_of(
        st.sampled_from(PATH_PIECES),
        st.characters(categories=["Cc", "Cf", "Cs", "Zs"]),
        st.text(max_size=6),
    ),
    max_size=10,
)


def _routes(path: Any, root: str, base: str) -> tuple[bool, bool]:
    """(plain function says inside, interceptor lets it through)."""
    decision = PathsWithin("path", [root], base=base).before_tool_call(make_call(any_reader, {"path": path}))
    return within(path, [root], base=base), decision is None


@tool
def any_reader(path: Any) -> str:
    """Reads whatever it is given (the property tests send values no str field would accept)."""
    return ""


class TestWithinProperties:
    # No deadline: the machine's load, not the check, sets how long one example takes.
    @settings(deadline=None, max_examples=300)
    @given(parts=ADVERSARIAL_PATHS, absolute=st.booleans())
    def test_an_admitted_path_is_one_the_kernel_resolves_inside(
        self, linked_tree: tuple[str, frozenset[tuple[int, int]]], parts: list[str], absolute: bool
    ) -> None:
        """Whatever the pieces: both Python routes agree; what they admit holds no NUL, surrogate,
        backslash, look-alike or leading `~`; and the file the kernel opens for it (or the directory it
        would create it in) is one inside the root, links followed."""
        root, inside = linked_tree
        data = f"{root}/data"
        path = "/".join(parts)
        path = f"{data}/{path}" if absolute else path
        admitted, let_through = _routes(path, data, data)
        assert admitted is let_through
        if not admitted:
            return
        assert not any(character in path for character in "\0\\\uff0f\uff0e\u2215")
        assert not any("\ud800" <= character <= "\udfff" for character in path)
        assert not path.startswith("~")
        full = os.path.join(data, path)
        for candidate in (full, os.path.dirname(full)):
            try:
                found = os.stat(candidate)
            except (OSError, ValueError):
                continue  # not there (or not a directory): the kernel would open nothing here
            assert (found.st_dev, found.st_ino) in inside, path
            break

    @settings(deadline=None)
    @given(prefix=st.sampled_from(["{data}/", "{root}/", "", "~/"]), text=st.text(max_size=20))
    def test_a_nul_or_a_lone_surrogate_anywhere_is_refused(
        self, linked_tree: tuple[str, frozenset[tuple[int, int]]], prefix: str, text: str
    ) -> None:
        """A NUL or a surrogate added anywhere to any path refuses it, alone and in a list."""
        root, _ = linked_tree
        data = f"{root}/data"
        path = prefix.format(root=root, data=data) + text
        for odd in ("\0", "\ud800", "\udfff"):
            for at in (0, len(path) // 2, len(path)):
                bad = path[:at] + odd + path[at:]
                assert _routes(bad, data, data) == (False, False)
                assert not within([f"{data}/notes.txt", bad], [data], base=data)


def reader(seen: list[str]) -> Any:
    @tool
    def read_file(path: str, encoding: str = "utf-8") -> str:
        """Reads a file."""
        seen.append(path)
        return "contents"

    return read_file


class TestPathsWithin:
    async def test_through_a_gate_a_path_outside_is_denied_before_the_tool_runs(self, tree: Path) -> None:
        """The gate refuses `../precious.txt` with a message naming tool, argument, value and roots."""
        seen: list[str] = []
        data = str(tree / "data")
        desk = Gate("g", interceptors=[PathsWithin("path", [data], base=data)]).agent("a", tools=[reader(seen)])
        denied = await desk.call("read_file", {"path": "../precious.txt"})
        assert denied.kind == "denied"
        assert seen == []
        message = denied.message or ""
        assert "read_file" in message
        assert "'path'" in message
        assert "../precious.txt" in message
        assert data in message
        allowed = await desk.call("read_file", {"path": "notes.txt"})
        assert allowed.kind == "ok"
        assert seen == ["notes.txt"]

    @pytest.mark.parametrize(
        ("path", "reason"),
        [
            ("notes.txt\0/../../precious.txt", "holds a NUL byte, where the operating system would end the path"),
            ("notes\udcff", "holds a lone surrogate (U+DCFF)"),
            ("~/notes.txt", "starts with '~', which shells and many tools read as a home directory"),
            ("..\\precious.txt", "holds a backslash, a separator to Windows and to some tools"),
            ("\uff0e\uff0e/precious.txt", "holds U+FF0E (fullwidth full stop), which some tools turn into"),
            (" /etc/passwd", "starts or ends with a blank (a space, tab or line break), which many tools strip"),
            ("'/etc/passwd'", "starts or ends with a quote, which some tools strip"),
            ("C:/Windows/win.ini", "starts with a drive letter or 'file:', a root of its own to Windows"),
        ],
    )
    async def test_a_path_tools_read_differently_is_denied_with_what_to_write(
        self, tree: Path, path: str, reason: str
    ) -> None:
        """The denial says what makes the path ambiguous and what to send instead."""
        data = str(tree / "data")
        decision = await check_before(PathsWithin("path", [data], base=data), any_reader, {"path": path})
        assert isinstance(decision, Deny)
        assert reason in decision.message
        assert f"This tool may use paths inside {data!r}" in decision.message

    async def test_dot_dot_after_a_symlink_is_denied_with_what_to_write(self, tree: Path) -> None:
        """Inside to the kernel, outside once normalized: the denial says to write the path without '..'."""
        (tree / "data" / "sub" / "deeper").mkdir()
        (tree / "data" / "deep").symlink_to(tree / "data" / "sub" / "deeper")
        data = str(tree / "data")
        path = "deep/../../precious.txt"
        decision = await check_before(PathsWithin("path", [data], base=data), any_reader, {"path": path})
        assert isinstance(decision, Deny)
        assert "holds '..' after a symbolic link" in decision.message
        assert "Write it without '..'." in decision.message

    async def test_only_matching_tools_are_checked(self, tree: Path) -> None:
        """A tool outside the `tools` globs is not checked; a matching one is."""
        check = PathsWithin("path", [str(tree / "data")], tools=["write_*", "read_f?le"])
        outside = {"path": str(tree / "precious.txt")}
        assert isinstance(await check_before(check, reader([]), outside), Deny)
        other = PathsWithin("path", [str(tree / "data")], tools="write_*")
        assert await check_before(other, reader([]), outside) == Allow()

    async def test_fields_the_tool_lacks_or_leaves_empty_are_skipped(self, tree: Path) -> None:
        """A named argument the tool does not have, or one that is None, is not a path to check."""

        @tool
        def listing(directory: str | None = None) -> str:
            """Lists a directory."""
            return ""

        check = PathsWithin(["path", "directory"], [str(tree / "data")])
        assert await check_before(check, listing, {}) == Allow()
        assert await check_before(check, listing, {"directory": str(tree / "data")}) == Allow()
        assert isinstance(await check_before(check, listing, {"directory": str(tree)}), Deny)

    async def test_a_list_argument_is_checked_path_by_path(self, tree: Path) -> None:
        """The denial quotes the one path of a list that is outside."""

        @tool
        def bundle(paths: list[str]) -> str:
            """Zips files."""
            return ""

        data = str(tree / "data")
        check = PathsWithin("paths", [data])
        decision = await check_before(check, bundle, {"paths": [f"{data}/a", "/etc/shadow"]})
        assert isinstance(decision, Deny)
        assert "'/etc/shadow'" in decision.message
        assert f"{data}/a" not in decision.message
        assert await check_before(check, bundle, {"paths": [f"{data}/a", f"{data}/b"]}) == Allow()

    async def test_a_symlink_created_after_construction_is_seen(self, tree: Path) -> None:
        """Paths are resolved on each call, so a link planted later is followed."""
        data = str(tree / "data")
        check = PathsWithin("path", [data])
        args = {"path": f"{data}/later"}
        assert await check_before(check, reader([]), args) == Allow()
        (tree / "data" / "later").symlink_to(tree / "precious.txt")
        assert isinstance(await check_before(check, reader([]), args), Deny)

    @pytest.mark.parametrize(
        ("kwargs", "culprit"),
        [
            ({"fields": [], "roots": ["/data"]}, "fields"),
            ({"fields": [""], "roots": ["/data"]}, "argument name"),
            ({"fields": "path", "roots": []}, "roots"),
            ({"fields": "path", "roots": [3]}, "root"),
            ({"fields": "path", "roots": ["/data"], "tools": []}, "tools"),
            ({"fields": "path", "roots": ["/data"], "tools": [""]}, "glob"),
            ({"fields": "path", "roots": ["/data"], "name": ""}, "name"),
            ({"fields": "path", "roots": ["/data"], "mandatory": "yes"}, "mandatory"),
            ({"fields": "path", "roots": ["/data"], "base": "/a\0"}, "base"),
        ],
    )
    def test_bad_configuration_is_refused_when_built(self, kwargs: dict[str, Any], culprit: str) -> None:
        """Each bad argument raises ConfigurationError naming it."""
        with pytest.raises(ConfigurationError, match=culprit):
            PathsWithin(**kwargs)

    def test_name_and_mandatory_are_what_the_gate_reads(self) -> None:
        """The defaults, and both overridable."""
        assert (PathsWithin("p", "/d").name, PathsWithin("p", "/d").mandatory) == ("paths-within", False)
        custom = PathsWithin("p", "/d", name="sandbox", mandatory=True)
        assert (custom.name, custom.mandatory) == ("sandbox", True)
