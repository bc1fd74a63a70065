"""`callgate keygen`: a new Ed25519 key pair for signing a gate's checkpoints (formats: events.signing)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from events.signing import SigningError, SigningKey


def run_keygen(out: Path, name: str, echo: Callable[[str], None]) -> SigningKey:
    """Generate a key named `name`, write `out/<name>.key` (0600) and `out/<name>.pub` (0644), creating
    `out` (0700) when missing, and echo both paths and the key id; return the key.

    Raises `events.signing.SigningError` naming the file or the name when the name is invalid, a file
    already exists (nothing is overwritten, nothing is written) or `out` cannot be written."""
    key = SigningKey.generate(name)
    private, public = key.write(out)
    echo(f"private key: {private}  (keep it secret: Gate(signing_key=...) signs with it)")
    echo(f"public key:  {public}  (give it to verifiers: --trusted-keys)")
    echo(f"key id:      {key.key_id}")
    return key


def kept_key(out: Path, name: str, echo: Callable[[str], None]) -> bool:
    """Whether the key pair `out/<name>.key` and `.pub` is there already, the private half readable
    as a key (then its paths and key id are echoed). Raises `events.signing.SigningError` naming the
    files when only one of them is there, or the private one is not a key."""
    private, public = out / f"{name}.key", out / f"{name}.pub"
    if not private.exists() and not public.exists():
        return False
    if not (private.is_file() and public.is_file()):
        raise SigningError(f"{private} and {public}: only one of the pair is there; remove it or write the other")
    key = SigningKey.load(private)
    echo(f"kept the key pair {private}, {public} (key id {key.key_id})")
    return True
