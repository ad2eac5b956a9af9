"""Random LoRA adapters over a tiny base model, and their references (tests/test_lora.py).

For each adapter spec: a PEFT LoRA made with peft on the base's HF weights (A and B drawn
at random: peft starts B at zero, which would test nothing), saved as a PEFT directory;
transformers + peft logits at several scales; for the specs llama.cpp can run (no rsLoRA:
its converter writes alpha alone), the adapter converted by llama.cpp's
convert_lora_to_gguf.py and llama.cpp's logits and greedy tokens with it on the base's
GGUF. Run as a child process (torch, peft and llama_cpp stay out of the test process);
idempotent through a stamp.

Command line:  python scripts/make_lora_fixtures.py TINY_MODELS_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llama_cpp_converter  # noqa: E402
import make_tiny_models  # noqa: E402

_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# name -> (tiny base model, target modules, r, lora_alpha, use_rslora, llama.cpp reference).
# llama_q: a base whose GGUF holds quantized matrices (Q8_0 / Q4_0 ...), which the adapter
# leaves quantized.
SPECS: dict[str, tuple[str, tuple[str, ...], int, int, bool, bool]] = {
    "qv": ("llama", ("q_proj", "v_proj"), 4, 12, False, True),
    "all": ("llama", _ALL, 8, 4, False, True),
    "all_rs": ("llama", _ALL, 8, 16, True, False),
    "q_all": ("llama_q", _ALL, 8, 16, False, True),
}
SCALES = (1.0, 0.5, 0.0)
GREEDY_NEW = 8
_STAMP = "stamp-1.json"


def _peft_adapter(base_hf: Path, out: Path, spec: tuple[Any, ...], seed: int) -> Any:
    """The PEFT model over the base with random A and B, saved to `out`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    _, targets, r, alpha, rslora, _ = spec
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_hf, dtype=torch.float32)
    conf = LoraConfig(
        r=r, lora_alpha=alpha, target_modules=list(targets), use_rslora=rslora, lora_dropout=0.0
    )
    pm = get_peft_model(model, conf)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.2)
    pm.save_pretrained(out)
    return pm.eval()


def _scaled_logits(pm: Any, tokens: np.ndarray, scale: float) -> np.ndarray:
    """transformers + peft logits with every LoRA layer's scaling times `scale`."""
    import torch

    for mod in pm.modules():
        scaling = getattr(mod, "scaling", None)
        if isinstance(scaling, dict):
            base = mod.__dict__.setdefault("_frink_scaling", dict(scaling))
            mod.scaling = {k: v * scale for k, v in base.items()}
    with torch.no_grad():
        return pm(torch.tensor(tokens[None].astype(np.int64))).logits[0].numpy()


def make(tiny_root: Path, out_dir: Path) -> None:
    """Every spec's adapter and references into out_dir (written aside, then renamed, so a
    concurrent maker's result is as good)."""
    if (out_dir / _STAMP).is_file():
        return
    make_tiny_models._quiet_transformers()
    final, out_dir = out_dir, out_dir.with_name(f"{out_dir.name}.{os.getpid()}.part")
    out_dir.mkdir(parents=True, exist_ok=True)
    for i, (name, spec) in enumerate(SPECS.items()):
        tiny_dir = tiny_root / spec[0]
        tokens = np.load(tiny_dir / "ref.npz")["tokens"]
        peft_dir = out_dir / name
        pm = _peft_adapter(tiny_dir / "hf", peft_dir, spec, seed=100 + i)
        ref: dict[str, np.ndarray] = {"tokens": tokens}
        for s in SCALES:
            ref[f"hf_{s}"] = _scaled_logits(pm, tokens, s)
        if spec[5]:
            gguf = llama_cpp_converter.convert_lora_here(
                peft_dir, tiny_dir / "hf", out_dir / f"{name}.gguf"
            )
            for s in SCALES[:2]:
                lora = (gguf, s)
                ref[f"cpp_{s}"] = make_tiny_models.llama_cpp_logits(
                    tiny_dir / "model.gguf", tokens, lora=lora
                )
                ref[f"cpp_greedy_{s}"], _ = make_tiny_models.llama_cpp_greedy(
                    tiny_dir / "model.gguf", tokens, GREEDY_NEW, lora=lora
                )
        np.savez(out_dir / f"{name}_ref.npz", **ref)
    (out_dir / _STAMP).write_text(json.dumps({"specs": list(SPECS)}))
    if final.exists():
        shutil.rmtree(out_dir)
    else:
        out_dir.rename(final)


def main() -> None:
    make(Path(sys.argv[1]), Path(sys.argv[2]))


if __name__ == "__main__":
    main()
