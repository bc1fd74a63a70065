"""Ed25519 keys, C2SP signed notes and tlog checkpoints (events.signing), checked against the published
examples of c2sp.org and golang.org/x/mod/sumdb/note and against Node.js's own Ed25519."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from events.errors import EventError
from events.signing import (
    CheckpointBody,
    NoteSignature,
    SigningError,
    SigningKey,
    VerifyingKey,
    checkpoint_body,
    load_trusted_keys,
    open_signed_note,
    parse_checkpoint_body,
    parse_signed_note,
    signed_note,
    signing_key,
)

NODE = shutil.which("node")

# The worked example of golang.org/x/mod/sumdb/note's documentation: a signer key, its verifier key and
# the note it signs. Ed25519 is deterministic, so our bytes must be these exactly.
GO_SIGNER = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VERIFIER = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = b"If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
GO_SIGNATURE = (
    "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)
GO_NOTE = GO_TEXT + b"\n" + GO_SIGNATURE.encode() + b"\n"


def go_key() -> SigningKey:
    return SigningKey("PeterNeumann", base64.b64decode(GO_SIGNER.split("+", 4)[4])[1:])


def c2sp_key_id(name: str, public: bytes) -> str:
    """The signed-note key hash, computed here from the spec, not by the module."""
    return hashlib.sha256(name.encode() + b"\x0a" + b"\x01" + public).digest()[:4].hex()


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


class TestSigningKey:
    def test_sign_verify_round_trip(self) -> None:
        """A signature by a key verifies with its public half, and is 64 bytes."""
        key = SigningKey.generate("gate-a")
        signature = key.sign(b"checkpoint body\n")
        assert len(signature) == 64
        assert key.public().verify(b"checkpoint body\n", signature)

    def test_changed_message_signature_or_key_fails(self) -> None:
        """A changed message, a flipped signature bit, a truncated signature or another key: False, no
        exception."""
        key, other = SigningKey.generate("gate-a"), SigningKey.generate("gate-a")
        signature = key.sign(b"message")
        flipped = bytes([signature[0] ^ 1]) + signature[1:]
        assert not key.public().verify(b"messagE", signature)
        assert not key.public().verify(b"message", flipped)
        assert not key.public().verify(b"message", signature[:63])
        assert not key.public().verify(b"message", signature + b"\x00")
        assert not key.public().verify(b"message", b"")
        assert not other.public().verify(b"message", signature)

    def test_key_id_is_the_c2sp_key_hash(self) -> None:
        """key_id is the first 4 bytes of SHA-256(name || 0x0A || 0x01 || public key), in hex."""
        key = SigningKey.generate("example.com/gate")
        assert key.key_id == c2sp_key_id("example.com/gate", key.public().raw)
        assert key.public().key_id == key.key_id
        assert len(key.key_id) == 8

    def test_known_key_gives_the_published_key_id_and_verifier_key(self) -> None:
        """The Go documentation's key has key id c74f20a3 and exactly its published verifier key."""
        key = go_key()
        assert key.key_id == "c74f20a3"
        assert key.public().text() == GO_VERIFIER
        assert key.private_text() == GO_SIGNER

    @pytest.mark.parametrize("name", ["", "two words", "a+b", "tab\there", "new\nline", "nb\u00a0sp"])
    def test_invalid_names_are_refused(self, name: str) -> None:
        """A key name must be non-empty, without spaces (Unicode ones too), '+' or control characters."""
        with pytest.raises(SigningError, match="key name"):
            SigningKey.generate(name)

    def test_repr_never_shows_the_key(self) -> None:
        """The repr names the key and its id, and holds nothing of the private key."""
        key = SigningKey.generate("gate-a")
        assert repr(key) == f"SigningKey(name='gate-a', key_id='{key.key_id}')"
        assert key.private_text().split("+", 4)[4] not in repr(key)

    def test_signing_error_is_an_event_error(self) -> None:
        """SigningError belongs to the events package's error family."""
        assert issubclass(SigningError, EventError)


class TestKeyFiles:
    def test_write_then_load(self, tmp_path: Path) -> None:
        """write() makes NAME.key (0600) and NAME.pub (0644), one line each; both load back to the same key."""
        key = SigningKey.generate("gate-a")
        private, public = key.write(tmp_path / "keys")
        assert (private, public) == (tmp_path / "keys" / "gate-a.key", tmp_path / "keys" / "gate-a.pub")
        assert (mode(private), mode(public), mode(tmp_path / "keys")) == (0o600, 0o644, 0o700)
        assert private.read_text() == key.private_text() + "\n"
        assert public.read_text() == key.public().text() + "\n"
        loaded = SigningKey.load(private)
        assert (loaded.name, loaded.key_id) == ("gate-a", key.key_id)
        assert key.public().verify(b"x", loaded.sign(b"x"))
        assert VerifyingKey.load(public) == key.public()

    def test_modes_hold_under_any_umask(self, tmp_path: Path) -> None:
        """A strict umask does not make the public file private, nor a loose one the private file public."""
        for umask in (0o077, 0o000):
            previous = os.umask(umask)
            try:
                private, public = SigningKey.generate(f"u{umask:o}").write(tmp_path)
            finally:
                os.umask(previous)
            assert (mode(private), mode(public)) == (0o600, 0o644)

    def test_write_refuses_to_overwrite(self, tmp_path: Path) -> None:
        """An existing NAME.pub stops the write before anything is written: no NAME.key appears."""
        (tmp_path / "gate-a.pub").write_text("someone else's\n")
        with pytest.raises(SigningError, match=r"gate-a\.pub: already exists"):
            SigningKey.generate("gate-a").write(tmp_path)
        assert not (tmp_path / "gate-a.key").exists()
        assert (tmp_path / "gate-a.pub").read_text() == "someone else's\n"

    def test_write_refuses_a_name_with_a_slash(self, tmp_path: Path) -> None:
        """A URL-like name is a valid key name but not a file name: write() says so."""
        with pytest.raises(SigningError, match="cannot be a file name"):
            SigningKey.generate("example.com/gate").write(tmp_path)

    def test_go_signer_key_file_loads(self, tmp_path: Path) -> None:
        """A signer key written by golang.org/x/mod/sumdb/note loads as is."""
        (tmp_path / "go.key").write_text(GO_SIGNER + "\n")
        assert SigningKey.load(tmp_path / "go.key").key_id == "c74f20a3"

    @pytest.mark.parametrize(
        ("content", "message"),
        [
            (None, "no such private key file"),
            (b"\xff\xfe", "not UTF-8"),
            (b"-----BEGIN PRIVATE KEY-----\n", "not a private key file"),
            (GO_VERIFIER.encode(), "is a public key"),
            (GO_SIGNER.replace("c74f20a3", "c74f20a4").encode(), "does not match"),
            (GO_SIGNER.replace("PeterNeumann", "Peter").encode(), "does not match"),
            (GO_SIGNER[:-2].encode(), "not valid base64"),
            (b"PRIVATE+KEY+n+c74f20a3+" + base64.b64encode(b"\x02" + bytes(32)), "signature type 0x02"),
            (b"PRIVATE+KEY+n+c74f20a3+" + base64.b64encode(b"\x01" + bytes(31)), "32 bytes, expected 33"),
            (b"PRIVATE+KEY+n+zz+" + base64.b64encode(b"\x01" + bytes(32)), "not 8 hex digits"),
        ],
    )
    def test_load_names_the_path_and_the_problem(self, tmp_path: Path, content: bytes | None, message: str) -> None:
        """Every unusable private key file is a SigningError starting with its path."""
        path = tmp_path / "bad.key"
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(SigningError, match=message) as caught:
            SigningKey.load(path)
        assert str(caught.value).startswith(f"{path}: ")

    def test_load_of_a_directory(self, tmp_path: Path) -> None:
        """A directory given as the private key file is named as such."""
        with pytest.raises(SigningError, match="is a directory"):
            SigningKey.load(tmp_path)

    def test_signing_key_accepts_a_key_or_a_path(self, tmp_path: Path) -> None:
        """signing_key() returns a key object as is and loads a str or Path; other types are a TypeError."""
        key = SigningKey.generate("gate-a")
        private, _ = key.write(tmp_path)
        assert signing_key(key) is key
        assert signing_key(str(private)).key_id == key.key_id
        assert signing_key(private).key_id == key.key_id
        with pytest.raises(SigningError, match="no such private key file"):
            signing_key(tmp_path / "missing.key")
        with pytest.raises(TypeError, match="signing_key must be"):
            signing_key(42)  # type: ignore[arg-type]


class TestVerifyingKey:
    def test_text_round_trip(self) -> None:
        """parse(text()) is the same key; the text is <name>+<key id>+<base64(0x01 || key)>."""
        key = SigningKey.generate("gate-a").public()
        text = key.text()
        name, key_id, encoded = text.split("+", 2)
        assert (name, key_id) == ("gate-a", key.key_id)
        assert base64.b64decode(encoded) == b"\x01" + key.raw
        assert VerifyingKey.parse(text) == key
        assert VerifyingKey.parse(f"  {text}\n") == key

    def test_parse_checks_the_key_id(self) -> None:
        """A verifier key whose key id is not that of its name and key is refused."""
        key = SigningKey.generate("gate-a").public()
        wrong = "00000000" if key.key_id != "00000000" else "00000001"
        with pytest.raises(SigningError, match="does not match"):
            VerifyingKey.parse(f"gate-a+{wrong}+{key.text().split('+', 2)[2]}")
        with pytest.raises(SigningError, match="does not match"):
            VerifyingKey.parse(key.text().replace("gate-a", "gate-b"))

    @pytest.mark.parametrize("text", ["", "gate-a", "gate-a+c74f20a3", "gate a+c74f20a3+AAAA", GO_SIGNER])
    def test_parse_refuses_what_is_not_a_verifier_key(self, text: str) -> None:
        """Missing parts, an invalid name and a private key are all SigningErrors."""
        with pytest.raises(SigningError):
            VerifyingKey.parse(text)

    def test_upper_case_key_id_is_accepted_and_normalized(self) -> None:
        """The key id is hex: upper case parses, and the key's id is lower case."""
        name, key_id, encoded = GO_VERIFIER.split("+", 2)
        assert VerifyingKey.parse(f"{name}+{key_id.upper()}+{encoded}").key_id == key_id


class TestLoadTrustedKeys:
    def test_directory_of_pub_files(self, tmp_path: Path) -> None:
        """Every *.pub file of a directory is trusted, keyed by key id; other files are ignored."""
        a, b = SigningKey.generate("gate-a"), SigningKey.generate("gate-b")
        a.write(tmp_path)
        b.write(tmp_path)
        (tmp_path / "README").write_text("not a key\n")
        assert load_trusted_keys(tmp_path) == {a.key_id: a.public(), b.key_id: b.public()}

    def test_file_of_lines(self, tmp_path: Path) -> None:
        """A file trusts each verifier key line; blank lines and # comments are skipped."""
        a, b = SigningKey.generate("gate-a"), SigningKey.generate("gate-b")
        path = tmp_path / "trusted"
        path.write_text(f"# our gates\n{a.public().text()}\n\n{b.public().text()}\n")
        assert load_trusted_keys(path) == {a.key_id: a.public(), b.key_id: b.public()}

    def test_duplicate_key_id_is_refused(self, tmp_path: Path) -> None:
        """The same key in two files is refused, naming both places."""
        a, b = SigningKey.generate("gate-a"), SigningKey.generate("gate-b")
        a.write(tmp_path)
        b.write(tmp_path)
        (tmp_path / "copy.pub").write_text(a.public().text() + "\n")
        with pytest.raises(SigningError, match=f"key id {a.key_id}") as caught:
            load_trusted_keys(tmp_path)
        assert "copy.pub:1" in str(caught.value)
        assert "gate-a.pub:1" in str(caught.value)

    def test_bad_line_is_named(self, tmp_path: Path) -> None:
        """A line that is not a verifier key is a SigningError with its file and line number."""
        (tmp_path / "a.pub").write_text(SigningKey.generate("gate-a").public().text() + "\nnonsense\n")
        with pytest.raises(SigningError, match=r"a\.pub:2: not a verifier key"):
            load_trusted_keys(tmp_path)

    def test_missing_empty_and_unreadable(self, tmp_path: Path) -> None:
        """A missing path, a directory without keys and an unreadable file are SigningErrors naming them."""
        with pytest.raises(SigningError, match="no such trusted keys"):
            load_trusted_keys(tmp_path / "nope")
        with pytest.raises(SigningError, match="no verifier keys found"):
            load_trusted_keys(tmp_path)
        (tmp_path / "bin.pub").write_bytes(b"\xff\xfe\n")
        with pytest.raises(SigningError, match=r"bin\.pub: not a public key file"):
            load_trusted_keys(tmp_path)


class TestCheckpointBody:
    def test_exact_bytes_of_the_c2sp_example(self) -> None:
        """The tlog-checkpoint specification's example body, byte for byte."""
        root = base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
        assert checkpoint_body("example.com/behind-the-sofa", 20852163, root) == (
            b"example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
        )

    def test_extensions_and_an_empty_tree(self) -> None:
        """Size 0 is written 0; each extension is its own newline-terminated line; UTF-8 origins stay UTF-8."""
        body = checkpoint_body("gate ü", 0, bytes(32), ["ext one", "ext two"])
        assert body == ("gate ü\n0\n" + "A" * 43 + "=\next one\next two\n").encode()

    @pytest.mark.parametrize(
        ("origin", "size", "root", "extensions", "message"),
        [
            ("", 1, bytes(32), (), "origin is empty"),
            ("a\nb", 1, bytes(32), (), "contains a newline"),
            ("a\tb", 1, bytes(32), (), "control character"),
            ("a", -1, bytes(32), (), "integer >= 0"),
            ("a", True, bytes(32), (), "integer >= 0"),
            ("a", 1, bytes(31), (), "32 bytes, got 31"),
            ("a", 1, bytes(32), ("x\ny",), "contains a newline"),
            ("a", 1, bytes(32), ("",), "must not be empty"),
            ("a", 1, bytes(32), "oops", "not one string"),
        ],
    )
    def test_invalid_parts_are_refused(
        self, origin: str, size: int, root: bytes, extensions: tuple[str, ...], message: str
    ) -> None:
        """Each part that would make an unparseable checkpoint is a SigningError saying which."""
        with pytest.raises(SigningError, match=message):
            checkpoint_body(origin, size, root, extensions)

    @given(
        origin=st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), min_size=1),
        size=st.integers(min_value=0, max_value=2**64),
        root=st.binary(min_size=32, max_size=32),
        extensions=st.lists(st.text(st.characters(min_codepoint=0x20, exclude_categories=("Cs",)), min_size=1)),
    )
    def test_parse_is_the_inverse(self, origin: str, size: int, root: bytes, extensions: list[str]) -> None:
        """parse_checkpoint_body gives back exactly what checkpoint_body was given, for every valid input."""
        body = checkpoint_body(origin, size, root, extensions)
        assert parse_checkpoint_body(body) == CheckpointBody(origin, size, root, tuple(extensions))

    @pytest.mark.parametrize(
        "body",
        [b"a\n1\n", b"a\n1\n" + b"A" * 43 + b"=", b"a\n01\n" + b"A" * 43 + b"=\n", b"a\n1\nAAAA\n", b"a\n\n1\nx\n"],
    )
    def test_parse_refuses_malformed_bodies(self, body: bytes) -> None:
        """Too few lines, no final newline, a leading zero, a short root, an empty line: SigningError."""
        with pytest.raises(SigningError):
            parse_checkpoint_body(body)


class TestSignedNote:
    def test_known_note_is_byte_exact(self) -> None:
        """The Go documentation's key signs its text into exactly the published note, which opens."""
        key = go_key()
        assert signed_note(GO_TEXT, key) == GO_NOTE
        assert open_signed_note(GO_NOTE, {key.key_id: VerifyingKey.parse(GO_VERIFIER)}) == (GO_TEXT, ["c74f20a3"])

    def test_round_trip_of_a_checkpoint(self) -> None:
        """A checkpoint note is body, blank line, '— <name> <base64(key id || signature)>'; it opens
        to the body and the key id."""
        key = SigningKey.generate("gate-a")
        body = checkpoint_body("gate-a", 3, hashlib.sha256(b"root").digest())
        note = signed_note(body, key)
        assert note.startswith(body + "\n— gate-a ".encode())
        blob = base64.b64decode(note.rsplit(b" ", 1)[1])
        assert blob[:4].hex() == key.key_id
        assert key.public().verify(body, blob[4:])
        assert open_signed_note(note, {key.key_id: key.public()}) == (body, [key.key_id])

    def test_unknown_key_verifies_nothing(self) -> None:
        """A note by a key not in the trust list opens to no verified key, without an error."""
        key, stranger = SigningKey.generate("gate-a"), SigningKey.generate("gate-a")
        note = signed_note(b"body\n", key)
        assert open_signed_note(note, {}) == (b"body\n", [])
        assert open_signed_note(note, {stranger.key_id: stranger.public()}) == (b"body\n", [])

    def test_same_id_other_name_is_unknown(self) -> None:
        """A trusted key id listed under another name does not vouch for the line (name and id must both match)."""
        key = SigningKey.generate("gate-a")
        impostor_line = signed_note(b"body\n", key).replace(b"gate-a", b"gate-b")
        assert open_signed_note(impostor_line, {key.key_id: key.public()}) == (b"body\n", [])

    def test_tampered_body_fails(self) -> None:
        """A changed body keeps its signature line, which no longer verifies: no key id returned."""
        key = SigningKey.generate("gate-a")
        note = signed_note(checkpoint_body("gate-a", 3, bytes(32)), key)
        tampered = note.replace(b"\n3\n", b"\n4\n", 1)
        body, verified = open_signed_note(tampered, {key.key_id: key.public()})
        assert (body.split(b"\n")[1], verified) == (b"4", [])

    def test_several_signatures(self) -> None:
        """Of several signature lines, the trusted ones that verify are returned, in order and once each."""
        a, b, c = (SigningKey.generate(n) for n in ("gate-a", "gate-b", "gate-c"))
        body = b"body\n"
        note = signed_note(body, a)
        for key in (c, b, a):
            note += signed_note(body, key)[len(body) + 1 :]
        trusted = {a.key_id: a.public(), b.key_id: b.public()}
        assert open_signed_note(note, trusted) == (body, [a.key_id, b.key_id])
        _, signatures = parse_signed_note(note)
        assert [s.name for s in signatures] == ["gate-a", "gate-c", "gate-b", "gate-a"]
        assert signatures[1] == NoteSignature("gate-c", c.key_id, c.sign(body))

    def test_body_with_empty_lines(self) -> None:
        """The body may hold empty lines: the last blank line separates it from the signatures."""
        key = SigningKey.generate("gate-a")
        body = b"one\n\ntwo\n\n"
        assert open_signed_note(signed_note(body, key), {key.key_id: key.public()}) == (body, [key.key_id])

    @pytest.mark.parametrize(
        "note",
        [
            b"body\n",
            b"body\n\n",
            b"body\n\n\xe2\x80\x94 gate-a AAAAAAAAAAAAAA==",
            b"body\n\n- gate-a AAAAAAAAAAAAAA==\n",
            "body\n\n— gate-a\n".encode(),
            "body\n\n— gate-a not*base64\n".encode(),
            "body\n\n— gate-a AAAA\n".encode(),
            "body\n\n—  AAAAAAAAAAAAAA==\n".encode(),
            "bo\tdy\n\n— gate-a AAAAAAAAAAAAAA==\n".encode(),
            b"b\xffdy\n\n\xe2\x80\x94 gate-a AAAAAAAAAAAAAA==\n",
            b"body\n\n" + "— gate-a AAAAAAAAAAAAAA==\n".encode() * 101,
        ],
    )
    def test_malformed_notes_raise(self, note: bytes) -> None:
        """No blank line, no final newline, a line without the em dash, a missing, invalid or short
        signature, an empty name, a control character, invalid UTF-8, too many lines: SigningError."""
        with pytest.raises(SigningError, match="note"):
            open_signed_note(note, {})

    @pytest.mark.parametrize("body", [b"no final newline", b"tab\there\n", b"\xff\n"])
    def test_signed_note_refuses_bodies_nobody_could_open(self, body: bytes) -> None:
        """A body without its final newline, with a control character or not UTF-8 is not signed."""
        with pytest.raises(SigningError):
            signed_note(body, SigningKey.generate("gate-a"))


NODE_VERIFY = r"""
const crypto = require("crypto");
const fs = require("fs");
const [notePath, name, rawB64url] = process.argv.slice(1);
const note = fs.readFileSync(notePath);
const split = note.lastIndexOf("\n\n");
const body = note.subarray(0, split + 1);
const line = note.subarray(split + 2).toString("utf8").replace(/\n$/, "");
const prefix = "\u2014 " + name + " ";
if (!line.startsWith(prefix)) { console.log("bad signature line"); process.exit(2); }
const blob = Buffer.from(line.slice(prefix.length), "base64");
const raw = Buffer.from(rawB64url, "base64url");
const keyId = crypto.createHash("sha256")
  .update(Buffer.concat([Buffer.from(name + "\n", "utf8"), Buffer.from([1]), raw])).digest().subarray(0, 4);
if (!keyId.equals(blob.subarray(0, 4))) { console.log("key id mismatch"); process.exit(3); }
const key = crypto.createPublicKey({ key: { kty: "OKP", crv: "Ed25519", x: rawB64url }, format: "jwk" });
const ok = crypto.verify(null, body, key, blob.subarray(4));
console.log(ok ? "verified" : "bad signature");
process.exit(ok ? 0 : 1);
"""


class TestNodeCrossCheck:
    """A note signed here verifies with Node.js's Ed25519, given only the raw public key."""

    def node_verify(self, note: Path, key: VerifyingKey) -> subprocess.CompletedProcess[str]:
        assert NODE is not None, "Node.js is missing: `make venv` installs Debian's nodejs"
        raw = base64.urlsafe_b64encode(key.raw).rstrip(b"=").decode()
        return subprocess.run(
            [NODE, "-e", NODE_VERIFY, str(note), key.name, raw], capture_output=True, text=True, timeout=60, check=False
        )

    def test_node_verifies_and_catches_tampering(self, tmp_path: Path) -> None:
        """Node verifies the signature and the key id of a Python-signed checkpoint, and rejects it once
        the body is changed."""
        key = SigningKey.generate("gate-ü")
        body = checkpoint_body("gate-ü", 1000, hashlib.sha256(b"root").digest(), ["ext ✓"])
        path = tmp_path / "checkpoint.note"
        path.write_bytes(signed_note(body, key))
        done = self.node_verify(path, key.public())
        assert (done.returncode, done.stdout.strip()) == (0, "verified"), done.stderr
        path.write_bytes(path.read_bytes().replace(b"\n1000\n", b"\n1001\n", 1))
        done = self.node_verify(path, key.public())
        assert (done.returncode, done.stdout.strip()) == (1, "bad signature"), done.stderr
