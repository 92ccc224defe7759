"""A Medusa drafter over a draft vocabulary (drafter.draft_vocab_size) in vLLM's Medusa format: the config's
truncated_vocab_size and the `token_map` tensor, as vLLM's Medusa loader reads them.

Read from the wheels vllm-0.9.2, vllm-0.20.0 and vllm-0.27.0 (vLLM 0.33 has no Medusa: engine_versions.py);
line numbers are vllm/model_executor/models/medusa.py of each wheel unless another file is named.
  - config.json: vocab_size is the target's (Medusa.orig_vocab_size); truncated_vocab_size is T, the draft
    vocabulary size (transformers_utils/configs/medusa.py defaults it to vocab_size).
  - token_map: kept only when truncated_vocab_size < vocab_size (load_weights, 0.9.2:191 / 0.20.0:148 /
    0.27.0:169), as stored: no cast, no check. The loader then asserts it was given (0.9.2:216, 0.20.0:175,
    0.27.0:196). compute_logits fills [..., vocab_size] with -inf and writes each head's T logits at token_map
    (0.9.2:121-126, 0.27.0:127-135); the proposer takes the argmax. So token_map[i] is the target id of draft
    row i: [T], an integer index dtype (int64 here), every id < vocab_size, no id twice (a repeated id keeps one
    of the rows' logits). vLLM does not need it sorted; draftsmith's draft ids are ascending. Off the draft
    vocabulary the logits are -inf, as in draftsmith's own proposer (heads/shared.py on_target_vocab).
  - lm_head rows: a head with more rows than token_map is sliced with it (`loaded_weight[token_map]`, 0.9.2:205,
    0.27.0:186); draftsmith writes the T draft rows ([T, h]) directly.
  - Per-head lm_heads.{i} (original_lm_head false): 0.9.2 builds them over truncated_vocab_size (line 80-81), so
    [T, h] heads load. 0.20.0 and 0.27.0 build them over config.vocab_size (line 83-84), and their weight loader
    asserts a loaded head has vocab_size rows (layers/vocab_parallel_embedding.py 0.20.0:463, 0.27.0:480): a
    truncated per-head export does not load there.
  - original_lm_head true: one lm_head over truncated_vocab_size shared by every head (0.9.2:69, 0.20.0 and
    0.27.0:74), loaded from lm_heads.0.weight; it loads in all three releases. draftsmith writes it when every
    trained head has the same projection (drafter.freeze_lm_head), since vLLM then serves head 0's for all.
"""
from __future__ import annotations

import torch

from draftsmith.core.errors import UserError

PER_HEAD_RELEASES = ("0.9.2",)  # vLLM releases whose per-head lm_heads are built over truncated_vocab_size
PER_HEAD_WHY = ("vLLM 0.20.0 and 0.27.0 build each lm_heads.{i} over the full vocab_size "
                "(model_executor/models/medusa.py:83-84) and their weight loader asserts a loaded head has "
                "vocab_size rows (layers/vocab_parallel_embedding.py:480 in 0.27.0, :463 in 0.20.0)")


def shares_one_head(drafter) -> bool:
    """Every head's vocabulary projection is the same tensor value (frozen projections, drafter.freeze_lm_head)."""
    first = drafter.lm_heads[0].weight
    return all(torch.equal(head.weight, first) for head in drafter.lm_heads[1:])


def vocab_fields(drafter, release: str | None) -> dict:
    """config.json fields of a draft-vocabulary Medusa export for vLLM `release`; raises when it cannot load it."""
    shared = shares_one_head(drafter)
    if not shared and release not in PER_HEAD_RELEASES:
        raise UserError(f"export --to vllm --engine-version {release}: this Medusa drafter has "
                         f"drafter.draft_vocab_size={drafter.cfg.draft_vocab_size} and its own projection per head: "
                         f"{PER_HEAD_WHY}; pass --engine-version 0.9.2 (it builds them over truncated_vocab_size), "
                         "or retrain with drafter.freeze_lm_head=true (one shared head, original_lm_head)")
    return {"truncated_vocab_size": drafter.cfg.draft_vocab_size, "original_lm_head": shared}


def export_tensors(drafter, weights: dict[str, torch.Tensor], shared: bool) -> dict[str, torch.Tensor]:
    """The heads' weights (state_dict_for_export names) plus token_map [T] int64; one lm_heads.0 when shared."""
    if shared:
        weights = {k: v for k, v in weights.items() if not k.startswith("lm_heads.") or k == "lm_heads.0.weight"}
    return {**weights, "token_map": drafter.draft_ids().to(torch.int64).cpu().contiguous()}


def token_map_problems(tensors: dict[str, torch.Tensor], drafter) -> list[str]:
    """token_map against what vLLM indexes with it and against the drafter's draft ids (its shape and dtype are
    checked with the other tensors)."""
    token_map = tensors.get("token_map")
    if token_map is None or token_map.dtype != torch.int64 or token_map.dim() != 1:
        return []  # reported by the tensor check (missing, dtype, shape)
    where = "model.safetensors: token_map"
    V = drafter.vocab_size
    bad = token_map[(token_map < 0) | (token_map >= V)]
    if bad.numel():
        return [f"{where} holds {bad.numel()} id(s) outside 0..{V - 1} (e.g. {bad[:3].tolist()}): vLLM indexes its "
                f"[..., vocab_size] logits with it; re-export"]
    problems = []
    if torch.unique(token_map).numel() != token_map.numel():
        problems.append(f"{where} repeats a target id: vLLM writes two heads' rows onto one logit and drops one; "
                        "re-export")
    want = drafter.draft_ids().to(token_map.device)
    if token_map.shape != want.shape or not torch.equal(token_map, want):
        first = int((token_map != want).nonzero()[0]) if token_map.shape == want.shape else None
        at = f"first difference at draft row {first}" if first is not None else "sizes differ"
        problems.append(f"{where} is not the drafter's draft vocabulary ({at}): vLLM would put row i's logit on "
                        "token_map[i], a token the head was not trained for; re-export")
    return problems


def release_vocab_problem(config: dict, release: str | None) -> str | None:
    """Why vLLM `release` will not map the draft vocabulary of an export with this config.json (per-head heads
    over truncated_vocab_size load in PER_HEAD_RELEASES only), or None (`draftsmith doctor`)."""
    vocab = config.get("vocab_size")
    truncated = config.get("truncated_vocab_size", vocab)
    if not isinstance(vocab, int) or not isinstance(truncated, int) or truncated >= vocab:
        return None
    if config.get("original_lm_head") or release in PER_HEAD_RELEASES:
        return None
    return f"per-head lm_heads over truncated_vocab_size {truncated}: {PER_HEAD_WHY}"


def layout_problems(config: dict, drafter, release: str | None) -> list[str]:
    """original_lm_head and per-head truncated heads against the trained heads and the recorded vLLM release."""
    problems = []
    truncated = config.get("truncated_vocab_size", config.get("vocab_size"))
    if config.get("original_lm_head"):
        if not shares_one_head(drafter):
            problems.append("config.json: original_lm_head must be false: each trained head has its own lm_heads.{i} "
                            "(vLLM would serve head 0's projection for every head)")
    elif truncated < config.get("vocab_size", truncated) and release not in PER_HEAD_RELEASES:
        problems.append(f"config.json: truncated_vocab_size {truncated} < vocab_size with per-head lm_heads "
                        f"(original_lm_head false) loads in vLLM 0.9.2 only, and draftsmith.json records "
                        f"engine_version {release!r}: {PER_HEAD_WHY}")
    return problems


def drafter_weights(tensors: dict[str, torch.Tensor], config: dict, num_heads: int) -> dict[str, torch.Tensor]:
    """An export's tensors in the drafter's state_dict names: token_map -> d2t (target_id = draft_id + d2t), and
    a shared lm_heads.0 (original_lm_head) copied to every head, as vLLM serves it."""
    weights = dict(tensors)
    token_map = weights.pop("token_map", None)
    if token_map is not None:
        weights["d2t"] = token_map.long() - torch.arange(token_map.numel())
    if config.get("original_lm_head") and "lm_heads.0.weight" in weights:
        for i in range(1, num_heads):
            weights[f"lm_heads.{i}.weight"] = weights["lm_heads.0.weight"]
    return weights
