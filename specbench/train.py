"""Train a drafter for a target: the target writes continuations of a prompt corpus, the
drafter learns to predict them, and the result is saved where the benchmark can load it.

    python -m specbench.train drafter=eagle3                        # EAGLE-3 head for SmolLM2-135M
    python -m specbench.train drafter=eagle3 out=specbench/checkpoints/smollm2_135m/eagle3 steps=4000
    python -m specbench.train drafter=eagle ttt_steps=1              # EAGLE-1 head
    python -m specbench.train drafter=draft_model draft_layers=2     # a 2-layer draft model
    python -m specbench.train drafter=eagle3 target.path=/models/ckpt dataset.num_prompts=200 device=cuda

Keys (conf/train.yaml, schema TrainConfig below): the target and dataset groups as in
`python -m specbench` (default corpus: all 805 AlpacaEval instructions; the evaluation sets
mt_bench and humaneval are refused), and `drafter`, the choice of what to train: eagle, eagle3
or draft_model. `drafter` is a choice of the drafter config group (conf/drafter/), so that
`drafter=eagle3` reads the same as the benchmark's `+drafter=eagle3`; the group entry is
optional in train.yaml, so a drafter without a conf/drafter/<name>.yaml file trains all the same.

Pipeline: encode the prompts with the chat template (prompts over max_prompt_tokens are
skipped); the target continues them in left-padded batches (greedy, or sampled at
`temperature`); one teacher-forced pass records, at every position, the target's hidden states
at the layers the drafter reads plus its final-norm output (logits are recomputed from that
through the target's lm_head when needed, so a 49k-token vocabulary is never stored) and its
top-1 token. The last `held_out` fraction of the prompts is kept for the top-1 agreement that
is printed every `eval_every` steps and written to train_log.json.

- eagle / eagle3: pairs (feature at t, token t+1) -> the target's distribution at t+1, a soft
  cross-entropy (EAGLE-3: over the draft vocabulary, positions whose target top-1 is in it);
  EAGLE-1 adds a smooth-L1 regression to the next target feature (weights 1.0 and 0.1 on the
  regression and the cross-entropy, EAGLE-1's). Training-time test (`ttt_steps` > 1, EAGLE-3's
  default 3): step j feeds the head's own step j-1 output as the feature, the token one further
  on, positions + j, attending to step 0's keys causally and to its own earlier steps at the
  same position; step j's loss is weighted 0.8^j. EAGLE-3's draft vocabulary is the
  `draft_vocab_size` most frequent tokens of the generated continuations (d2t / t2d).
- draft_model: the target's architecture with `draft_layers` decoder layers copied from evenly
  spaced target layers (the first and the last for 2), the target's final norm, and the target's
  own embeddings and lm_head (shared, frozen); KL to the target's next-token distributions.

Heads train in float32 (bfloat16 autocast when the target is not float32, as on CUDA) and are
saved in `dtype`. Bad input stops before any model work with one line and exit status 2.

Letters: B sequences, T tokens, S = T - 1 head positions, H hidden size, n stored layers,
V the target's vocabulary, Vd the draft vocabulary.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from specbench import provenance
from specbench.config import ConfigError, DatasetConfig, TargetConfig, to_container
from specbench.config import register as register_specbench
from specbench.heads import Eagle3Head, EagleHeadConfig, HeadCache, build_head, causal_mask, save_head, text_config

TRAINABLE = ("eagle", "eagle3", "draft_model")
EVALUATION_SETS = ("mt_bench", "humaneval")
SAVE_DTYPES = ("float32", "float16", "bfloat16")
TTT_DECAY = 0.8  # EAGLE-3's weight on training-time-test step j: 0.8^j
EAGLE1_REGRESSION_WEIGHT, EAGLE1_CE_WEIGHT = 1.0, 0.1  # EAGLE-1's v_w and p_w
GRAD_CLIP = 0.5
WARMUP = 0.05  # fraction of the steps with a linearly rising learning rate, then cosine decay


@dataclass
class TrainConfig:
    target: TargetConfig = MISSING
    dataset: DatasetConfig = MISSING
    # What to train is the *choice* of the drafter group (drafter=eagle3); where
    # conf/drafter/<choice>.yaml exists its benchmark settings land here, unused.
    drafter: Any = None
    out: str = "outputs/train/${hydra:runtime.choices.drafter}"  # the checkpoint directory
    gen_tokens: int = 256  # continuation length per prompt (shorter when the target stops)
    gen_batch: int = 32  # prompts per generate call
    temperature: float = 0.0  # 0: greedy continuations
    max_prompt_tokens: int = 512  # longer prompts are skipped
    held_out: float = 0.1  # fraction of the prompts kept for the agreement measurement
    steps: int = 2000
    batch_size: int = 16  # sequences per step
    lr: float = 5e-4
    ttt_steps: Optional[int] = None  # training-time-test unroll; None: 3 for eagle3, 1 otherwise
    draft_vocab_size: int = 4096  # eagle3
    draft_layers: int = 2  # draft_model
    eval_every: int = 200
    seed: int = 0
    device: str = "auto"  # where the target and the drafter run (overrides target.device)
    dtype: str = "bfloat16"  # of the saved weights


def register() -> None:
    register_specbench()
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


# --- input checks ------------------------------------------------------------------------------


def check(cfg: DictConfig, kind: str) -> None:
    """Raises ConfigError on bad input, before any model work."""
    if kind not in TRAINABLE:
        raise ConfigError("drafter", kind, f"trainable drafters: {', '.join(TRAINABLE)}")
    if cfg.dataset.name in EVALUATION_SETS:
        raise ConfigError("dataset", cfg.dataset.name, "an evaluation set stays out of training; use alpaca_eval")
    positive = ("gen_tokens", "gen_batch", "max_prompt_tokens", "steps", "batch_size", "eval_every",
                "draft_vocab_size", "draft_layers")
    for key in positive:
        if cfg[key] < 1:
            raise ConfigError(key, cfg[key], "must be >= 1")
    if cfg.ttt_steps is not None and cfg.ttt_steps < 1:
        raise ConfigError("ttt_steps", cfg.ttt_steps, "must be >= 1")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise ConfigError("lr", cfg.lr, "must be a finite number > 0")
    if not (cfg.temperature >= 0 and math.isfinite(cfg.temperature)):
        raise ConfigError("temperature", cfg.temperature, "must be a finite number >= 0")
    if not 0 < cfg.held_out < 1:
        raise ConfigError("held_out", cfg.held_out, "must be in (0, 1)")
    if cfg.dtype not in SAVE_DTYPES:
        raise ConfigError("dtype", cfg.dtype, f"valid: {', '.join(SAVE_DTYPES)}")


def check_target_shape(cfg: DictConfig, kind: str, target_config: Any) -> None:
    """Checks against the target's config (read before its weights)."""
    text = text_config(target_config)
    if kind == "eagle3" and cfg.draft_vocab_size > text.vocab_size:
        raise ConfigError("draft_vocab_size", cfg.draft_vocab_size, f"exceeds the target's vocabulary ({text.vocab_size})")
    if kind == "draft_model" and cfg.draft_layers > text.num_hidden_layers:
        raise ConfigError("draft_layers", cfg.draft_layers, f"exceeds the target's {text.num_hidden_layers} layers")


# --- the corpus: what the target wrote, and its hidden states ----------------------------------


@dataclass
class Sequence:
    tokens: torch.Tensor  # [T] int64: prompt, then the target's continuation
    prompt_len: int
    hidden: torch.Tensor  # [T, n, H] the target's hidden states at Corpus.layers
    top1: torch.Tensor  # [T] int64 the target's argmax after reading tokens[: t + 1]


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T] int64, right-padded with 0
    hidden: torch.Tensor  # [B, T, n, H]
    top1: torch.Tensor  # [B, T]
    # [B, T] the target's distribution at t is a training target: continuation positions,
    # from the last prompt token (whose distribution is the first generated token's) to the end.
    valid: torch.Tensor
    lengths: torch.Tensor  # [B]

    @property
    def final(self) -> torch.Tensor:
        """[B, T, H] the target's final-norm output (the corpus stores it last)."""
        return self.hidden[:, :, -1]

    def features(self, indices: list) -> torch.Tensor:
        """[B, T, len(indices) * H]: stored layers `indices`, concatenated in order."""
        return self.hidden[:, :, indices].flatten(2)

    @property
    def attention_mask(self) -> torch.Tensor:
        return (torch.arange(self.tokens.shape[1], device=self.tokens.device) < self.lengths[:, None]).long()


@dataclass
class Corpus:
    layers: tuple  # hidden-state indices stored, ascending; the last is L, the final-norm output
    sequences: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sequences)

    def split(self, held_out: float) -> tuple[Corpus, Corpus]:
        """(train, held out): the last max(1, round(held_out * N)) sequences are held out."""
        n = max(1, round(held_out * len(self)))
        if len(self) - n < 1:
            raise ConfigError("dataset.num_prompts", len(self), "need at least 2 prompts: one is held out")
        return Corpus(self.layers, self.sequences[:-n]), Corpus(self.layers, self.sequences[-n:])

    def indices(self, layers: tuple) -> list:
        """Positions of hidden-state indices `layers` in the stored ones."""
        return [self.layers.index(i) for i in layers]

    def batch(self, rows, device) -> Batch:
        seqs = [self.sequences[int(i)] for i in rows]
        B, T = len(seqs), max(len(s.tokens) for s in seqs)
        n, H = seqs[0].hidden.shape[1:]
        tokens = torch.zeros(B, T, dtype=torch.int64, device=device)
        hidden = torch.zeros(B, T, n, H, dtype=seqs[0].hidden.dtype, device=device)
        top1 = torch.zeros(B, T, dtype=torch.int64, device=device)
        valid = torch.zeros(B, T, dtype=torch.bool, device=device)
        for b, s in enumerate(seqs):
            t = len(s.tokens)
            tokens[b, :t], hidden[b, :t], top1[b, :t] = s.tokens, s.hidden, s.top1
            valid[b, s.prompt_len - 1 : t] = True
        lengths = torch.tensor([len(s.tokens) for s in seqs], device=device)
        return Batch(tokens, hidden, top1, valid, lengths)

    def generated_tokens(self) -> torch.Tensor:
        """All continuation tokens, concatenated."""
        return torch.cat([s.tokens[s.prompt_len :] for s in self.sequences]).cpu()


def pad(rows: list, value: int, left: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """B x [T_b] -> (ids [B, T], attention mask [B, T]), padded on the left or the right."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), value, dtype=torch.int64)
    mask = torch.zeros(len(rows), T, dtype=torch.int64)
    for b, r in enumerate(rows):
        span = slice(T - len(r), T) if left else slice(0, len(r))
        ids[b, span], mask[b, span] = r, 1
    return ids.to(device), mask.to(device)


def until_eos(row: torch.Tensor, eos_ids: frozenset) -> torch.Tensor:
    """A generated row cut after its first end-of-sequence token (generate pads past it)."""
    stops = [i for i, t in enumerate(row.tolist()) if t in eos_ids]
    return row[: stops[0] + 1] if stops else row


@torch.inference_mode()
def continue_prompts(model, prompts: list, *, gen_tokens: int, temperature: float, eos_ids: frozenset,
                     pad_id: int) -> list:
    """B x [T_b] prompts -> B x [G_b] continuations, one left-padded generate call."""
    ids, mask = pad(prompts, pad_id, left=True, device=model.device)
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=gen_tokens, pad_token_id=pad_id,
                         eos_token_id=sorted(eos_ids) or None, **sampling)
    return [until_eos(row, eos_ids) for row in out[:, ids.shape[1] :].cpu()]


@torch.inference_mode()
def record_states(model, sequences: list, layers: tuple, batch_size: int) -> list:
    """One teacher-forced pass per batch -> N x (hidden [T, n, H] at `layers`, top1 [T])."""
    out = []
    lm_head = model.get_output_embeddings()
    for start in range(0, len(sequences), batch_size):
        chunk = sequences[start : start + batch_size]
        ids, mask = pad(chunk, 0, left=False, device=model.device)
        states = model.base_model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        hidden = torch.stack([states[i] for i in layers], dim=2)  # [B, T, n, H]
        top1 = lm_head(states[-1]).argmax(-1)  # [B, T]
        out += [(hidden[b, : len(s)].clone(), top1[b, : len(s)].clone()) for b, s in enumerate(chunk)]
    return out


def generate_corpus(model, prompts: list, *, layers: tuple, gen_tokens: int, batch_size: int, temperature: float,
                    eos_ids: frozenset, pad_id: int, seed: int = 0) -> Corpus:
    """The target continues every prompt (N x [T_n] int64) and its states are recorded at
    `layers` (ascending hidden-state indices, the final-norm index L last). Sequences keep the
    prompts' order; prompts of similar length share a generate call."""
    torch.manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    continuations = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        outs = continue_prompts(model, [prompts[i] for i in chunk], gen_tokens=gen_tokens, temperature=temperature,
                                eos_ids=eos_ids, pad_id=pad_id)
        for i, c in zip(chunk, outs):
            continuations[i] = c
    sequences = [torch.cat([p.cpu(), c]) for p, c in zip(prompts, continuations)]
    states = record_states(model, sequences, layers, batch_size)
    return Corpus(tuple(layers), [Sequence(s.to(h.device), len(p), h, t)
                                  for s, p, (h, t) in zip(sequences, prompts, states)])


def stored_layers(head_config: Optional[EagleHeadConfig], num_layers: int) -> tuple:
    """Hidden-state indices the corpus keeps: the drafter's features and the final-norm output."""
    features = set(head_config.feature_layers) if head_config is not None else set()
    return tuple(sorted(features | {num_layers}))


def draft_vocab(corpus: Corpus, vocab_size: int, size: int) -> torch.Tensor:
    """[size] ascending target ids: the most frequent tokens of the continuations (ties and
    unseen tokens by id)."""
    counts = torch.bincount(corpus.generated_tokens(), minlength=vocab_size)
    order = torch.sort(counts, descending=True, stable=True).indices
    return order[:size].sort().values


# --- heads: training-time test -----------------------------------------------------------------


def shifted(x: torch.Tensor, k: int, S: int, fill=0) -> torch.Tensor:
    """x[:, k : k + S], padded with `fill` to S columns: [B, T, ...] -> [B, S, ...]."""
    out = x[:, k : k + S]
    missing = S - out.shape[1]
    if missing > 0:
        out = torch.cat([out, out.new_full((x.shape[0], missing, *x.shape[2:]), fill)], dim=1)
    return out


def ttt_mask(S: int, step: int, dtype: torch.dtype, device) -> torch.Tensor:
    """[1, 1, S, (step + 1) S] additive mask of training-time-test step `step` >= 1: the keys of
    step 0 causally, those of steps 1..step at the same position only."""
    eye = torch.eye(S, dtype=torch.bool, device=device)
    seen = torch.cat([causal_mask(S, 0, device)] + [eye] * step, dim=1)
    return torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill(~seen, torch.finfo(dtype).min)[None, None]


def unroll(head, tokens: torch.Tensor, features: torch.Tensor, steps: int) -> Iterator[torch.Tensor]:
    """The head's hidden output [B, S, H] at each training-time-test step, S = T - 1.

    Step j at position t reads token t+1+j and the feature of step j-1 (the target's feature at
    t for j = 0), at position id t + j; its output predicts the target's distribution at t+1+j."""
    B, T = tokens.shape
    S = T - 1
    cache = HeadCache()
    positions = torch.arange(S, device=tokens.device).expand(B, S)
    feature = features[:, :S]
    for j in range(steps):
        mask = ttt_mask(S, j, head.fc.weight.dtype, tokens.device) if j else None
        hidden = head.hidden_states(feature, shifted(tokens, 1 + j, S), positions + j, cache, mask)
        yield hidden
        feature = hidden


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def soft_cross_entropy(target_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """[.., V] each -> [..]: -sum p log q, p = softmax(target), q = softmax(logits), in float32."""
    return -(target_logits.float().softmax(-1) * logits.float().log_softmax(-1)).sum(-1)


def step_loss(head, batch: Batch, hidden: torch.Tensor, j: int, lm_weight: torch.Tensor) -> torch.Tensor:
    """The loss of TTT step j, whose outputs predict the target's distribution at t+1+j."""
    S = hidden.shape[1]
    final = shifted(batch.final, 1 + j, S)  # [B, S, H]
    valid = shifted(batch.valid, 1 + j, S, fill=False)
    if isinstance(head, Eagle3Head):
        with torch.no_grad():
            target = F.linear(final, lm_weight[head.draft_ids])  # [B, S, Vd]
            valid = valid & head.t2d[shifted(batch.top1, 1 + j, S)]  # EAGLE-3 trains where top-1 is drafted
        return masked_mean(soft_cross_entropy(target, head.draft_logits(hidden)), valid)
    with torch.no_grad():
        target = F.linear(final, lm_weight)  # [B, S, V]
    regression = F.smooth_l1_loss(hidden.float(), final.float(), reduction="none").mean(-1)
    ce = soft_cross_entropy(target, head.logits(hidden))
    return masked_mean(EAGLE1_REGRESSION_WEIGHT * regression + EAGLE1_CE_WEIGHT * ce, valid)


def head_loss(head, batch: Batch, feature_idx: list, ttt_steps: int, lm_weight: torch.Tensor) -> torch.Tensor:
    steps = unroll(head, batch.tokens, batch.features(feature_idx), ttt_steps)
    return sum(TTT_DECAY**j * step_loss(head, batch, hidden, j, lm_weight) for j, hidden in enumerate(steps))


@torch.no_grad()
def head_agreement(head, corpus: Corpus, *, ttt_steps: int = 1, batch_size: int = 16, amp=None) -> list:
    """Held-out top-1 agreement with the target at each TTT step: the fraction of continuation
    positions where the head's argmax (over the target vocabulary) is the target's."""
    device = head.fc.weight.device
    idx = corpus.indices(head.config.feature_layers)
    hits, counts = [0] * ttt_steps, [0] * ttt_steps
    for start in range(0, len(corpus), batch_size):
        batch = corpus.batch(range(start, min(start + batch_size, len(corpus))), device)
        with autocast(device, amp):
            for j, hidden in enumerate(unroll(head, batch.tokens, batch.features(idx), ttt_steps)):
                S = hidden.shape[1]
                valid = shifted(batch.valid, 1 + j, S, fill=False)
                agree = head.logits(hidden).argmax(-1) == shifted(batch.top1, 1 + j, S)
                hits[j] += int((agree & valid).sum())
                counts[j] += int(valid.sum())
    return [h / max(c, 1) for h, c in zip(hits, counts)]


def train_head(head, train: Corpus, held: Corpus, lm_weight: torch.Tensor, *, steps: int, batch_size: int,
               lr: float, ttt_steps: int, eval_every: int, seed: int = 0, amp=None) -> dict:
    """Train an EagleHead / Eagle3Head in place on `train`, measuring agreement on `held`.
    lm_weight: [V, H] the target's lm_head weight. -> {"history", "agreement_untrained",
    "agreement", "agreement_by_step"} (agreement: step 0, teacher-forced features)."""
    idx = train.indices(head.config.feature_layers)

    def loss(batch: Batch) -> torch.Tensor:
        return head_loss(head, batch, idx, ttt_steps, lm_weight)

    def evaluate() -> list:
        head.eval()
        out = head_agreement(head, held, ttt_steps=ttt_steps, batch_size=batch_size, amp=amp)
        head.train()
        return out

    return fit(head, loss, evaluate, train, steps=steps, batch_size=batch_size, lr=lr, eval_every=eval_every,
               seed=seed, amp=amp)


# --- draft model -------------------------------------------------------------------------------


def source_layers(num_layers: int, n: int) -> list:
    """n evenly spaced target layers, the first and the last included (the first alone for 1)."""
    return torch.linspace(0, num_layers - 1, n).round().long().tolist()


def make_draft_model(target, num_layers: int):
    """The target's architecture with `num_layers` decoder layers copied from evenly spaced
    target layers and its final norm, in float32; embeddings and lm_head are the target's own
    modules (shared, frozen)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(target.config)
    sources = source_layers(config.num_hidden_layers, num_layers)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = [config.layer_types[i] for i in sources]
    draft = AutoModelForCausalLM.from_config(config, dtype=torch.float32).to(target.device)
    for layer, source in zip(draft.base_model.layers, sources):
        layer.load_state_dict(target.base_model.layers[source].state_dict())
    draft.base_model.norm.load_state_dict(target.base_model.norm.state_dict())
    draft.set_input_embeddings(target.get_input_embeddings().requires_grad_(False))
    draft.set_output_embeddings(target.get_output_embeddings().requires_grad_(False))
    return draft


def kl_to_target(draft, batch: Batch) -> torch.Tensor:
    """Mean KL(target || draft) of the next-token distributions over continuation positions."""
    logits = draft(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits  # [B, T, V]
    with torch.no_grad():
        target = draft.get_output_embeddings()(batch.final).float().log_softmax(-1)
    kl = (target.exp() * (target - logits.float().log_softmax(-1))).sum(-1)
    return masked_mean(kl, batch.valid)


@torch.no_grad()
def draft_agreement(draft, corpus: Corpus, *, batch_size: int = 16, amp=None) -> float:
    device = draft.get_input_embeddings().weight.device
    hits = counts = 0
    for start in range(0, len(corpus), batch_size):
        batch = corpus.batch(range(start, min(start + batch_size, len(corpus))), device)
        with autocast(device, amp):
            logits = draft(input_ids=batch.tokens, attention_mask=batch.attention_mask).logits
        hits += int(((logits.argmax(-1) == batch.top1) & batch.valid).sum())
        counts += int(batch.valid.sum())
    return hits / max(counts, 1)


def train_draft_model(draft, train: Corpus, held: Corpus, *, steps: int, batch_size: int, lr: float,
                      eval_every: int, seed: int = 0, amp=None) -> dict:
    """Train a draft model's own layers in place (KL to the target). -> as train_head."""

    def evaluate() -> list:
        draft.eval()
        out = [draft_agreement(draft, held, batch_size=batch_size, amp=amp)]
        draft.train()
        return out

    return fit(draft, lambda batch: kl_to_target(draft, batch), evaluate, train, steps=steps,
               batch_size=batch_size, lr=lr, eval_every=eval_every, seed=seed, amp=amp)


# --- the optimisation loop ---------------------------------------------------------------------


def autocast(device, dtype: Optional[torch.dtype]):
    """Mixed precision at `dtype`, or nothing for None."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def schedule(steps: int) -> Callable[[int], float]:
    """Learning-rate factor: linear warm-up over WARMUP of the steps, then cosine to 0."""
    warm = max(1, round(WARMUP * steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    return factor


def fit(module, loss_of: Callable[[Batch], torch.Tensor], evaluate: Callable[[], list], train: Corpus, *,
        steps: int, batch_size: int, lr: float, eval_every: int, seed: int, amp) -> dict:
    """AdamW on the module's trainable parameters over random batches of `train`; evaluates
    before training, every `eval_every` steps and at the end, printing progress."""
    params = [p for p in module.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(steps))
    device = params[0].device
    g = torch.Generator().manual_seed(seed)
    untrained = evaluate()
    history, running = [], []
    module.train()
    for step in range(1, steps + 1):
        batch = train.batch(torch.randint(len(train), (batch_size,), generator=g), device)
        with autocast(device, amp):
            loss = loss_of(batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        scheduler.step()
        running.append(loss.item())
        if step % eval_every == 0 or step == steps:
            agreement = evaluate()
            history.append({"step": step, "loss": sum(running) / len(running), "agreement": agreement})
            print(f"step {step}/{steps}  loss {history[-1]['loss']:.4f}  held-out top-1 agreement "
                  + " ".join(f"{a:.3f}" for a in agreement), flush=True)
            running = []
    module.eval()
    final = history[-1]["agreement"]
    return {"history": history, "agreement_untrained": untrained[0], "agreement": final[0], "agreement_by_step": final}


# --- the command -------------------------------------------------------------------------------


def train(cfg: DictConfig, kind: str) -> dict:
    """The whole pipeline for drafter `kind`; writes the checkpoint and train_log.json into
    cfg.out and returns the log."""
    from transformers import AutoConfig

    from specbench.datasets import load_prompts
    from specbench.models import check_path, checkpoint_dir, load_target

    check(cfg, kind)
    check_path(cfg.target)
    prompts = load_prompts(cfg.dataset)
    check_target_shape(cfg, kind, AutoConfig.from_pretrained(checkpoint_dir(cfg.target)))
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_target(OmegaConf.merge(cfg.target, {"device": cfg.device}))
    model.requires_grad_(False)
    head_config = None if kind == "draft_model" else EagleHeadConfig.from_target(
        model.config, kind, draft_vocab_size=cfg.draft_vocab_size if kind == "eagle3" else None)
    corpus, stats = make_corpus(cfg, model, tokenizer, prompts, head_config)
    train_set, held = corpus.split(cfg.held_out)
    stats.update(train_sequences=len(train_set), held_out_sequences=len(held))
    print(f"corpus: {stats}", flush=True)
    amp = None if model.dtype == torch.float32 else model.dtype
    common = dict(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, eval_every=cfg.eval_every, seed=cfg.seed, amp=amp)
    started = time.perf_counter()
    if kind == "draft_model":
        result, coverage = save_trained_draft_model(model, train_set, held, cfg, common), None
    else:
        result, coverage = save_trained_head(model, head_config, train_set, held, cfg, common)
    log = {"drafter": kind, **provenance_of(cfg, model), "train_seconds": round(time.perf_counter() - started, 1),
           "corpus": stats, "draft_vocab_coverage": coverage, **result}
    (Path(cfg.out) / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"saved {kind} to {cfg.out}: held-out top-1 agreement {log['agreement']:.3f} "
          f"(untrained {log['agreement_untrained']:.3f})", flush=True)
    return log


def make_corpus(cfg: DictConfig, model, tokenizer, prompts: list, head_config) -> tuple[Corpus, dict]:
    """Encode the prompts (skipping long ones), let the target continue them, record its
    states. -> (corpus, statistics for the log)."""
    from specbench.datasets import encode_prompts
    from specbench.run import eos_ids

    encoded = [p for p in encode_prompts(prompts, tokenizer) if len(p) <= cfg.max_prompt_tokens]
    if len(encoded) < 2:
        raise ConfigError("max_prompt_tokens", cfg.max_prompt_tokens, f"leaves {len(encoded)} prompts; need 2 or more")
    eos = eos_ids(tokenizer, model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0)
    started = time.perf_counter()
    corpus = generate_corpus(
        model, encoded, layers=stored_layers(head_config, text_config(model.config).num_hidden_layers),
        gen_tokens=cfg.gen_tokens, batch_size=cfg.gen_batch, temperature=cfg.temperature, eos_ids=eos,
        pad_id=pad_id, seed=cfg.seed,
    )
    stats = {"prompts": len(prompts), "skipped_long_prompts": len(prompts) - len(encoded),
             "generated_tokens": len(corpus.generated_tokens()), "gen_seconds": round(time.perf_counter() - started, 1)}
    return corpus, stats


def save_trained_head(model, head_config, train_set, held, cfg, common) -> tuple[dict, Optional[float]]:
    """Build, train and save a head. -> (train_head's result, EAGLE-3's draft-vocabulary
    coverage of the training continuations, or None)."""
    head = build_head(head_config, model)
    coverage = None
    if isinstance(head, Eagle3Head):
        head.set_draft_vocab(draft_vocab(train_set, head_config.vocab_size, head_config.draft_vocab_size))
        coverage = float(head.t2d.cpu()[train_set.generated_tokens()].float().mean())
    ttt = cfg.ttt_steps or (3 if head_config.kind == "eagle3" else 1)
    result = train_head(head, train_set, held, model.get_output_embeddings().weight, ttt_steps=ttt, **common)
    save_head(head, cfg.out, dtype=getattr(torch, cfg.dtype))
    return result, coverage


def save_trained_draft_model(model, train_set, held, cfg, common) -> dict:
    """Build, train and save a draft model (its own layers, in cfg.dtype)."""
    from specbench.drafters.draft_model import save_draft_model

    draft = make_draft_model(model, cfg.draft_layers)
    result = train_draft_model(draft, train_set, held, **common)
    save_draft_model(draft, cfg.out, dtype=getattr(torch, cfg.dtype))
    return result


def provenance_of(cfg: DictConfig, model) -> dict:
    return {
        "config": to_container(cfg), "git_sha": provenance.git_sha(), **provenance.versions(),
        "device": provenance.device_name(model.device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def main() -> None:
    import hydra
    from hydra.core.hydra_config import HydraConfig

    from specbench.__main__ import check_group_choices, flags_first

    conf = Path(__file__).resolve().parent.parent / "conf"

    @hydra.main(version_base="1.3", config_path=str(conf), config_name="train")
    def app(cfg: DictConfig) -> None:
        try:
            train(cfg, HydraConfig.get().runtime.choices.get("drafter"))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    sys.argv[1:] = flags_first(sys.argv[1:])
    # The drafter choice is checked by train(): any name may be chosen, not only conf/drafter/'s.
    check_group_choices([a for a in sys.argv[1:] if a.lstrip("+~").partition("=")[0] != "drafter"])
    register()
    app()


if __name__ == "__main__":
    main()
