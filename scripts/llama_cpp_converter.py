"""llama.cpp's own HF -> GGUF converter, fetched on demand and run without a vocab.

Why this exists: parity fixtures must be converted by a third party, not by frink, so that a
shared misunderstanding of a tensor layout cannot hide. llama.cpp's converter
(convert_hf_to_gguf.py + its conversion/ package + gguf-py/) ships inside the
llama-cpp-python sdist; we take it from there, pinned to the same version the tests run,
instead of committing a copy of its code.

The random models we convert have no tokenizer, which the converter cannot cope with, so a
tiny wrapper (this file, run as a child process) imports the converter module, replaces the
model class's set_vocab with tokenizer model "none" (+ the vocab size, which llama.cpp needs
to size its logits) and then calls the converter's own main(). The vendored file is never
edited.

Library use:   convert(hf_dir, out_gguf, outtype="f32")
Command line:  python scripts/llama_cpp_converter.py HF_DIR OUT.gguf [--outtype f32]
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_SDIST_PREFIX = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
# What the converter imports: its entry script, the per-architecture conversion/ package and
# the gguf-py/ it puts on sys.path ahead of any installed gguf (the installed one may be older
# than the converter expects). LICENSE travels with the code we run.
# models/templates/: the chat templates llama.cpp ships (Google's Gemma 4 template, for
# tests/test_chat.py's check of the gemma4 fallback). grammars/: llama.cpp's GBNF grammars
# (tests/test_gbnf_corpus.py). models/ggml-vocab-*: llama.cpp's tokenizer suite, vocabulary
# files with their test inputs and expected ids (tests/test_tokenizer_suite.py).
# convert_lora_to_gguf.py: the PEFT -> GGUF adapter converter (tests/test_lora.py).
_WANTED = (
    "convert_hf_to_gguf.py",
    "convert_lora_to_gguf.py",
    "conversion/",
    "gguf-py/",
    "LICENSE",
    "models/templates/",
    "grammars/",
    "models/ggml-vocab-",
)
# Renamed when _WANTED grows, so an extraction made without the new files is redone.
_STAMP = ".frink-extracted-5"
_CHILD_FLAG = "--_frink_child"


def cache_dir() -> Path:
    """Where the extracted converter lives: $FRINK_HOME/cache or ~/.cache/frink."""
    home = os.environ.get("FRINK_HOME")
    base = Path(home) / "cache" if home else Path.home() / ".cache" / "frink"
    return base / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def _download_sdist(dest: Path) -> Path:
    # An explicit tarball (offline CI, or one already on disk) skips the network.
    local = os.environ.get("FRINK_LLAMA_CPP_SDIST")
    if local:
        return Path(local)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            "-d",
            str(dest),
        ],
        check=True,
    )
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if not found:
        raise RuntimeError(f"pip download left no llama-cpp-python sdist in {dest}")
    return found[0]


def ensure_converter(root: Path | None = None) -> Path:
    """Return a directory holding convert_hf_to_gguf.py, conversion/ and gguf-py/.

    Extracted once from the llama-cpp-python sdist; later calls reuse it.
    """
    root = Path(root) if root is not None else cache_dir()
    if (root / _STAMP).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent) as tmp:
        tmp_path = Path(tmp)
        sdist = _download_sdist(tmp_path / "dl")
        staging = tmp_path / "llama.cpp"
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar.getmembers():
                if not member.name.startswith(_SDIST_PREFIX):
                    continue
                rel = member.name[len(_SDIST_PREFIX) :]
                if not rel.startswith(_WANTED) or not (member.isfile() or member.isdir()):
                    continue
                target = staging / rel
                if member.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                assert src is not None
                with src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        if not (staging / "convert_hf_to_gguf.py").is_file():
            raise RuntimeError(f"{sdist} has no {_SDIST_PREFIX}convert_hf_to_gguf.py")
        (staging / _STAMP).write_text(f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}\n")
        # Another process may have won the race; theirs is as good as ours.
        if not (root / _STAMP).is_file():
            if root.exists():
                shutil.rmtree(root)
            staging.rename(root)
    return root


def convert(
    hf_dir: str | os.PathLike[str],
    out_gguf: str | os.PathLike[str],
    outtype: str = "f32",
    model_name: str | None = None,
    converter_dir: Path | None = None,
    extra_args: tuple[str, ...] = (),
) -> Path:
    """Convert a (tokenizer-less) HF model directory to GGUF with llama.cpp's converter.

    extra_args go to convert_hf_to_gguf.py as they are (e.g. "--no-mtp" for Qwen3.5 /
    Qwen3-Next configs without a multi-token-prediction block, which it otherwise asserts on).
    """
    src = ensure_converter(converter_dir)
    out = Path(out_gguf)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(src), str(src / "gguf-py")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            _CHILD_FLAG,
            str(src),
            str(hf_dir),
            "--outfile",
            str(out),
            "--outtype",
            outtype,
            *(["--model-name", model_name] if model_name else []),
            *extra_args,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,  # the failure is reported below with the converter's own output
    )
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(
            f"llama.cpp converter failed on {hf_dir} (exit {proc.returncode}):\n"
            + proc.stdout[-4000:]
            + proc.stderr[-4000:]
        )
    return out


def _child_main(src: str, converter_argv: list[str]) -> None:
    """Run inside the child: patch the converter's vocab handling, then call its main()."""
    sys.path[:0] = [src, str(Path(src) / "gguf-py")]
    import convert_hf_to_gguf as converter  # type: ignore[import-not-found]

    original_get_model_class = converter.get_model_class

    def set_vocab_none(self) -> None:  # type: ignore[no-untyped-def]
        self.gguf_writer.add_tokenizer_model("none")
        # Without a token list llama.cpp sizes its vocab (and so its logits) from this key.
        self.gguf_writer.add_vocab_size(self.hparams["vocab_size"])

    def get_model_class(name: str, mmproj: bool = False):  # type: ignore[no-untyped-def]
        cls = original_get_model_class(name, mmproj=mmproj)
        if not mmproj:
            cls.set_vocab = set_vocab_none
            _patch_gemma3_embedding_trim(cls)
            _patch_minimax_suppress_tokens(cls)
        return cls

    converter.get_model_class = get_model_class
    sys.argv = ["convert_hf_to_gguf.py", *converter_argv]
    converter.main()


def _patch_gemma3_embedding_trim(cls: type) -> None:
    # Gemma3Model.modify_tensors trims token_embd to the tokenizer's real vocab by reading
    # tokenizer.model / tokenizer.json, which a random model lacks. Every row of a random
    # model's embedding is real, so the trim is a no-op: skip straight to the parent class.
    from conversion.gemma import Gemma3Model  # type: ignore[import-not-found]

    if not issubclass(cls, Gemma3Model) or getattr(Gemma3Model, "_frink_patched", False):
        return
    original = Gemma3Model.modify_tensors

    def modify_tensors(self, data_torch, name, bid):  # type: ignore[no-untyped-def]
        has_tokenizer = any(
            (self.dir_model / f).is_file() for f in ("tokenizer.model", "tokenizer.json")
        )
        if "embed_tokens.weight" in name and not has_tokenizer:
            # norm_shift is 0 for the embedding, so nothing else of the override applies.
            yield from super(Gemma3Model, self).modify_tensors(data_torch, name, bid)
        else:
            yield from original(self, data_torch, name, bid)

    Gemma3Model.modify_tensors = modify_tensors
    Gemma3Model._frink_patched = True


def _patch_minimax_suppress_tokens(cls: type) -> None:
    # MiniMaxText01Model.set_gguf_parameters looks for zero embedding rows past the
    # tokenizer's vocab (AutoTokenizer + model.safetensors.index.json), which a random
    # model lacks. With no tokenizer there is no such row: it suppresses nothing.
    from conversion.minimax import MiniMaxText01Model  # type: ignore[import-not-found]

    if issubclass(cls, MiniMaxText01Model):
        cls._get_suppress_tokens = lambda self: None


def convert_lora_here(
    peft_dir: Path, base_hf_dir: Path, out_gguf: Path, outtype: str = "f32"
) -> Path:
    """Convert a PEFT LoRA directory to a GGUF adapter with llama.cpp's
    convert_lora_to_gguf.py, in this process (which must be a child that may import torch
    and the converter: a fixture maker). The base directory gives only its config.json."""
    src = ensure_converter()
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    argv = sys.argv
    sys.argv = ["convert_lora_to_gguf.py", "--base", str(base_hf_dir), "--outtype", outtype]
    sys.argv += ["--outfile", str(out_gguf), str(peft_dir)]
    try:
        # Its work is under `if __name__ == "__main__"`: run the file as a script.
        runpy.run_path(str(src / "convert_lora_to_gguf.py"), run_name="__main__")
    finally:
        sys.argv = argv
    return Path(out_gguf)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == _CHILD_FLAG:
        _child_main(argv[1], argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path)
    parser.add_argument("out_gguf", type=Path)
    parser.add_argument("--outtype", default="f32")
    parser.add_argument("--model-name", default=None)
    args = parser.parse_args(argv)
    print(convert(args.hf_dir, args.out_gguf, args.outtype, model_name=args.model_name))


if __name__ == "__main__":
    main()
