"""Ed25519 keys, C2SP signed notes and tlog checkpoints: what a gate signs its chain's checkpoints with.

The formats are those of c2sp.org, so that a checkpoint verifies with any tool of that ecosystem
(golang.org/x/mod/sumdb/note, the transparency-dev and sigsum tools) and with a few lines of any
language. The signatures themselves are `cryptography`'s Ed25519 (RFC 8032): nothing here is
cryptography of our own, only encodings.

- **Key name**: non-empty UTF-8 without Unicode spaces, `+` or control characters (c2sp.org/signed-note).
- **Key id**: 8 lowercase hex digits, the first 4 bytes of
  `SHA-256(name || 0x0A || 0x01 || 32-byte public key)` (the signed-note key hash of an Ed25519 key).
- **Verifier key** (the public file, `NAME.pub`): one line, `<name>+<key id>+<base64(0x01 || public key)>`
  and a newline, the verifier-key string of c2sp.org and golang.org/x/mod/sumdb/note. Mode 0644.
- **Private key** (`NAME.key`): one line, `PRIVATE+KEY+<name>+<key id>+<base64(0x01 || 32-byte seed)>`
  and a newline: the signer-key string of golang.org/x/mod/sumdb/note (`note.NewSigner` reads it), so
  the name and key id travel with the key and loading it checks that the key id still matches the key.
  Mode 0600. Anyone who has it can sign as this gate.
- **Checkpoint body** (c2sp.org/tlog-checkpoint): `<origin>\\n<tree size>\\n<base64(root hash)>\\n`, then
  one line per extension.
- **Signed note** (c2sp.org/signed-note): the body (ending in a newline), a blank line, then one line per
  signature: `— <key name> <base64(4-byte key id || 64-byte signature)>\\n`, the em dash being U+2014;
  the signature is over the body, its final newline included.

Base64 is the standard alphabet with padding (RFC 4648 section 4) throughout. Every function and method
here is safe to call from several threads and tasks at once; none does I/O except `load`, `write` and
`load_trusted_keys`, and none blocks otherwise.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from events.errors import EventError

__all__ = [
    "CheckpointBody",
    "NoteSignature",
    "SigningError",
    "SigningKey",
    "VerifyingKey",
    "checkpoint_body",
    "load_trusted_keys",
    "open_signed_note",
    "parse_checkpoint_body",
    "parse_signed_note",
    "signed_note",
    "signing_key",
]

ED25519 = 0x01
"""The signed-note signature type byte of Ed25519, in key ids and key encodings."""

PRIVATE_PREFIX = "PRIVATE+KEY+"
"""How a private key file's line begins (the sumdb/note signer-key form)."""

SIGNATURE_PREFIX = "— ".encode()
"""How each signature line of a note begins: em dash (U+2014), space."""

MAX_SIGNATURES = 100
"""More signature lines than this make a note malformed (the spec asks verifiers for a limit of at least 16)."""

_SEED_BYTES = 32
_PUBLIC_BYTES = 32
_SIGNATURE_BYTES = 64
_ROOT_BYTES = 32
_HEX = frozenset("0123456789abcdef")


class SigningError(EventError):
    """A key, key file, checkpoint or note that cannot be used: the message names the file or the field
    and says what is wrong."""


def _name_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    for char in name:
        if char.isspace():
            return f"contains a space ({char!r})"
        if char == "+":
            return "contains '+'"
        if ord(char) < 0x20 or ord(char) == 0x7F:
            return f"contains a control character ({char!r})"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def _check_name(name: str) -> None:
    problem = _name_problem(name)
    if problem is not None:
        raise SigningError(f"key name {name!r} {problem}: a key name is non-empty, without spaces or '+'")


def _key_id(name: str, public: bytes) -> str:
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([ED25519]) + public).digest()[:4].hex()


def _b64decode(text: str) -> bytes | None:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _read_text(path: Path, what: str) -> str:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SigningError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise SigningError(f"{path}: is a directory, not a {what} file") from None
    except OSError as exc:
        raise SigningError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise SigningError(f"{path}: not a {what} file (not UTF-8 text)") from None


def _split_key_string(text: str, parts: int) -> list[str] | None:
    fields = text.split("+", parts - 1)
    return fields if len(fields) == parts else None


class VerifyingKey:
    """An Ed25519 public key with its name and key id: what a verifier trusts.

    Immutable; equal to another with the same name and public key. `verify` never raises on a bad
    signature."""

    __slots__ = ("_key", "key_id", "name", "raw")

    name: str
    """The key name, as in the signature lines of the notes this key signs."""
    key_id: str
    """8 lowercase hex digits: the C2SP signed-note key hash of `name` and `raw`."""
    raw: bytes
    """The 32-byte Ed25519 public key (RFC 8032 encoding)."""

    def __init__(self, name: str, raw: bytes) -> None:
        """The key `name` for the 32-byte public key `raw`; `SigningError` for an invalid name or length."""
        _check_name(name)
        if len(raw) != _PUBLIC_BYTES:
            raise SigningError(f"an Ed25519 public key is {_PUBLIC_BYTES} bytes, got {len(raw)}")
        self.name = name
        self.raw = bytes(raw)
        self.key_id = _key_id(name, self.raw)
        self._key = Ed25519PublicKey.from_public_bytes(self.raw)

    @classmethod
    def parse(cls, text: str) -> VerifyingKey:
        """The key of a verifier-key string `<name>+<key id>+<base64(0x01 || public key)>` (surrounding
        whitespace ignored); `SigningError` saying what is wrong, including a key id that does not match
        the name and key."""
        text = text.strip()
        if text.startswith(PRIVATE_PREFIX):
            raise SigningError("this is a private key, not a verifier key: give the .pub file")
        fields = _split_key_string(text, 3)
        if fields is None:
            raise SigningError(f"not a verifier key {text[:40]!r}: expected <name>+<key id>+<base64 key>")
        name, key_id, encoded = fields
        key = cls(name, _decode_key(name, key_id, encoded, "public key"))
        _check_key_id(key_id, key.key_id, name)
        return key

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> VerifyingKey:
        """The key in a public key file (one verifier-key line, as `SigningKey.write` writes);
        `SigningError` naming the path."""
        path = Path(path)
        text = _read_text(path, "public key")
        try:
            return cls.parse(text)
        except SigningError as exc:
            raise SigningError(f"{path}: {exc}") from None

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether `signature` is this key's Ed25519 signature of `message`; False (never an exception)
        for a wrong, truncated or overlong signature."""
        if len(signature) != _SIGNATURE_BYTES:
            return False
        try:
            self._key.verify(bytes(signature), bytes(message))
        except InvalidSignature:
            return False
        return True

    def text(self) -> str:
        """The C2SP verifier-key string: `<name>+<key id>+<base64(0x01 || public key)>`."""
        return f"{self.name}+{self.key_id}+{_b64(bytes([ED25519]) + self.raw)}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, VerifyingKey):
            return NotImplemented
        return self.name == other.name and self.raw == other.raw

    def __hash__(self) -> int:
        return hash((self.name, self.raw))

    def __repr__(self) -> str:
        return f"VerifyingKey({self.text()!r})"


def _decode_key(name: str, key_id: str, encoded: str, what: str) -> bytes:
    """The 32 key bytes of `encoded` (base64 of 0x01 || key); checks name and key id syntax, not the hash."""
    _check_name(name)
    if len(key_id) != 8 or not set(key_id.lower()) <= _HEX:
        raise SigningError(f"key id {key_id!r} of key {name!r} is not 8 hex digits")
    data = _b64decode(encoded)
    if data is None:
        raise SigningError(f"the {what} of key {name!r} is not valid base64")
    if len(data) != 1 + _PUBLIC_BYTES:
        raise SigningError(f"the {what} of key {name!r} is {len(data)} bytes, expected {1 + _PUBLIC_BYTES}")
    if data[0] != ED25519:
        raise SigningError(f"key {name!r} has signature type 0x{data[0]:02x}; only Ed25519 (0x01) is supported")
    return data[1:]


def _check_key_id(key_id: str, computed: str, name: str) -> None:
    if key_id.lower() != computed:
        raise SigningError(f"key id {key_id} of key {name!r} does not match its name and key (they give {computed})")


class SigningKey:
    """An Ed25519 private key with its name and key id: what a gate signs its checkpoints with.

    Its repr shows the name and key id, never the key. `sign` is safe from several threads."""

    __slots__ = ("_key", "_public", "key_id", "name")

    name: str
    """The key name (e.g. `callgate` or the gate's name): in the notes it signs and the file names."""
    key_id: str
    """8 lowercase hex digits: the C2SP signed-note key hash of the name and the public key."""

    def __init__(self, name: str, seed: bytes) -> None:
        """The key `name` for the 32-byte Ed25519 private key `seed` (RFC 8032); `SigningError` for an
        invalid name or length."""
        _check_name(name)
        if len(seed) != _SEED_BYTES:
            raise SigningError(f"an Ed25519 private key is {_SEED_BYTES} bytes, got {len(seed)}")
        self.name = name
        self._key = Ed25519PrivateKey.from_private_bytes(bytes(seed))
        self._public = VerifyingKey(name, self._key.public_key().public_bytes_raw())
        self.key_id = self._public.key_id

    @classmethod
    def generate(cls, name: str = "callgate") -> SigningKey:
        """A new random key named `name` (from the operating system's random source)."""
        _check_name(name)
        return cls(name, Ed25519PrivateKey.generate().private_bytes_raw())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """The key in a private key file `write` (or `callgate keygen`) wrote; `SigningError` naming the
        path when it is missing, unreadable, not a private key, or its key id does not match its key."""
        path = Path(path)
        text = _read_text(path, "private key").strip()
        if not text.startswith(PRIVATE_PREFIX):
            try:
                VerifyingKey.parse(text)
            except SigningError:
                pass
            else:
                raise SigningError(f"{path}: is a public key (verifier key); give the private .key file")
            raise SigningError(
                f"{path}: not a private key file (expected one line PRIVATE+KEY+<name>+<key id>+<base64 key>)"
            )
        fields = _split_key_string(text[len(PRIVATE_PREFIX) :], 3)
        if fields is None:
            raise SigningError(f"{path}: not a private key file (expected PRIVATE+KEY+<name>+<key id>+<base64 key>)")
        name, key_id, encoded = fields
        try:
            key = cls(name, _decode_key(name, key_id, encoded, "private key"))
            _check_key_id(key_id, key.key_id, name)
        except SigningError as exc:
            raise SigningError(f"{path}: {exc}") from None
        return key

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message` (deterministic: the same message, the same bytes)."""
        return self._key.sign(bytes(message))

    def public(self) -> VerifyingKey:
        """The public half, for verifiers."""
        return self._public

    def private_text(self) -> str:
        """The private key file's line: `PRIVATE+KEY+<name>+<key id>+<base64(0x01 || seed)>`. Secret."""
        return f"{PRIVATE_PREFIX}{self.name}+{self.key_id}+{_b64(bytes([ED25519]) + self._key.private_bytes_raw())}"

    def write(self, directory: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write `<directory>/<name>.key` (mode 0600) and `<directory>/<name>.pub` (mode 0644), each one
        line and a newline; return their paths (private, public).

        Creates `directory` (mode 0700) and its parents when missing. Refuses, with `SigningError` naming
        the file, when either file exists (nothing is written then), when the name cannot be a file name
        (it contains `/`), or when the directory cannot be written; a pair is never left half written."""
        if "/" in self.name or "\\" in self.name or self.name in (".", ".."):
            raise SigningError(f"key name {self.name!r} cannot be a file name: choose one without '/' or '\\'")
        directory = Path(directory)
        private, public = directory / f"{self.name}.key", directory / f"{self.name}.pub"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            raise SigningError(f"{directory}: exists and is not a directory") from None
        except OSError as exc:
            raise SigningError(f"{directory}: cannot create the directory: {exc.strerror or exc}") from None
        for path in (private, public):
            if path.exists() or path.is_symlink():
                raise SigningError(f"{path}: already exists; not overwriting it (move it away or use another name)")
        _create(private, self.private_text(), 0o600)
        try:
            _create(public, self._public.text(), 0o644)
        except SigningError:
            private.unlink(missing_ok=True)
            raise
        return private, public

    def __repr__(self) -> str:
        return f"SigningKey(name={self.name!r}, key_id={self.key_id!r})"


def _create(path: Path, line: str, mode: int) -> None:
    # O_EXCL: a file that appeared since the check is refused, not overwritten; the explicit chmod
    # sets the mode whatever the umask (a strict umask would otherwise make the public file 0600).
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise SigningError(f"{path}: already exists; not overwriting it (move it away or use another name)") from None
    except OSError as exc:
        raise SigningError(f"{path}: cannot create the file: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            os.fchmod(file.fileno(), mode)
            file.write(line + "\n")
            file.flush()
            os.fsync(file.fileno())
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise SigningError(f"{path}: cannot write the file: {exc.strerror or exc}") from None


def signing_key(value: SigningKey | str | os.PathLike[str]) -> SigningKey:
    """What `Gate(signing_key=...)` accepts, as a key: a `SigningKey` as is, or the path of a private key
    file, loaded (`SigningError` naming the path). `TypeError` for anything else."""
    if isinstance(value, SigningKey):
        return value
    if isinstance(value, str | os.PathLike):
        return SigningKey.load(value)
    raise TypeError(f"signing_key must be a SigningKey or the path of a private key file, not {type(value).__name__}")


def load_trusted_keys(path: str | os.PathLike[str]) -> dict[str, VerifyingKey]:
    """The verifier keys in `path`, keyed by key id: a file of verifier keys (one per line; blank lines and
    lines starting with `#` ignored), or a directory whose `*.pub` files are such files (other files are
    ignored).

    `SigningError` naming the file (and line) when the path is missing or unreadable, a line is not a
    valid verifier key, a key id appears twice (the same key twice included), or no key is found at all:
    a trust list that trusts nothing is a mistake, not a policy."""
    path = Path(path)
    if path.is_dir():
        try:
            files = sorted(p for p in path.iterdir() if p.name.endswith(".pub") and not p.is_dir())
        except OSError as exc:
            raise SigningError(f"{path}: cannot list the trusted keys directory: {exc.strerror or exc}") from None
    elif path.exists():
        files = [path]
    else:
        raise SigningError(f"{path}: no such trusted keys file or directory")
    keys: dict[str, VerifyingKey] = {}
    where: dict[str, str] = {}
    for file in files:
        for number, line in enumerate(_read_text(file, "public key").splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            place = f"{file}:{number}"
            try:
                key = VerifyingKey.parse(line)
            except SigningError as exc:
                raise SigningError(f"{place}: {exc}") from None
            if key.key_id in keys:
                raise SigningError(
                    f"{place}: key id {key.key_id} ({key.name}) is already trusted from {where[key.key_id]}; "
                    "each key id may appear once"
                )
            keys[key.key_id] = key
            where[key.key_id] = place
    if not keys:
        raise SigningError(f"{path}: no verifier keys found (expected *.pub files or lines <name>+<key id>+<key>)")
    return keys


# -- checkpoints (c2sp.org/tlog-checkpoint) ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckpointBody:
    """The parts of a checkpoint body, as `parse_checkpoint_body` reads them."""

    origin: str
    """The log's identity: for callgate, the producer whose chain it is."""
    size: int
    """The tree size: how many events the Merkle tree covers."""
    root: bytes
    """The 32-byte RFC 6962 Merkle tree root hash at that size."""
    extensions: tuple[str, ...] = ()
    """Extension lines, in order (opaque to the checkpoint format)."""


def _line_problem(text: str) -> str | None:
    for char in text:
        if char == "\n":
            return "contains a newline"
        if ord(char) < 0x20:
            return f"contains a control character ({char!r})"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def checkpoint_body(origin: str, size: int, root: bytes, extensions: Sequence[str] = ()) -> bytes:
    """The C2SP tlog-checkpoint body, UTF-8: `<origin>\\n<size>\\n<base64 of root>\\n` and one line per
    extension, each ending in a newline.

    `SigningError` when the origin is empty or holds a newline or control character, the size is not an
    integer >= 0, the root is not 32 bytes, or an extension is empty or holds a newline or control
    character (each would make a checkpoint nobody can parse back)."""
    if not origin:
        raise SigningError("checkpoint origin is empty")
    problem = _line_problem(origin)
    if problem is not None:
        raise SigningError(f"checkpoint origin {origin!r} {problem}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise SigningError(f"checkpoint size must be an integer >= 0, got {size!r}")
    if len(root) != _ROOT_BYTES:
        raise SigningError(f"checkpoint root must be {_ROOT_BYTES} bytes, got {len(root)}")
    if isinstance(extensions, str):
        raise SigningError("checkpoint extensions must be a sequence of lines, not one string")
    lines = [origin, str(size), _b64(bytes(root))]
    for extension in extensions:
        if not extension:
            raise SigningError("checkpoint extension lines must not be empty")
        problem = _line_problem(extension)
        if problem is not None:
            raise SigningError(f"checkpoint extension {extension!r} {problem}")
        lines.append(extension)
    return "".join(line + "\n" for line in lines).encode("utf-8")


def parse_checkpoint_body(body: bytes) -> CheckpointBody:
    """The parts of a checkpoint body (the inverse of `checkpoint_body`); `SigningError` saying what is
    wrong: fewer than three lines, a missing final newline, an empty line, a size that is not decimal
    without leading zeros, or a root that is not the base64 of 32 bytes."""
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        raise SigningError("checkpoint body is not UTF-8") from None
    if not text.endswith("\n"):
        raise SigningError("checkpoint body does not end with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise SigningError(f"checkpoint body has {len(lines)} lines, expected at least 3 (origin, size, root)")
    if any(not line for line in lines):
        raise SigningError("checkpoint body has an empty line")
    for line in lines:
        problem = _line_problem(line)
        if problem is not None:
            raise SigningError(f"checkpoint line {line!r} {problem}")
    origin, size_text, root_text, *extensions = lines
    if not size_text.isascii() or not size_text.isdigit() or (size_text != "0" and size_text.startswith("0")):
        raise SigningError(f"checkpoint size {size_text!r} is not a decimal number without leading zeros")
    root = _b64decode(root_text)
    if root is None or len(root) != _ROOT_BYTES:
        raise SigningError(f"checkpoint root {root_text!r} is not the base64 of {_ROOT_BYTES} bytes")
    return CheckpointBody(origin, int(size_text), root, tuple(extensions))


# -- signed notes (c2sp.org/signed-note) -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NoteSignature:
    """One signature line of a note, not verified."""

    name: str
    """The key name on the line."""
    key_id: str
    """The key id (8 lowercase hex digits) the signature starts with."""
    signature: bytes
    """The signature bytes after the key id (64 for Ed25519)."""


def _check_note_text(data: bytes, what: str) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SigningError(f"{what} is not valid UTF-8") from None
    for char in text:
        if ord(char) < 0x20 and char != "\n":
            raise SigningError(f"{what} contains a control character ({char!r}) other than newline")
    return text


def signed_note(body: bytes, key: SigningKey) -> bytes:
    """The C2SP signed note of `body` by `key`: the body, a blank line, and
    `— <key name> <base64(key id || signature)>\\n`, the signature over `body` exactly.

    `SigningError` when `body` does not end with a newline, is not UTF-8 or holds a control character
    other than newline (a note that nobody could open)."""
    body = bytes(body)
    _check_note_text(body, "note body")
    if not body.endswith(b"\n"):
        raise SigningError("note body must end with a newline")
    blob = bytes.fromhex(key.key_id) + key.sign(body)
    return body + b"\n" + SIGNATURE_PREFIX + f"{key.name} {_b64(blob)}\n".encode()


def parse_signed_note(note: bytes) -> tuple[bytes, list[NoteSignature]]:
    """The body of a signed note and its signature lines, in order, verifying nothing (to report which
    keys signed a note none of them is trusted for, say). `SigningError` for a malformed note: not UTF-8,
    a control character other than newline, no blank line before the signatures, a signature line that is
    not `— <name> <base64>` with at least 5 decoded bytes, or more than `MAX_SIGNATURES` lines."""
    note = bytes(note)
    _check_note_text(note, "note")
    split = note.rfind(b"\n\n")
    if split < 0:
        raise SigningError("malformed note: no blank line before the signatures")
    body, block = note[: split + 1], note[split + 2 :]
    if not block or not block.endswith(b"\n"):
        raise SigningError("malformed note: the signatures must be lines ending in a newline")
    lines = block[:-1].split(b"\n")
    if len(lines) > MAX_SIGNATURES:
        raise SigningError(f"malformed note: {len(lines)} signature lines (at most {MAX_SIGNATURES})")
    signatures: list[NoteSignature] = []
    for number, line in enumerate(lines, start=1):
        if not line.startswith(SIGNATURE_PREFIX):
            raise SigningError(f"malformed note: signature line {number} does not start with '— '")
        name, _, encoded = line[len(SIGNATURE_PREFIX) :].decode("utf-8").partition(" ")
        if _name_problem(name) is not None:
            raise SigningError(f"malformed note: signature line {number} has an invalid key name {name!r}")
        blob = _b64decode(encoded) if encoded else None
        if blob is None or len(blob) < 5:
            raise SigningError(f"malformed note: signature line {number} is not base64 of key id and signature")
        signatures.append(NoteSignature(name, blob[:4].hex(), blob[4:]))
    return body, signatures


def open_signed_note(note: bytes, keys: Mapping[str, VerifyingKey]) -> tuple[bytes, list[str]]:
    """The body of a signed note and the key ids, in order of their lines and each once, of the keys in
    `keys` (keyed by key id) whose signature of the body verified.

    A signature counts only from a key whose name *and* key id both match a key in `keys` (c2sp.org:
    a line matching one but not the other is from an unknown key and ignored). A known key whose
    signature fails is left out: an empty list means the note must be rejected, and a caller that needs to
    tell an untrusted signer from a bad signature compares with `parse_signed_note`. `SigningError` for a
    malformed note (see `parse_signed_note`), never for a signature that does not verify."""
    body, signatures = parse_signed_note(note)
    verified: list[str] = []
    for signature in signatures:
        key = keys.get(signature.key_id)
        if key is None or key.name != signature.name or key.key_id != signature.key_id:
            continue
        if signature.key_id in verified:
            continue
        if key.verify(body, signature.signature):
            verified.append(signature.key_id)
    return body, verified
