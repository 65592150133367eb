import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels (specbench.kernels) run only in Triton's interpreter, which
# TRITON_INTERPRET=1 selects when triton is first imported (its own tl.* helpers are jit
# functions too), so it is set here, before anything imports triton (transformers' models do).
# It changes nothing else on such a machine; with CUDA it stays unset and the kernels compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from transformers import LlamaConfig, LlamaForCausalLM

from specbench.drafters.base import DraftProposal, DraftState


TOY_P = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.07, 0.03])  # the write-up's toy target


def chi2_pvalue(tokens: torch.Tensor, p: torch.Tensor) -> float:
    """Chi-square goodness of fit of drawn tokens [n] (values < len(p)) to the distribution p."""
    from scipy import stats

    counts = torch.bincount(tokens.cpu(), minlength=len(p)).double()
    p = p.double() / p.double().sum()
    return stats.chisquare(counts.numpy(), (p * counts.sum()).numpy()).pvalue


def tiny_tokenizer(chat: bool):
    """A word-level tokenizer built in memory: no hub access, no files."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|end|>", "hello", "world", "again"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if chat:
        # Writes its own BOS, as real templates do; encode_prompts must not add a second one.
        tok.chat_template = (
            "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|> {{ m.content }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}"
        )
    return tok


def tiny_llama(seed: int, scale: float, max_positions: int = 512, bos: int = 0, eos: int = 1) -> LlamaForCausalLM:
    """A 2-layer Llama over 96 tokens with random fp32 weights, deterministic for a seed.

    The weight matrices are multiplied by `scale`: the default init gives near-uniform logits;
    8 gives clear greedy argmaxes, 16 moderate peaks (top-1 about 0.4)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(scale)
    return model


ENGINES = ("hf", "native")


def make_engine(kind: str, model, rows: int = 1, max_length: int = 256, feature_layers: tuple = ()):
    """An engine of either kind over a transformers model (native: its weights, fused)."""
    from specbench.engines.hf import HFEngine
    from specbench.engines.native import NativeEngine, Transformer

    if kind == "hf":
        return HFEngine(model, rows, feature_layers=feature_layers)
    return NativeEngine(Transformer.from_hf(model), rows, max_length, feature_layers=feature_layers)


def random_head(target, kind: str, draft_vocab_size: int, seed: int = 0, fc_bias: bool = False):
    """An fp32 EAGLE / EAGLE-3 head for `target` with every weight random, norms included (so a
    weight that fails to load shows; peaked enough for well separated top-k children). EAGLE-3
    drafts over a random sorted subset of draft_vocab_size target tokens; fc_bias: EAGLE's fc
    with a bias."""
    from specbench.heads import EagleHeadConfig, build_head

    config = EagleHeadConfig.from_target(target.config, kind, draft_vocab_size=draft_vocab_size if kind == "eagle3" else None)
    config.fc_bias = fc_bias and kind == "eagle"
    head = build_head(config, target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    if kind == "eagle3":
        head.set_draft_vocab(torch.randperm(target.config.vocab_size, generator=g)[:draft_vocab_size].sort().values)
    return head.eval()


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is fastest, and immune to a busy second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def few_tiles(configs: list) -> list:
    """Of an autotuner's tile configurations, the first of each kind the kernels compile
    differently: split K or not, the software-pipelined loop or not, 1024-wide K tiles or not."""
    kinds = {}
    for c in configs:
        kw = c.kwargs
        kinds.setdefault((kw.get("SPLIT_K", 1) > 1, kw.get("LOOP_STAGES", 0) > 0, kw.get("BLOCK_K") == 1024), c)
    return list(kinds.values())


@pytest.fixture(scope="session", autouse=True)
def few_tiles_on_cuda():
    """On a GPU every new shape tunes every tile of the kernel it launches (22 for the rows
    kernel with split K): on a fresh machine the CUDA tests ran past two 10-minute calls
    (results/2026-12-07-h100-wide). The tests check what the kernels compute, not which tile
    is fastest, so each of specbench.kernels.gemv's autotuners keeps `few_tiles` of its tiles
    here (1 to 4; test_gemv launches every tile once); the benchmarks tune over all of them."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:  # no triton: the kernels' tests skip
        Autotuner = None
    if Autotuner is None or not torch.cuda.is_available():
        yield
        return

    from specbench.kernels import gemv

    tuners = [t for t in vars(gemv).values() if isinstance(t, Autotuner)]
    saved = [t.configs for t in tuners]
    for t in tuners:
        t.configs = few_tiles(t.configs)
    yield
    for t, configs in zip(tuners, saved):
        t.configs = configs


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama(seed=0, scale=8.0)


class ScriptedDrafter:
    """Proposes a known continuation, corrupting each token with probability `noise`: a drafter
    whose acceptance we control, so both the accept and the reject paths are exercised."""

    name = "scripted"

    def __init__(self, prompt_len: int, continuation: list, noise: float, vocab: int, seed: int = 0):
        self.prompt_len, self.continuation, self.noise, self.vocab = prompt_len, continuation, noise, vocab
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, state: DraftState) -> DraftProposal:
        done = state.tokens[0].shape[0] - self.prompt_len
        guess = torch.tensor(self.continuation[done : done + state.k], dtype=torch.long)
        m = guess.shape[0]
        flip = torch.rand(m, generator=self.g) < self.noise
        guess = torch.where(flip, torch.randint(2, self.vocab, (m,), generator=self.g), guess)
        tokens = torch.full((1, state.k), -1, dtype=torch.long)
        tokens[0, :m] = guess
        return DraftProposal(tokens=tokens, num_tokens=torch.tensor([m]))


class SelfDrafter:
    """Drafts by sampling the model itself (no cache: tiny models only), returning its q.
    Plausible drafts with moderate probabilities: the case where a lossy rule shows."""

    name = "self"

    def __init__(self, model, params, seed: int = 0):
        self.model, self.params = model, params
        self.g = torch.Generator().manual_seed(seed)

    @torch.inference_mode()
    def propose(self, state: DraftState) -> DraftProposal:
        from specbench.sampling import probs_from_logits, sample

        tokens, probs = [], []
        for seq in state.tokens:  # request by request
            for _ in range(state.k):
                q = probs_from_logits(self.model(seq[None]).logits[:, -1], self.params)  # [1, V]
                x = sample(q, self.g)
                tokens.append(x)
                probs.append(q)
                seq = torch.cat([seq, x])
        B = len(state.tokens)
        return DraftProposal(
            tokens=torch.cat(tokens).view(B, state.k), num_tokens=torch.full((B,), state.k),
            probs=torch.cat(probs).view(B, state.k, -1),
        )


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A local checkpoint directory (random 2-layer Llama + word-level chat tokenizer), loadable
    as target.path like any Hugging Face checkpoint. The model's vocabulary is padded past the
    tokenizer's, as real checkpoints often are."""
    tokenizer = tiny_tokenizer(chat=True)
    model = tiny_llama(seed=1, scale=8.0, max_positions=1024, bos=tokenizer.bos_token_id, eos=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
