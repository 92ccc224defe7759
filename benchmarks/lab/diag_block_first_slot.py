"""Diagnostic (issue 21 item 2): a drafter's first-slot accuracy teacher-forced against its
first-position acceptance in the real loop, on the same held-out prompts and the same tokens.

    python benchmarks/lab/diag_block_first_slot.py KIND STEPS [key=value ...]
    OMP_NUM_THREADS=1 python benchmarks/lab/diag_block_first_slot.py dflash 300 train.lr=3e-3 train.warmup_steps=0 \
        train.min_lr_ratio=1.0
    DIAG_QK=identity python benchmarks/lab/diag_block_first_slot.py dflash 300   # ablation: no q_norm / k_norm
    DIAG_FEED=prev python benchmarks/lab/diag_block_first_slot.py dflash 300     # oracle: feature p-1 in every slot

1. train recipes/debug/KIND-stories260k.yaml for STEPS steps into runs/diag/TAG (answers regenerated once
   into runs/regen/regenerated.jsonl and shared by every kind); a finished run is reused;
2. run the loop (greedy, k = 5, 10 gsm8k + 10 mt_bench prompts, plain format, 64 new tokens), recording
   every round's context length and drafts;
3. on each finished sequence (prompt + generation = the target's greedy output): teacher-forced first-slot
   accuracy over the generated positions (forward_loss's acc_0) and, for block kinds, the training-path
   block forward at exactly the loop's anchors, compared token for token with the loop's first draft.
Prints the held-out training metrics (last eval), the loop's per-position acceptance, pooled tau
(committed / rounds) and these comparisons; writes runs/diag/TAG/diag.json. The DIAG_* patches are
ablations for diagnosis only (they monkeypatch heads/block.py in this process, training and loop alike).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from draftsmith import config  # noqa: E402
from draftsmith.checkpoint import load_drafter  # noqa: E402
from draftsmith.core.sampling import SamplingParams  # noqa: E402
from draftsmith.data import features  # noqa: E402
from draftsmith.eval import workloads  # noqa: E402
from draftsmith.eval.loop import LoopConfig, generate  # noqa: E402


class Recording:
    def __init__(self, inner):
        self.inner, self.name, self.log = inner, inner.name, []

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def commit(self, context, num_new, out):
        self.inner.commit(context, num_new, out)

    def propose(self, context, k, sampling, generator=None):
        d = self.inner.propose(context, k, sampling, generator)
        self.log.append((context.shape[0], d.tokens.tolist()))
        return d


def patch_qk_norm():
    """DIAG_QK=identity: the block layers' q_norm / k_norm replaced by the identity (ablation only)."""
    import os

    from torch import nn

    from draftsmith.heads import block as block_family
    if os.environ.get("DIAG_QK") != "identity":
        return ""
    init = block_family.BlockAttention.__init__

    def patched(self, config):
        init(self, config)
        self.q_norm, self.k_norm = nn.Identity(), nn.Identity()
    block_family.BlockAttention.__init__ = patched
    return "-noqknorm"


def patch_feed_prev():
    """DIAG_FEED=prev (an oracle variant, not DFlash): every block slot's input embedding gets the context
    feature of position p-1 (the newest target feature) added, in training and in the proposer alike, so
    the first slot no longer has to FIND that feature by attention."""
    import os

    from draftsmith.heads import block as block_family
    if os.environ.get("DIAG_FEED") != "prev":
        return ""
    BD, BP = block_family.BlockDrafting, block_family.BlockProposer
    orig_block_hidden = BD.block_hidden

    def block_hidden(self, block_ids, block_pos, ctx_kv, mask=None):
        extra = getattr(self, "_extra", None)  # [b, n, h] or None
        emb = self.embed_tokens[0]

        class Shifted:
            def __call__(_, ids):
                return emb(ids) + extra
        saved = self.embed_tokens
        self.embed_tokens = [Shifted()]
        try:
            return orig_block_hidden(self, block_ids, block_pos, ctx_kv, mask)
        finally:
            self.embed_tokens = saved

    def blocks_hidden(self, batch, anchors):
        ids = batch["input_ids"]
        b, s = ids.shape
        ctx = self.context(batch["aux_hidden_states"])  # [b, s, h]
        prev = ctx.gather(1, (anchors - 1).clamp(min=0)[..., None].expand(-1, -1, ctx.shape[-1]))  # [b, A, h]
        self._extra = prev.repeat_interleave(self.block_size, dim=1)  # [b, A*B, h]
        ctx_kv = self.context_kv(ctx, torch.arange(s, device=ids.device).expand(b, s))
        block, pos = self.block_inputs(ids, anchors)
        hidden = self.block_hidden(block, pos, ctx_kv, self.training_mask(anchors, batch["attention_mask"]))
        return hidden.view(b, anchors.shape[1], self.block_size, -1)

    orig_commit = BP.commit

    def commit(self, context, num_new, target_out):
        orig_commit(self, context, num_new, target_out)
        d = self.drafter
        aux = torch.cat([target_out.hidden_states[i] for i in d.aux_layer_ids], dim=-1)
        self.last_ctx = d.context(aux)[:, -1:]  # [1, 1, h]: the feature of position committed - 1

    orig_prop_hidden = BP.block_hidden

    def prop_block_hidden(self, context):
        self.drafter._extra = self.last_ctx.expand(1, self.drafter.block_size, -1)
        return orig_prop_hidden(self, context)
    BD.block_hidden, BD.blocks_hidden, BP.commit, BP.block_hidden = block_hidden, blocks_hidden, commit, prop_block_hidden
    return "-feedprev"


def main():
    qk = patch_qk_norm() + patch_feed_prev()
    kind, steps, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    tag = "-".join([kind, str(steps)] + [e.replace("drafter.", "").replace("train.", "") for e in extra]) + qk
    out = REPO / "runs" / "diag" / tag
    final = out / "final"
    t0 = time.time()
    if not (final / "drafter.json").exists():
        from draftsmith.train.loop import train
        cfg = config.load(REPO / "recipes" / "debug" / f"{kind}-stories260k.yaml",
                          [f"train.max_steps={steps}", f"train.output_dir={out}", "logging.progress_bar=false",
                           f"regenerate.output={REPO}/runs/regen/regenerated.jsonl", *extra])
        train(cfg, overwrite=True)
    train_s = time.time() - t0
    held = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"eval/' in x or "eval_" in x]
    held_last = held[-1] if held else {}
    loaded = load_drafter(final)
    d, target = loaded.drafter, loaded.target
    d.eval()
    prop = Recording(d.make_proposer(target))
    fmt = "plain"
    rows = {"loop_rounds": 0, "loop_first_acc": 0, "tf_hits": 0.0, "tf_n": 0, "same_first": 0, "cmp": 0,
            "tf_at_anchor_hit": 0}
    per_pos_acc = [0] * 5
    per_pos_n = [0] * 5
    for wl in ("gsm8k", "mt_bench"):
        for item in workloads.load(wl, None, 10):
            ids, _ = workloads.encode(item, target.tokenizer, fmt, 512 - 64)
            prop.log = []
            gen = generate(target, prop, ids, LoopConfig(k=5, max_new_tokens=64, sampling=SamplingParams()))
            rows["committed"] = rows.get("committed", 0) + sum(r.committed for r in gen.rounds)
            rows["all_rounds"] = rows.get("all_rounds", 0) + len(gen.rounds)
            for r in gen.rounds:
                for i in range(min(r.proposed, 5)):
                    if i > r.accepted:
                        break
                    per_pos_n[i] += 1
                    per_pos_acc[i] += int(r.accepted > i)
                if r.proposed:
                    rows["loop_rounds"] += 1
                    rows["loop_first_acc"] += int(r.accepted >= 1)
            seq = torch.cat([ids, torch.tensor(gen.tokens)])[None]  # [1, s]
            s, n = seq.shape[1], ids.shape[0]
            lm = torch.zeros_like(seq)
            lm[0, n:] = 1  # generated tokens are the loss tokens
            batch = {"input_ids": seq, "attention_mask": torch.ones_like(seq), "loss_mask": lm}
            batch = features.complete(target, batch, set(d.required_features), d.feature_layers())
            with torch.no_grad():
                if hasattr(d, "block_logits"):
                    d.cfg.num_anchors = 100000  # every valid anchor
                o = d.forward_loss(batch)
                rows["tf_hits"] += o.metrics["acc_0"] * (s - n - 1)  # acc_0 over the generated positions
                rows["tf_n"] += s - n - 1
                if hasattr(d, "block_logits"):
                    anchors = torch.tensor([[c - 1 for c, toks in prop.log if toks and c < s - 1]])
                    if anchors.numel():
                        hid = d.blocks_hidden(batch, anchors)[0]  # [A, B, h]
                        if d.sample_from_anchor:
                            logits, _ = d.heads(hid[:, 0], seq[0, anchors[0]])
                        else:
                            logits = d.lm_head(hid[:, 1])
                        tf_first = d.draft_ids()[logits.argmax(-1)]
                        loop_first = torch.tensor([toks[0] for c, toks in prop.log if toks and c < s - 1])
                        truth = seq[0, anchors[0] + 1]
                        rows["same_first"] += int((tf_first == loop_first).sum())
                        rows["tf_at_anchor_hit"] += int((tf_first == truth).sum())
                        rows["cmp"] += anchors.shape[1]
    res = {"kind": kind, "steps": steps, "extra": extra, "train_s": round(train_s, 1),
           "heldout_metrics_last": {k: v for k, v in held_last.items() if "acc" in k or "loss" in k},
           "loop_first_pos_acceptance": rows["loop_first_acc"] / max(1, rows["loop_rounds"]),
           "loop_per_position": [round(a / max(1, b), 3) for a, b in zip(per_pos_acc, per_pos_n)],
           "loop_rounds": rows["loop_rounds"], "tau_pooled": rows["committed"] / max(1, rows["all_rounds"]), "teacher_forced_acc0_on_generations": rows["tf_hits"] / rows["tf_n"]}
    if rows["cmp"]:
        res["block_first_token_loop_equals_training_path"] = f"{rows['same_first']}/{rows['cmp']}"
        res["block_training_path_first_slot_acc_at_loop_anchors"] = rows["tf_at_anchor_hit"] / rows["cmp"]
    print(json.dumps(res, indent=1))
    (out / "diag.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
