"""Layer-skip self-speculation: the target's first L layers, its final norm and its LM head are
the draft (as in LayerSkip / Draft & Verify). No extra weights: the draft shares the target's
parameters and keeps a KV cache of its own for its L layers.
"""

from __future__ import annotations

import copy
from typing import Optional

import torch
from torch import nn

from specbench.config import ConfigError, LayerSkipConfig
from specbench.drafters.base import DraftProposal, DraftState
from specbench.drafters.expand import check_sample_method, draft
from specbench.drafters.lm_stepper import LMStepper
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


class LayerSkipDrafter:
    name = "layerskip"
    feature_layers = ()

    def __init__(self, layers: int, draft_sample_method: str, params: SamplingParams, seed: int = 0):
        if layers < 1:
            raise ConfigError("drafter.layers", layers, "must be >= 1")
        check_sample_method(draft_sample_method)
        self.layers, self.method, self.params, self.seed = layers, draft_sample_method, params, seed
        self.stepper: Optional[LMStepper] = None
        self.generator: Optional[torch.Generator] = None

    @classmethod
    def from_config(cls, cfg: LayerSkipConfig, params: SamplingParams, seed: int = 0) -> LayerSkipDrafter:
        return cls(cfg.layers, cfg.draft_sample_method, params, seed)

    def attach(self, target) -> None:
        self.stepper = LMStepper(truncated(target, self.layers))
        self.generator = torch.Generator(self.stepper.device).manual_seed(self.seed)

    def propose(self, state: DraftState) -> DraftProposal:
        return draft(self.stepper, state, self.method, self.params, self.generator)
