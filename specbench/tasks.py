"""Tasks other than decoding, selected by experiment configs (`task: ...`).

Each takes (cfg, row template) and returns (rows, per-request records) like specbench.run.run.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from omegaconf import DictConfig

from specbench import provenance, rulecheck
from specbench.config import validate
from specbench.datasets import encode_prompts, load_prompts
from specbench.figures import distcheck_figure
from specbench.models import check_path, load_target
from specbench.report import table
from specbench.sampling import SamplingParams, probs_from_logits

RULECHECK_COLUMNS = (
    "rule_label", "prompt_id", "position", "entropy", "acceptance_rate", "expected_acceptance", "chi2", "chi2_dof",
    "chi2_pvalue", "tv", "tv_low", "tv_high", "draw_s",
)


def _rows(template: dict, results: list) -> list:
    """One row per result; each its own run_id (the run's, suffixed) so rows stay addressable."""
    return [{**template, **r, "run_id": f"{template['run_id']}-{i}", "status": "ok"} for i, r in enumerate(results)]


def toy_rules(cfg: DictConfig, row: dict) -> tuple[list, list]:
    """The write-up's toy, every rule, and its Markov chain; draws on one CPU thread."""
    validate(cfg)
    rc = cfg.rulecheck
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the write-up's script is single-threaded: compare like with like
    try:
        p, q = torch.tensor(rulecheck.TOY_P), torch.tensor(rulecheck.TOY_Q)
        single = rulecheck.check_position(p, q, rc.draws, cfg.seed, tree_size=rc.tree_size, threshold_acc=rc.threshold_acc)
        markov = [
            rulecheck.markov_check(rule, rc.draws, cfg.seed, k=rc.markov_k, length=rc.markov_length)
            for rule in ("standard", "onehot", "target_only")
        ]
    finally:
        torch.set_num_threads(threads)
    template = {**row, "task": "toy_rules", "target": "toy", "dataset": None, "device": "cpu (1 thread)"}
    rows = _rows(template, single + markov)
    lossless_s = sum(r["draw_s"] for r in single if r["rule_label"] != "control: missing residual")
    print("\n" + table(rows, RULECHECK_COLUMNS))
    print(f"\n{rc.draws:,} draws of each of the 4 rules: {lossless_s:.3f} s on one CPU thread (seed {cfg.seed})")
    figure = Path(cfg.results_dir) / "figures" / "toy_rules.png"
    distcheck_figure(single, figure, f"Toy rules: P, Q over 6 tokens, {rc.draws:,} draws, seed {cfg.seed}")
    print(f"figure: {figure}")
    return rows, []


@torch.inference_mode()
def real_rules(cfg: DictConfig, row: dict) -> tuple[list, list]:
    """p from the target, q from its first `draft_layers` layers (plus its final norm and LM
    head: a layer-skip drafter's distribution), at real positions of real prompts: of the first
    `window` tokens the target writes, the `positions` where the target is uncertain (entropy
    above 1 nat: at confident positions p is nearly a point mass and every rule agrees) and,
    among those, the drafter agrees with it most (largest sum min(p, q))."""
    validate(cfg)
    check_path(cfg.target)
    rc = cfg.rulecheck
    prompts = load_prompts(cfg.dataset)
    model, tokenizer = load_target(cfg.target)
    device = next(model.parameters()).device
    params = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p)
    results, checked = [], 0
    for prompt, ids in zip(prompts, encode_prompts(prompts, tokenizer)):
        seq = model.generate(
            ids[None].to(device), max_new_tokens=rc.window, do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=device),
        )
        out = model(seq, output_hidden_states=True)
        first = len(ids) - 1  # logits at index i predict token i + 1
        p_all = probs_from_logits(out.logits[0, first : seq.shape[1] - 1], params)  # [window, V]
        hidden = model.model.norm(out.hidden_states[rc.draft_layers][0, first : seq.shape[1] - 1])
        q_all = probs_from_logits(model.lm_head(hidden), params)  # [window, V]
        entropy = -(p_all * p_all.clamp_min(1e-30).log()).sum(-1)  # [window]
        overlap = torch.minimum(p_all, q_all).sum(-1).masked_fill(entropy < 1.0, -1.0)  # [window]
        where = overlap.topk(min(rc.positions, len(overlap))).indices.sort().values  # [positions]
        p, q = p_all[where], q_all[where]  # [positions, V]
        for j, position in enumerate(where.tolist()):
            started = time.perf_counter()
            seed = cfg.seed + checked  # one a position, over every prompt: independent draws (worst_positions)
            checked += 1
            rows = rulecheck.check_position(
                p[j], q[j], rc.draws, seed, tree_size=rc.tree_size, threshold_acc=rc.threshold_acc
            )
            for r in rows:
                r.update(prompt_id=prompt.id, position=position, entropy=float(entropy[position]),
                         tv_p_q=0.5 * float((p[j] - q[j]).abs().sum()), draw_seed=seed)
            results += rows
            print(f"prompt {prompt.id} position {position}: {time.perf_counter() - started:.1f} s", flush=True)
    template = {**row, "task": "real_rules", "drafter": f"layerskip{rc.draft_layers}",
                "device": provenance.device_name(device), "num_prompts": len(prompts)}
    rows = _rows(template, results)
    print("\n" + table(rows, RULECHECK_COLUMNS))
    figure = Path(cfg.results_dir) / "figures" / "real_rules.png"
    worst = rulecheck.worst_positions(results)
    n = max((r["positions"] for r in worst), default=0)
    distcheck_figure(worst, figure, f"{cfg.target.name}: p vs layer-{rc.draft_layers} q, worst of {n} positions "
                     "per rule (p-value Šidák-corrected)")
    print(f"figure: {figure}")
    return rows, []
