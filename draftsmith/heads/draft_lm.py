"""Distilled draft LM (DistillSpec: Zhou et al. 2023, "DistillSpec: Improving Speculative Decoding
via Knowledge Distillation").

A small causal LM that shares the target's tokenizer is trained to match the frozen target token by
token; it then drafts as an ordinary model (engines' draft-model mode, or eval's draft_lm proposer).

Start (Config.init):
  pretrained  a given small Hugging Face model (Config.path), e.g. Llama-3.2-1B for Llama-3.1-8B
  shrink      the target's first `shrink_layers` decoder layers + its embedding, final norm, lm_head
  config      a fresh LlamaForCausalLM from `model_config` (a dict of LlamaConfig sizes)
Training data (Config.on_policy_fraction, DistillSpec Section 4 / GKD): off-policy rows are the
batch as given (fixed or target-generated text, scored by target_logits); on-policy rows keep the
batch row's prompt and replace the answer with a continuation sampled from the draft itself (no
gradient), which the frozen target then scores. The divergence (divergences.py) is taken at every
position whose next token is a loss token. Full fine-tuning, or LoRA through peft (Config.lora).

Metrics: accept_rate = mean over loss positions of sum_x min(p, q) (the expected acceptance rate
of speculative sampling at the distillation temperature; Leviathan et al. 2023) and acc_0 = top-1
agreement of draft and target. Trainer.evaluate reports both as eval_accept_rate / eval_acc_0.
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample
from draftsmith.data import packing
from draftsmith.heads import divergences
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, FedNodes, LoraOptions, StepOutput, range_problems
from draftsmith.heads.shared import Frozen
from draftsmith.targets.load import Target

LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@DRAFTERS.register("draft_lm")
class DraftLMDrafter(Drafter):
    kind = "draft_lm"
    is_draft_model = True
    tiny_options = {"init": "shrink", "shrink_layers": 1}
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "target_logits"})
    @classmethod
    def refusals(cls, config) -> list[str]:
        if getattr(config, "vision_config", None) is not None:  # issue 42: not built yet
            return [f"draft_lm on a vision-language target ({config.model_type}): a draft LM of the full model "
                    "(vision tower and language model) is not built yet; use eagle3 or a block drafter"]
        return []

    @dataclass
    class Config:
        # How the draft model starts: a given small HF model, a shrunk copy of the target, or a config.
        init: Literal["pretrained", "shrink", "config"] = "shrink"
        # init pretrained: local directory or Hugging Face id of the draft model (same tokenizer as the target).
        path: Optional[str] = None
        # init pretrained: Hub revision (branch, tag or commit) of `path`; None: the default branch.
        revision: Optional[str] = None
        # init shrink: how many of the target's first decoder layers the draft keeps.
        shrink_layers: int = 2
        # init config: LlamaConfig sizes, e.g. {hidden_size: 256, num_hidden_layers: 4, ...}; vocab and
        # special ids default to the target's.
        model_config: Optional[dict[str, Any]] = None
        # dtype of the trained weights (fp32 master weights; the loop's autocast handles bf16 compute).
        dtype: Literal["float32", "bfloat16", "float16"] = "float32"
        # A divergence name (fkl, rkl, jsd, tv) or a weighted mix such as {tv: 0.5, fkl: 0.5}.
        divergence: Union[str, dict[str, float]] = "fkl"
        # beta of JSD[beta]: m = beta p + (1 - beta) q.
        jsd_beta: float = 0.5
        # Both distributions are compared at this temperature (match the sampling temperature served).
        temperature: float = 1.0
        # Share of training rows whose answer is sampled from the draft and scored by the target.
        on_policy_fraction: float = 0.0
        # Tokens sampled per on-policy row (generation also stops at one of the target's EOS ids).
        on_policy_max_new_tokens: int = 64
        # Temperature of the draft's on-policy sampling (0: greedy).
        on_policy_temperature: float = 1.0
        # Rows whose loss starts at token 0 (or that have none) keep this many prompt tokens.
        on_policy_prompt_tokens: int = 16
        # LoRA through peft: {r, alpha, dropout, target_modules} (heads.base.LoraOptions); null: full fine-tuning.
        lora: Optional[LoraOptions] = None

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (checks that need several
            options together stay in __post_init__)."""
            return range_problems(self, {"shrink_layers": ">= 1", "jsd_beta": "> 0 and < 1", "temperature": "> 0",
                                         "on_policy_fraction": ">= 0 and <= 1", "on_policy_max_new_tokens": ">= 1",
                                         "on_policy_prompt_tokens": ">= 1", "on_policy_temperature": ">= 0"}) + (
                self.lora.problems("drafter.lora") if self.lora is not None else [])

        def __post_init__(self):
            divergences.parse_weights(self.divergence)
            if self.init == "pretrained" and not self.path:
                raise UserError("drafter.path: required with init: pretrained (a local dir or HF id)")
            if self.init == "config" and not self.model_config:
                raise UserError("drafter.model_config: required with init: config (a dict of LlamaConfig sizes)")
            if isinstance(self.lora, dict):  # Config(lora={...}) from Python; recipes arrive already typed
                known = [f.name for f in dataclasses.fields(LoraOptions)]
                unknown = sorted(set(self.lora) - set(known))
                if unknown:
                    raise UserError(f"drafter.lora: unknown key(s) {unknown}; known: {known}")
                self.lora = LoraOptions(**self.lora)
            if self.lora is not None:
                if self.init == "config":
                    raise UserError("drafter.lora with init: config would adapt a random frozen base; "
                                     "use full fine-tuning (lora: null) or init: pretrained / shrink")

    def __init__(self, cfg: "DraftLMDrafter.Config", model, target):
        super().__init__()
        self.cfg = cfg
        self.model = model  # the HF causal LM, or a peft model wrapping it (LoRA)
        self.target_ref = Frozen(target)  # the frozen target: not a parameter, not in state_dict
        self.weights = divergences.parse_weights(cfg.divergence)
        self.common_vocab = min(target.vocab_size, model.get_output_embeddings().weight.shape[0])
        if cfg.on_policy_fraction >= 1.0:  # every row is resampled: the loop need not compute target_logits
            self.required_features = frozenset({"input_ids", "attention_mask", "loss_mask"})

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "DraftLMDrafter":
        """Build the draft model (Config.init), check its vocabulary against the target's, add LoRA."""
        model = build_model(cfg, target)
        check_vocab(target, model)
        model.generation_config = copy.deepcopy(target.model.generation_config)  # the target's stop ids
        model = model.to(device=target.device, dtype=DTYPES[cfg.dtype]).train()
        for p in model.parameters():  # a shrunk copy inherits the frozen target's requires_grad=False
            p.requires_grad_(True)
        if cfg.lora is not None:
            model = add_lora(model, cfg.lora)
        return cls(cfg, model, target)

    @property
    def target(self):
        return self.target_ref[0]

    @property
    def lm(self):
        """The causal LM itself (LoRA layers injected in place when peft wraps it)."""
        return self.model.get_base_model() if self.cfg.lora is not None else self.model

    def state_dict(self, *args, **kwargs):
        """Tied tensors (embedding = lm_head, e.g. stories260K, Llama-3.2-1B) are stored as separate
        copies: safetensors refuses shared memory, and loading writes the same values into both."""
        state = super().state_dict(*args, **kwargs)
        if kwargs.get("keep_vars"):
            return state
        seen: set[int] = set()
        for key, value in state.items():
            ptr = value.data_ptr()
            if ptr in seen:
                state[key] = value.clone()
            seen.add(ptr)
        return state

    # ------------------------------------------------------------------ training
    def forward_loss(self, batch) -> StepOutput:
        """DistillSpec training step, numbered:

        1. (training only) choose each row on-policy with probability on_policy_fraction;
        2. on-policy rows: the draft samples an answer after the row's prompt, the target scores it
           (sample_on_policy); off-policy rows keep their ids and target_logits;
        3. draft forward; at every position j whose next token j+1 is a loss token, compare
           p = softmax(target_logits_j / T) and q = softmax(draft_logits_j / T) over the common vocabulary;
        4. loss = SUM over those positions of the configured divergence (the loop normalises by the
           global token count); metrics accept_rate = mean sum_x min(p, q), acc_0 = top-1 agreement.
        """
        b = batch["input_ids"].shape[0]
        on = torch.zeros(b, dtype=torch.bool)
        row_keys = ("input_ids", "attention_mask", "loss_mask", *(k for k in packing.PACKED_KEYS if k in batch))
        if self.training and self.cfg.on_policy_fraction > 0 and "document_ids" in batch:
            raise UserError("drafter.on_policy_fraction > 0 samples one answer per row and cannot run on packed rows; "
                             "set data.pack_length to null (no packing) or on_policy_fraction to 0")
        if self.training and self.cfg.on_policy_fraction > 0:  # 1.
            on = torch.rand(b) < self.cfg.on_policy_fraction
        parts = []
        if (~on).any():
            rows = (~on).nonzero().flatten().to(batch["input_ids"].device)
            part = {k: batch[k][rows] for k in row_keys}
            if "target_logits" in batch:
                part["target_logits"] = batch["target_logits"][rows]
            else:  # fully on-policy runs skip the loop's target forward; evaluation scores the rows here
                inputs = packing.model_inputs(part, self.target.dtype)
                part["target_logits"] = self.target.forward(part["input_ids"], inputs["attention_mask"],
                                                            position_ids=inputs.get("position_ids")).logits
            parts.append(part)
        if on.any():  # 2.
            rows = on.nonzero().flatten().to(batch["input_ids"].device)
            parts.append(self.sample_on_policy({k: batch[k][rows] for k in ("input_ids", "attention_mask", "loss_mask")}))
        loss, n, accept, hits = 0.0, 0, 0.0, 0.0
        for part in parts:
            part_loss, part_n, part_accept, part_hits = self._divergence_sum(part)  # 3.
            loss, n, accept, hits = loss + part_loss, n + part_n, accept + part_accept, hits + part_hits
        denom = max(n, 1)
        metrics = {"accept_rate": accept / denom, "acc_0": hits / denom, "on_policy": float(on.float().mean())}
        return StepOutput(loss=loss, metrics=metrics, num_tokens=n)  # 4.

    def _divergence_sum(self, part: dict) -> tuple[torch.Tensor, int, float, float]:
        """-> (divergence summed over loss positions, their count, sum of alpha, top-1 hits)."""
        ids, attention = part["input_ids"], part["attention_mask"]
        sel = (part["loss_mask"] * attention)[:, 1:] * packing.valid_labels(part, 1, ids.shape[1] - 1)
        sel = sel.bool()  # [b, s-1]: position j predicts token j+1 (in j's document when packed)
        logits = self.lm(input_ids=ids, **packing.model_inputs(part, self.lm.dtype)).logits  # [b, s] -> [b, s, V_d]
        vc, t = self.common_vocab, self.cfg.temperature
        draft = logits[:, :-1][sel][:, :vc].float()  # [b, s-1, V_d] -> [n, Vc]
        target = part["target_logits"][:, :-1][sel][:, :vc].float()  # [b, s-1, V] -> [n, Vc]
        logq = torch.log_softmax(draft / t, dim=-1)
        logp = torch.log_softmax(target / t, dim=-1)
        loss = divergences.mixed(self.weights, logp, logq, self.cfg.jsd_beta).sum()  # [n] -> []
        with torch.no_grad():
            accept = float(divergences.acceptance_rate(logp, logq).sum())
            hits = float((draft.argmax(-1) == target.argmax(-1)).float().sum())
        return loss, int(sel.sum()), accept, hits

    @torch.no_grad()
    def sample_on_policy(self, batch: dict) -> dict:
        """Rows -> the same rows' prompts + continuations sampled from the draft, scored by the target.

        1. prompt of a row: its tokens before the first loss token (rows whose loss starts at token 0,
           or that have none, keep their first on_policy_prompt_tokens);
        2. left-pad the prompts and sample up to on_policy_max_new_tokens from the draft (eval mode,
           own KV cache), a row stopping after one of the target's EOS ids;
        3. repack right-padded: loss_mask is 1 on the sampled tokens; 4. the frozen target's logits.
        """
        target, lm = self.target, self.lm
        pad = target.tokenizer.pad_token_id or 0
        prompts = []
        for row in range(batch["input_ids"].shape[0]):  # 1.
            length = int(batch["attention_mask"][row].sum())
            loss_at = (batch["loss_mask"][row, :length] > 0).nonzero().flatten()
            start = int(loss_at[0]) if loss_at.numel() else 0
            keep = start if start >= 1 else min(length, self.cfg.on_policy_prompt_tokens)
            prompts.append(batch["input_ids"][row, :keep])
        was_training = lm.training
        lm.eval()
        continuations = self._sample(prompts, pad)  # 2.
        lm.train(was_training)
        rows = [torch.cat([p, c]) for p, c in zip(prompts, continuations)]
        s = max(len(r) for r in rows)
        device = batch["input_ids"].device
        ids = torch.full((len(rows), s), pad, dtype=torch.long, device=device)  # 3. [b, s]
        attention = torch.zeros_like(ids)
        loss_mask = torch.zeros_like(ids)
        for i, (p, r) in enumerate(zip(prompts, rows)):
            ids[i, : len(r)], attention[i, : len(r)], loss_mask[i, len(p): len(r)] = r, 1, 1
        logits = target.forward(ids, attention_mask=attention).logits  # 4. [b, s] -> [b, s, V]
        return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask, "target_logits": logits}

    def _sample(self, prompts: list[torch.Tensor], pad: int) -> list[torch.Tensor]:
        """Batched ancestral sampling from the draft over left-padded prompts -> one [<= T] tensor per row."""
        from transformers import DynamicCache

        lm, n, width = self.lm, len(prompts), max(len(p) for p in prompts)
        device = prompts[0].device
        ids = torch.full((n, width), pad, dtype=torch.long, device=device)  # [n, P]
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
        positions = (mask.cumsum(-1) - 1).clamp_min(0)  # [n, P]: left padding shifts positions
        cache = DynamicCache(config=lm.config)
        params = SamplingParams(temperature=self.cfg.on_policy_temperature)
        eos = torch.tensor(self.target.eos_ids, device=device)
        done = torch.zeros(n, dtype=torch.bool, device=device)
        out_tokens = []
        for _ in range(self.cfg.on_policy_max_new_tokens):
            logits = lm(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits
            probs = logits_to_probs(logits[:, -1, : self.common_vocab], params)  # [n, Vc]
            token = sample(probs).masked_fill(done, pad)  # [n]
            out_tokens.append(token)
            done = done | torch.isin(token, eos)
            if bool(done.all()):
                break
            ids, positions = token[:, None], positions[:, -1:] + 1  # [n, 1]
            mask = torch.cat([mask, torch.ones_like(ids)], dim=1)  # [n, P + t] -> [n, P + t + 1]
        tokens = torch.stack(out_tokens, dim=1)  # [n, t]
        result = []
        for i in range(n):
            stop = torch.isin(tokens[i], eos).nonzero().flatten()
            result.append(tokens[i, : int(stop[0]) + 1] if stop.numel() else tokens[i])
        return result

    # ------------------------------------------------------------------ inference and export
    def make_proposer(self, target):
        """The draft LM drafting on its own DynamicCache (DraftModelProposer below)."""
        return DraftModelProposer(self.lm, target.vocab_size, name=self.kind)

    def merged_model(self):
        """A standalone copy of the draft model with LoRA merged into its weights (a plain HF model)."""
        model = copy.deepcopy(self.model)
        if self.cfg.lora is not None:
            model = model.merge_and_unload()
        return model.eval()

    def save_adapter(self, out_dir: str | Path) -> Path:
        """The peft LoRA adapter (adapter_config.json, adapter_model.safetensors); reload it with
        peft.PeftModel.from_pretrained(base_model, out_dir) on the same base (same init)."""
        if self.cfg.lora is None:
            raise UserError("save_adapter: this drafter was trained without LoRA (drafter.lora is null)")
        self.model.save_pretrained(str(out_dir))
        return Path(out_dir)

    def save_hf(self, out_dir: str | Path, tokenizer, dtype: torch.dtype | None = None) -> Path:
        """A standard Hugging Face model directory (config.json, model.safetensors, tokenizer files,
        generation_config.json) that AutoModelForCausalLM and engines' draft-model modes load.
        LoRA is merged first; the adapter itself also goes to out_dir/adapter/. dtype: default the target's."""
        out = Path(out_dir)
        model = self.merged_model().to(dtype or self.target.dtype)
        model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
        if self.cfg.lora is not None:
            self.save_adapter(out / "adapter")
        return out


# ---------------------------------------------------------------------- helpers
def build_model(cfg, target):
    """Config.init -> an HF causal LM (not yet on the target's device)."""
    if cfg.init == "shrink":
        if cfg.shrink_layers > target.num_layers:
            raise UserError(f"drafter.shrink_layers {cfg.shrink_layers} exceeds the target's {target.num_layers} layers")
        return layer_truncated_copy(target.model, cfg.shrink_layers)
    if cfg.init == "config":
        from transformers import LlamaConfig, LlamaForCausalLM

        tc = target.config
        sizes = {"vocab_size": target.vocab_size, "bos_token_id": tc.bos_token_id, "eos_token_id": tc.eos_token_id,
                 "pad_token_id": getattr(tc, "pad_token_id", None),
                 "max_position_embeddings": getattr(tc, "max_position_embeddings", 2048), **cfg.model_config}
        try:
            llama = LlamaConfig(**sizes)
        except (TypeError, ValueError) as exc:
            raise UserError(f"drafter.model_config {cfg.model_config}: not a valid LlamaConfig ({exc})") from exc
        return LlamaForCausalLM(llama)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.path, revision=cfg.revision)
    check_tokenizer(target, tokenizer, cfg.path)
    return AutoModelForCausalLM.from_pretrained(cfg.path, dtype=DTYPES[cfg.dtype], revision=cfg.revision)


def check_tokenizer(target, tokenizer, where: str) -> None:
    """The draft must use the target's tokenizer: same token -> id map."""
    mine, theirs = tokenizer.get_vocab(), target.tokenizer.get_vocab()
    if mine != theirs:
        differ = sorted(set(mine.items()) ^ set(theirs.items()), key=str)[:5]
        raise UserError(f"drafter.path {where}: its tokenizer differs from target {target.name}'s ({len(mine)} vs "
                         f"{len(theirs)} tokens; e.g. {differ}); a draft LM must share the target's tokenizer")


def check_vocab(target, model) -> None:
    """Every id the target's tokenizer produces must have a row in the draft's embedding and lm_head
    (tables padded to different sizes are fine: the loss compares the common prefix)."""
    n_tokens = len(target.tokenizer)
    rows = min(model.get_input_embeddings().weight.shape[0], model.get_output_embeddings().weight.shape[0])
    if rows < n_tokens:
        raise UserError(f"draft model vocabulary ({rows} rows) is smaller than target {target.name}'s tokenizer "
                         f"({n_tokens} tokens); set drafter.model_config.vocab_size or pick a draft with the same tokenizer")


def add_lora(model, options: LoraOptions):
    """Wrap `model` with peft LoRA adapters (only they train)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=options.r, lora_alpha=options.alpha, lora_dropout=options.dropout,
                      target_modules=list(options.target_modules or LLAMA_LINEARS), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


# ---------------------------------------------------------------------- the draft LM as a proposer
def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., V_draft] -> [..., V_target]: drop ids the target does not have, or pad with -inf
    (models that share a tokenizer often pad their embedding tables to different sizes)."""
    extra = logits.shape[-1] - vocab_size
    if extra > 0:
        return logits[..., :vocab_size]
    if extra < 0:
        pad = logits.new_full((*logits.shape[:-1], -extra), float("-inf"))
        return torch.cat([logits, pad], dim=-1)
    return logits


class DraftModelProposer:
    """A small causal LM drafts k tokens autoregressively (chain drafting) on its own KV cache.

    The cache holds a prefix of the committed context plus the drafts of the last round; commit()
    crops it to the longest prefix that agrees with the committed context, and propose() first
    feeds the committed tokens the cache lacks (at least the newest one).
    """

    name = "draft_lm"

    def __init__(self, model, target_vocab_size: int, name: str = "draft_lm"):
        self.model = model.eval()
        self.vocab_size = target_vocab_size
        self.name = name
        self.cache = None
        self._cached = torch.empty(0, dtype=torch.long)  # ids whose keys/values the cache holds

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def begin(self, prompt_ids: torch.Tensor) -> None:
        from draftsmith.targets.archs import new_cache

        self.cache = new_cache(self.model.config)  # rollback works on sliding-window layers
        self._cached = torch.empty(0, dtype=torch.long, device=self.device)

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        self._tree_context = context  # tree_root drafts after it
        n = min(self._cached.shape[0], context.shape[0] - 1)
        same = (self._cached[:n] == context[:n].to(self._cached.device)).long()  # [n]
        keep = int(same.cumprod(0).sum().item()) if n else 0
        extra = self.cache.get_seq_length() - keep
        if extra:
            self.cache.crop(-extra)
        self._cached = self._cached[:keep]

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        context = context.to(self.device)
        feed = context[self._cached.shape[0]:]  # [m >= 1] committed ids not yet in the cache
        tokens, probs = [], []
        for _ in range(k):
            out = self.model(input_ids=feed[None], cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
            logits = fit_vocab(out.logits[0, -1].float(), self.vocab_size)  # [V]
            if sampling.greedy:
                tok = logits.argmax(-1)
            else:
                q = logits_to_probs(logits, sampling)  # [V]
                tok = sample(q, generator)
                probs.append(q)
            tokens.append(tok)
            feed = tok.reshape(1)
        drafted = torch.stack(tokens)  # [k]
        # The cache now holds context + d1..d(k-1): dk was sampled but never fed.
        self._cached = torch.cat([context, drafted[:-1]])
        return Draft(tokens=drafted, probs=torch.stack(probs) if probs else None)  # probs [k, V]

    # ---- tree drafting (eval/tree.py): the draft LM's own tree attention through a 4D mask
    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        context = self._tree_context.to(self.device)
        feed = context[self._cached.shape[0]:]  # [m >= 1] committed ids not yet in the cache
        out = self.model(input_ids=feed[None], cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
        self._cached = context  # tree entries appended from here are dropped by the next commit()
        self.tree_fed = FedNodes(self.device)
        return torch.log_softmax(fit_vocab(out.logits[0, -1].float(), self.vocab_size), -1)  # [V]

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        n = self._cached.shape[0]
        seen = self.tree_fed.add(parents.to(self.device), n)  # [m, n + F + m] True = attend
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(~seen, torch.finfo(dtype).min)
        pos = torch.full((1, tokens.shape[0]), n + depth - 1, device=self.device)
        out = self.model(input_ids=tokens.view(1, -1).to(self.device), attention_mask=mask[None, None],
                         position_ids=pos, cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
        return torch.log_softmax(fit_vocab(out.logits[0].float(), self.vocab_size), -1)  # [m, V]


def layer_truncated_copy(model, num_layers: int):
    """A draft LM made of the target's first num_layers decoder layers plus its embedding,
    final norm and lm_head (a self-speculative draft in the spirit of Draft & Verify, Zhang
    et al. 2024, and LayerSkip, Elhoushi et al. 2024). Shares no tensors with `model`."""
    import copy

    if not 1 <= num_layers <= model.config.num_hidden_layers:
        raise UserError(f"num_layers must be in 1..{model.config.num_hidden_layers}, got {num_layers}")
    from draftsmith.targets import state_cache

    first = state_cache.first_attention_layer(model.config) if state_cache.has_state_layers(model.config) else 0
    if first is not None and num_layers <= first:  # transformers builds no attention mask without an attention layer
        raise UserError(f"drafter.shrink_layers {num_layers} keeps only the recurrent / conv layers of this hybrid "
                        f"target (its first attention layer is layer {first}); set drafter.shrink_layers >= {first + 1}")
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:num_layers]
    total = model.config.num_hidden_layers
    for name, value in list(vars(draft.config).items()):  # per-layer lists: layer_types, mlp_layer_types, ...
        if isinstance(value, list) and len(value) == total:
            setattr(draft.config, name, value[:num_layers])
    if "num_hidden_layers" in vars(draft.config):
        draft.config.num_hidden_layers = num_layers
    return draft.eval()


def check_same_tokenizer(target: Target, draft: Target) -> None:
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise UserError(f"draft model {draft.name!r} does not share the tokenizer of target {target.name!r}; "
                         "a draft LM must use the target's tokenizer (same ids for the same tokens)")
