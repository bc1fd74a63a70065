"""`callgate keygen`, run as the real command: the files, their modes and formats, the refusal to
overwrite, and that what it writes signs and verifies."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
from pathlib import Path

from events.signing import SigningKey, VerifyingKey, checkpoint_body, load_trusted_keys, open_signed_note, signed_note

REPO = Path(__file__).resolve().parents[2]


def keygen(*args: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "callgate.cli", "keygen", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        umask=umask,
    )


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


class TestKeygen:
    def test_writes_a_key_pair(self, tmp_path: Path) -> None:
        """keygen --out DIR creates DIR (0700), DIR/callgate.key (0600) and DIR/callgate.pub (0644), and
        prints both paths and the key id."""
        out = tmp_path / "keys" / "gate"
        done = keygen("--out", str(out))
        assert done.returncode == 0, done.stderr
        private, public = out / "callgate.key", out / "callgate.pub"
        assert (mode(out), mode(private), mode(public)) == (0o700, 0o600, 0o644)
        key = SigningKey.load(private)
        lines = done.stdout.splitlines()
        assert lines[0].startswith(f"private key: {private}  ")
        assert lines[1].startswith(f"public key:  {public}  ")
        assert lines[2] == f"key id:      {key.key_id}"
        assert done.stderr == ""

    def test_formats(self, tmp_path: Path) -> None:
        """The private file is one sumdb/note signer-key line, the public one the C2SP verifier-key line, with
        the C2SP key id computed from the name and the public key."""
        assert keygen("--out", str(tmp_path), "--name", "billing-gate").returncode == 0
        private_text = (tmp_path / "billing-gate.key").read_text()
        public_text = (tmp_path / "billing-gate.pub").read_text()
        assert private_text.endswith("\n")
        assert private_text.count("\n") == 1
        assert public_text.endswith("\n")
        assert public_text.count("\n") == 1
        marker, key_word, name, key_id, seed = private_text.strip().split("+", 4)
        assert (marker, key_word, name) == ("PRIVATE", "KEY", "billing-gate")
        seed_bytes = base64.b64decode(seed)
        assert (seed_bytes[0], len(seed_bytes)) == (0x01, 33)
        public_name, public_id, encoded = public_text.strip().split("+", 2)
        raw = base64.b64decode(encoded)
        assert (public_name, raw[0], len(raw)) == ("billing-gate", 0x01, 33)
        expected_id = hashlib.sha256(b"billing-gate\n\x01" + raw[1:]).digest()[:4].hex()
        assert public_id == key_id == expected_id

    def test_written_key_signs_and_public_key_verifies(self, tmp_path: Path) -> None:
        """A checkpoint signed with the written private key opens with the written public key, alone or as a
        trusted keys directory."""
        assert keygen("--out", str(tmp_path), "--name", "gate-a").returncode == 0
        key = SigningKey.load(tmp_path / "gate-a.key")
        public = VerifyingKey.load(tmp_path / "gate-a.pub")
        body = checkpoint_body("gate-a", 7, hashlib.sha256(b"root").digest())
        note = signed_note(body, key)
        assert open_signed_note(note, {public.key_id: public}) == (body, [key.key_id])
        assert open_signed_note(note, load_trusted_keys(tmp_path)) == (body, [key.key_id])

    def test_modes_do_not_depend_on_the_umask(self, tmp_path: Path) -> None:
        """Under umask 077 the public file is still 0644; under umask 000 the private one still 0600."""
        assert keygen("--out", str(tmp_path / "strict"), umask=0o077).returncode == 0
        assert keygen("--out", str(tmp_path / "loose"), umask=0o000).returncode == 0
        for out in (tmp_path / "strict", tmp_path / "loose"):
            assert (mode(out), mode(out / "callgate.key"), mode(out / "callgate.pub")) == (0o700, 0o600, 0o644)

    def test_refuses_to_overwrite(self, tmp_path: Path) -> None:
        """A second keygen into the same place exits 2 with one line naming the file, and leaves both files
        as they were."""
        assert keygen("--out", str(tmp_path)).returncode == 0
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        done = keygen("--out", str(tmp_path))
        assert done.returncode == 2
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1
        assert done.stderr.startswith(f"error: {tmp_path / 'callgate.key'}: already exists")
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    def test_existing_public_file_alone_stops_it(self, tmp_path: Path) -> None:
        """An existing NAME.pub is refused too, before the private file is written."""
        (tmp_path / "callgate.pub").write_text("someone else's key\n")
        done = keygen("--out", str(tmp_path))
        assert done.returncode == 2
        assert done.stderr.startswith(f"error: {tmp_path / 'callgate.pub'}: already exists")
        assert not (tmp_path / "callgate.key").exists()

    def test_if_missing_keeps_a_pair_and_refuses_half_of_one(self, tmp_path: Path) -> None:
        """`--if-missing` writes a pair once, then keeps it (exit 0, the files as they were, its key id
        echoed); a lone NAME.pub exits 2 with one line naming both files, writing nothing."""
        first = keygen("--out", str(tmp_path), "--if-missing")
        assert first.returncode == 0, first.stderr
        before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
        again = keygen("--out", str(tmp_path), "--if-missing")
        assert again.returncode == 0, again.stderr
        key_id = first.stdout.split("key id:", 1)[1].strip()
        assert again.stdout.startswith(f"kept the key pair {tmp_path / 'callgate.key'}")
        assert key_id in again.stdout
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
        (tmp_path / "callgate.key").unlink()
        half = keygen("--out", str(tmp_path), "--if-missing")
        assert half.returncode == 2
        assert half.stderr.count("\n") == 1
        assert "only one of the pair is there" in half.stderr
        assert not (tmp_path / "callgate.key").exists()

    def test_invalid_name_and_out_that_is_a_file(self, tmp_path: Path) -> None:
        """A name with a space, a name with '/' and an --out that is a file each exit 2 with one line."""
        (tmp_path / "file").write_text("")
        for args, message in [
            (["--out", str(tmp_path), "--name", "two words"], "key name 'two words' contains a space"),
            (["--out", str(tmp_path), "--name", "a/b"], "cannot be a file name"),
            (["--out", str(tmp_path / "file")], "exists and is not a directory"),
        ]:
            done = keygen(*args)
            assert done.returncode == 2, args
            assert done.stderr.count("\n") == 1, done.stderr
            assert done.stderr.startswith("error: "), done.stderr
            assert message in done.stderr, done.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_materialize_refuses_a_decision_key_it_cannot_sign_with(tmp_path: Path) -> None:
    """`callgate materialize --decision-key` given the public half, or `--decision-pub` given the
    private one, exits 2 with one line naming the option and the file, before it opens the store
    or reaches Kafka."""
    assert keygen("--out", str(tmp_path), "--name", "callgate-desk").returncode == 0
    for option, given, message in [
        ("--decision-key", tmp_path / "callgate-desk.pub", "is a public key"),
        ("--decision-pub", tmp_path / "callgate-desk.key", "is a private key"),
    ]:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "callgate.cli", "materialize", "--bootstrap", "127.0.0.1:1"),
                *("--db", str(tmp_path / "audit.duckdb"), option, str(given)),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"error: {option}: {given}"), done.stderr
        assert message in done.stderr, done.stderr
    assert not (tmp_path / "audit.duckdb").exists()
