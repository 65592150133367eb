"""Layer-skip self-speculation: the target's first L layers, its final norm and its LM head are
the draft (as in LayerSkip / Draft & Verify). No extra weights: the draft shares the target's
parameters and keeps a KV cache of its own for its L layers, one per request (B requests at a
time) until `release`. Chains and trees of the B requests are drafted together on the native
engine (specbench.drafters.native_chain, over a fused copy of the first L layers, the final
norm and the head); request by request over the shared view (specbench.drafters.expand) where
the native engine cannot run it.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from specbench.config import ConfigError, LayerSkipConfig
from specbench.drafters.expand import ChainsAndTrees, Steppers, check_sample_method
from specbench.drafters.lm_stepper import LMStepper
from specbench.drafters.native_chain import MAX_LENGTH, ROWS, NativeChain
from specbench.sampling import SamplingParams


def truncated(model, layers: int):
    """A view of a transformers decoder-only model that runs only its first `layers` layers
    (then the final norm and the LM head). Shares every parameter; copies no tensor."""
    total = model.config.num_hidden_layers
    if not 1 <= layers <= total:
        raise ConfigError("drafter.layers", layers, f"need 1 <= layers <= {total} (the target's layers)")
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    inner = copy.copy(model.model)
    inner._modules = dict(model.model._modules)  # a shallow copy would share the module dict
    inner.layers = nn.ModuleList(model.model.layers[:layers])
    inner.config = config
    outer = copy.copy(model)
    outer._modules = dict(model._modules)
    outer.model = inner
    outer.config = config
    return outer


class LayerSkipDrafter(ChainsAndTrees):
    name = "layerskip"
    feature_layers = ()

    def __init__(self, layers: int, draft_sample_method: str, params: SamplingParams, seed: int = 0):
        if layers < 1:
            raise ConfigError("drafter.layers", layers, "must be >= 1")
        check_sample_method(draft_sample_method)
        self.layers, self.method, self.params, self.seed = layers, draft_sample_method, params, seed
        self.model = None  # the truncated view of the target, once attached
        self.steppers: Optional[Steppers] = None  # request id -> LMStepper (where chain cannot run)
        self.chain: Optional[NativeChain] = None  # chains and trees, batched
        self.generator: Optional[torch.Generator] = None

    @classmethod
    def from_config(cls, cfg: LayerSkipConfig, params: SamplingParams, seed: int = 0) -> LayerSkipDrafter:
        return cls(cfg.layers, cfg.draft_sample_method, params, seed)

    def attach(self, target, rows: int = ROWS, max_length: int = MAX_LENGTH, *, cuda_graphs: bool = True,
               compile: bool = False) -> None:
        """rows, max_length: the batched chains' cache (the run's batch size and longest request;
        it grows if short); cuda_graphs: their forwards replayed from CUDA graphs on CUDA (the
        run's engine.cuda_graphs); compile: their layers through torch.compile (engine.compile)."""
        from specbench.engines.native import Transformer

        self.model = view = truncated(target, self.layers)
        self.steppers = Steppers(lambda: LMStepper(view))
        self.chain = NativeChain(lambda: Transformer.from_hf(view), rows, max_length, cuda_graphs=cuda_graphs,
                                 compile=compile)
        self.generator = torch.Generator(next(view.parameters()).device).manual_seed(self.seed)
