"""Side by side for the block drafters (issue 21 item 1): draftsmith's DFlash / DSpark and vLLM speculators'
DFlashDraftModel / DSparkDraftModel trained on identical token sequences with an identical budget and
block size, scored with one acceptance measure. The EAGLE-3 side of the same protocol is bench_peers.py;
this file reuses its data, eval set and round walk.

Protocol (bench_peers.py's, with the block drafters' k):
  target    stories260K, fp32, aux layers [1, 2, 4] (both trainers fuse the same three layers)
  data      bench_peers' 240 self-sampled stories; speculators gets exactly the batches draftsmith's trainer
            draws for the seed (4 sequences per step, packed into one row with document ids)
  drafter   the kind's debug recipe (recipes/debug/KIND-stories260k.yaml): 2 layers, the target's layer
            shape, DFlash block 6 (drafts 5), DSpark block 5 (drafts 5) and Markov rank 32; speculators
            built with the same layers, block size, Markov rank and mask token (frozen verifier embedding
            and lm_head on both sides)
  budget    --steps optimizer steps x 4 sequences; the lr and its schedule are draftsmith's for that run
            (speculators' optimizer gets draftsmith's LambdaLR factor), speculators keeps its own AdamW
            defaults (weight decay 0.01, clip 1.0) and its own loss defaults per kind (DFlash: hard CE with
            D-PACE weights; DSpark: KL with exp(-i/4) and the confidence head's TV-BCE); its anchors per
            packed row = draftsmith's num_anchors x 4 sequences (--peer-anchors overrides)
  measure   teacher-forced block tau on target-greedy continuations (10 held-out prompts x 128 tokens,
            k = 5): the round that starts at context length c anchors the block at c - 1 (the bonus
            token), drafts the block's argmaxes, accepts the matching prefix and commits accepted + 1
            (bench_peers.walk_rounds). Every block of the sequence comes from one forward with every
            position as an anchor; DSpark's Markov head gets the true previous token, which equals its own
            previous draft on every accepted prefix, so the walk is exact. DSpark's confidence cut is off
            (drafter.confidence_threshold=0) so every drafter proposes k tokens a round.
  check     draftsmith's drafter also runs draftsmith's real loop (eval/loop.py) on the same prompts: the
            taus must agree within 0.03 and the output must equal target-only greedy decoding.

    OMP_NUM_THREADS=1 python -u benchmarks/bench_peers_block.py --kinds dflash dspark --steps 300 --seeds 0 1 2 \\
        --workdir /tmp/bpb --out benchmarks/results/block-peers/recipe-300.json
    ... --set drafter.num_anchors=128 --set train.lr=3e-3 --set train.warmup_steps=0 --set train.min_lr_ratio=1.0
    ... --peers draftsmith --kinds dflash --set drafter.block_size=4     # one ablation row (draftsmith only)
    python benchmarks/bench_peers_block.py --smoke     # 2 steps, 1 seed, 2 prompts
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_peers as bp  # noqa: E402

from draftsmith import config as config_mod  # noqa: E402
from draftsmith.targets import load as target_mod  # noqa: E402

K = 5
RECIPES = {kind: REPO / "recipes" / "debug" / f"{kind}-stories260k.yaml" for kind in ("dflash", "dspark", "eagle3")}


# --------------------------------------------------------------------------- draftsmith
def block_protocol_config(kind: str, data_file: Path, out_dir: Path, steps: int, seed: int, overrides: list[str]):
    """The kind's debug recipe on bench_peers' data and budget; `overrides` are the run's changes."""
    protocol = [f"data.path=[{data_file}]", "data.max_length=192", "data.text_chunk_tokens=256", "data.eval_samples=0",
                "regenerate.output=null", f"target.path={bp.STORIES}", "target.device=cpu",
                f"drafter.aux_layer_ids=[{','.join(map(str, bp.AUX))}]",
                f"train.output_dir={out_dir}", f"train.max_steps={steps}", f"train.batch_size={bp.DEFAULTS['batch']}",
                f"train.seed={seed}", f"train.log_every={max(1, steps // 4)}", "train.eval_every=0",
                "logging.progress_bar=false"]
    if kind == "dspark":
        protocol.append("drafter.confidence_threshold=0.0")
    extra = [o if "." in o.split("=")[0] else f"drafter.{o}" for o in overrides]
    return config_mod.load(str(RECIPES[kind]), protocol + extra)


def draftsmith_trainer(kind, data_file, out_dir, steps, seed, overrides):
    from draftsmith.train.loop import Trainer

    return Trainer(block_protocol_config(kind, data_file, out_dir, steps, seed, overrides), overwrite=True)


@torch.no_grad()
def draftsmith_block_chain(drafter, target, seq: torch.Tensor, k: int) -> list[list[int]]:
    """[1, s] -> preds[a][j]: the block anchored at j + 1, its a-th draft (predicts seq[j + 2 + a])."""
    s = seq.shape[1]
    f = bp.target_features(target, seq, drafter.feature_layers())
    batch = {"input_ids": seq, "attention_mask": torch.ones_like(seq), "aux_hidden_states": f["aux"]}
    anchors = torch.arange(s)[None]  # [1, s]: every position anchors a block
    hidden = drafter.blocks_hidden(batch, anchors)[0]  # [s, B, h]
    if drafter.sample_from_anchor:  # DSpark: slot a predicts x_{p+1+a}; its Markov prev is x_{p+a}
        pos = (anchors[0, :, None] + torch.arange(drafter.block_size)).clamp(max=s - 1)  # [s, B]
        logits, _ = drafter.heads(hidden, seq[0, pos])
        slots = logits[:, :k]
    else:  # DFlash: slot 0 is the anchor, slot a + 1 predicts x_{p+1+a}
        slots = drafter.lm_head(hidden)[:, 1 : k + 1]
    ids = drafter.draft_ids()[slots.argmax(-1)]  # [s, k] target ids
    return [ids[1:, a].tolist() for a in range(k)]


def eagle3_chain(drafter, target, seq, k):
    return bp.draftsmith_chain(drafter, target, seq, k)


# --------------------------------------------------------------------------- speculators
def speculators_model(kind: str, drafter_cfg, mask_token_id: int):
    from transformers import AutoConfig

    verifier = AutoConfig.from_pretrained(bp.STORIES)
    verifier.num_hidden_layers = drafter_cfg.num_layers  # the draft's own layer count
    vocab = verifier.vocab_size
    common = dict(verifier_config=verifier, t2d=torch.ones(vocab, dtype=torch.bool), d2t=torch.zeros(vocab, dtype=torch.long),
                  draft_vocab_size=vocab, block_size=drafter_cfg.block_size, verifier_name_or_path=str(bp.STORIES),
                  target_layer_ids=bp.AUX, draft_attn_impl="sdpa", mask_token_id=mask_token_id)
    if kind == "dflash":
        from speculators.models.dflash import DFlashDraftModel

        return DFlashDraftModel.from_training_args(**common).float()
    from speculators.models.dspark import DSparkDraftModel

    return DSparkDraftModel.from_training_args(**common, markov_rank=drafter_cfg.markov_rank).float()


def speculators_loss_kwargs(kind: str, max_anchors: int, loss: str | None) -> dict:
    """speculators' own per-kind training defaults (train/config/schema.py), eager loss implementations."""
    from speculators.losses import resolve_loss_config

    if kind == "dflash":
        loss = loss or "ce"
        weights = "dpace" if loss == "ce" else "fixed-exp-decay"
        return {"loss_config": resolve_loss_config(loss, "eager"), "gamma": 4.0, "max_anchors": max_anchors,
                "per_position_loss_weight": weights, "dpace_alpha": 0.5}
    return {"loss_config": resolve_loss_config(loss or "kl_div", "eager"),
            "tv_loss_fn": resolve_loss_config("tv", "eager")["tv"][0], "gamma": 4.0, "max_anchors": max_anchors,
            "confidence_head_alpha": 1.0, "per_position_loss_weight": "fixed-exp-decay", "dpace_alpha": 0.5}


def pack_block(batch: dict, feats: dict) -> dict:
    """One padded draftsmith batch -> one packed speculators row (DFlash-family rows are not shifted)."""
    parts = {k: [] for k in ("input_ids", "hidden_states", "verifier_last_hidden_states", "loss_mask", "position_ids",
                             "document_ids")}
    for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        parts["input_ids"].append(batch["input_ids"][b, :length])
        parts["hidden_states"].append(feats["aux"][b, :length])
        parts["verifier_last_hidden_states"].append(feats["last_pre"][b, :length])
        parts["loss_mask"].append(batch["loss_mask"][b, :length].long())
        parts["position_ids"].append(torch.arange(length))
        parts["document_ids"].append(torch.full((length,), b, dtype=torch.long))
    return {k: torch.cat(v)[None] for k, v in parts.items()}


def train_speculators(kind, target, trainer, steps: int, seed: int, max_anchors: int, loss: str | None):
    """speculators' model and loss from our own loop (its CLI needs an accelerator), on draftsmith's batches,
    with draftsmith's lr schedule for this run."""
    from draftsmith.train.loop import lr_lambda

    torch.manual_seed(seed)
    tc = trainer.cfg.train
    model = speculators_model(kind, trainer.drafter.cfg, trainer.drafter.mask_token_id)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=tc.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc, steps))
    kwargs = speculators_loss_kwargs(kind, max_anchors, loss)
    for _ in range(steps):
        batch = next(trainer.stream)
        feats = bp.target_features(target, batch["input_ids"], attention_mask=batch["attention_mask"])
        _, loss_value, _ = model(**pack_block(batch, feats), **kwargs)
        opt.zero_grad()
        loss_value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()
    return model


@contextlib.contextmanager
def captured_logits(kind: str):
    """speculators' forward hands its draft logits straight to compute_metrics: catch them there."""
    import importlib

    core = importlib.import_module(f"speculators.models.{kind}.core")
    caught, original = {}, core.compute_metrics

    def catch(logits, *args, **kwargs):
        caught["logits"] = logits
        return torch.zeros(()), {}

    core.compute_metrics = catch
    try:
        yield caught
    finally:
        core.compute_metrics = original


@torch.no_grad()
def speculators_block_chain(model, target, seq: torch.Tensor, k: int, kind: str) -> list[list[int]]:
    """Every position anchors a block (the row is padded by B positions that no anchor sees, because the
    peer excludes the last B positions from anchoring); -> preds as draftsmith_block_chain."""
    s, B = seq.shape[1], model.block_size
    f = bp.target_features(target, seq)
    pad = lambda x: torch.cat([x, torch.zeros(1, B, *x.shape[2:], dtype=x.dtype)], dim=1)  # noqa: E731
    row = {"input_ids": pad(seq), "hidden_states": pad(f["aux"]), "verifier_last_hidden_states": pad(f["last_pre"]),
           "loss_mask": pad(torch.ones_like(seq)), "document_ids": torch.zeros(1, s + B, dtype=torch.long),
           "position_ids": torch.arange(s + B)[None]}
    with captured_logits(kind) as caught:
        model(**row, **speculators_loss_kwargs(kind, s, None))
    logits = caught["logits"].view(s, B, -1)  # [s, B, dv]
    first = 0 if model.config.sample_from_anchor else 1
    ids = logits[:, first : first + k].argmax(-1)  # [s, k]
    if model.d2t is not None:
        ids = ids + model.d2t[ids]
    return [ids[1:, a].tolist() for a in range(k)]


# --------------------------------------------------------------------------- the measure
def position_acceptance(chains, evalset, k: int) -> list[float]:
    """Per draft position i, over the walked rounds that reached it (bench_peers.walk_rounds' rounds):
    the share whose i-th draft matched. Position 0 is the first drafted token of a round."""
    hit, seen = [0] * k, [0] * k
    for preds, (prompt, cont) in zip(chains, evalset, strict=True):
        seq, n = prompt.tolist() + list(cont), len(cont)
        c, committed = len(prompt) + 1, 1
        while committed < n:
            k_round, a = min(k, n - committed - 1), 0
            while a < k_round:
                seen[a] += 1
                if preds[a][c - 2] != seq[c + a]:
                    break
                hit[a] += 1
                a += 1
            c, committed = c + a + 1, committed + a + 1
    return [h / max(1, s_) for h, s_ in zip(hit, seen)]


def score(chain_fn, model, target, evalset) -> tuple[float, list[float]]:
    """(teacher-forced tau, per-position acceptance) of one drafter on the eval set."""
    chains = [chain_fn(model, target, torch.cat([prompt, torch.tensor(cont)])[None], K) for prompt, cont in evalset]
    return bp.chains_tau(chains, evalset, K), position_acceptance(chains, evalset, K)


# --------------------------------------------------------------------------- one run
def run_one(kind, peers, target, data_file, work, evalset, steps, seed, overrides, peer_anchors, peer_loss) -> dict:
    row = {"kind": kind, "steps": steps, "seed": seed}
    chain = eagle3_chain if kind == "eagle3" else draftsmith_block_chain
    if "draftsmith" in peers:
        t0 = time.perf_counter()
        trainer = draftsmith_trainer(kind, data_file, work / f"ds-{kind}-{steps}-{seed}", steps, seed, overrides)
        trainer.run()
        trainer.drafter.eval()
        row["draftsmith_train_s"] = time.perf_counter() - t0
        row["draftsmith_tau"], row["draftsmith_per_position"] = score(chain, trainer.drafter, target, evalset)
        row["draftsmith_loop_tau"], row["draftsmith_lossless"] = bp.loop_tau(trainer.drafter, target, evalset, K)
        row["draftsmith_trainable_params"] = sum(p.numel() for p in trainer.drafter.trainable_parameters())
    if "speculators" in peers and kind != "eagle3":
        t0 = time.perf_counter()
        fresh = draftsmith_trainer(kind, data_file, work / f"sp-{kind}-{steps}-{seed}", steps, seed, overrides)
        anchors = peer_anchors or fresh.drafter.cfg.num_anchors * bp.DEFAULTS["batch"]
        model = train_speculators(kind, target, fresh, steps, seed, anchors, peer_loss)
        row["speculators_train_s"] = time.perf_counter() - t0
        row["speculators_anchors_per_row"] = anchors
        peer_chain = lambda m, t, q, k_: speculators_block_chain(m, t, q, k_, kind)  # noqa: E731
        row["speculators_tau"], row["speculators_per_position"] = score(peer_chain, model, target, evalset)
        row["speculators_trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return row


def score_checkpoints(dirs: list[Path], target, evalset, out: Path | None) -> int:
    """The measure and the loop check on finished checkpoints (e.g. of a run stopped before its peer half)."""
    from draftsmith.checkpoint import load_drafter

    rows = []
    for d in dirs:
        drafter = load_drafter(d).drafter.eval()
        chain = draftsmith_block_chain if getattr(drafter, "drafts_block", False) else eagle3_chain
        row = {"checkpoint": str(d), "kind": drafter.kind}
        row["draftsmith_tau"], row["draftsmith_per_position"] = score(chain, drafter, target, evalset)
        row["draftsmith_loop_tau"], row["draftsmith_lossless"] = bp.loop_tau(drafter, target, evalset, K)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"protocol": {**bp.DEFAULTS, "k": K, "prompts": len(evalset)}, "runs": rows}, indent=1))
    ok = all(abs(r["draftsmith_tau"] - r["draftsmith_loop_tau"]) <= 0.03 and r["draftsmith_lossless"] for r in rows)
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", nargs="+", default=["dflash", "dspark"], choices=sorted(RECIPES))
    ap.add_argument("--steps", type=int, nargs="+", default=[300])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--peers", default="draftsmith,speculators")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="draftsmith override (the peer follows its lr, schedule, block size and anchors)")
    ap.add_argument("--peer-anchors", type=int, default=None, help="speculators' max_anchors per packed row")
    ap.add_argument("--peer-loss", default=None, help="speculators' loss_fn (default: its kind default, ce / kl_div)")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=None, help="keeps the sampled data between runs")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, 8 stories, 2 prompts")
    ap.add_argument("--score-checkpoints", type=Path, nargs="+", default=None, metavar="DIR",
                    help="score draftsmith checkpoints trained on this protocol (a run's ds-KIND-STEPS-SEED/final), then stop")
    args = ap.parse_args(argv)
    if not bp.STORIES.is_dir():
        print(f"bench_peers_block: {bp.STORIES} is missing; it needs ../shared beside the repository", file=sys.stderr)
        return 2
    n_stories, prompts, eval_tokens = bp.DEFAULTS["stories"], args.prompts, bp.DEFAULTS["eval_new_tokens"]
    if args.smoke:
        args.steps, args.seeds, n_stories, prompts, eval_tokens = [2], [0], 8, 2, 24
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    target = target_mod.load(str(bp.STORIES), dtype="float32", device="cpu")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-peers-block-"))
    work.mkdir(parents=True, exist_ok=True)
    evalset = bp.greedy_continuations(target, prompts, eval_tokens)
    if args.score_checkpoints:
        return score_checkpoints(args.score_checkpoints, target, evalset, args.out)
    data_file = bp.protocol_data(target, work, n_stories, 1234)
    rows = []
    for steps in args.steps:
        for kind in args.kinds:
            for seed in args.seeds:
                row = run_one(kind, peers, target, data_file, work, evalset, steps, seed, args.overrides,
                              args.peer_anchors, args.peer_loss)
                rows.append(row)
                print(json.dumps(row), flush=True)
    report = {"protocol": {**bp.DEFAULTS, "k": K, "prompts": prompts, "eval_new_tokens": eval_tokens, "stories": n_stories,
                           "aux_layers": bp.AUX, "overrides": args.overrides, "peer_anchors": args.peer_anchors,
                           "peer_loss": args.peer_loss}, "runs": rows, "summary": {}}
    for steps in args.steps:
        for kind in args.kinds:
            group = [r for r in rows if r["steps"] == steps and r["kind"] == kind]
            for key in ("draftsmith_tau", "draftsmith_loop_tau", "speculators_tau"):
                if group and key in group[0]:
                    s = report["summary"][f"{kind}_{key}@{steps}"] = bp.summarize([r[key] for r in group])
                    print(f"{kind}_{key}@{steps}: {s['mean']:.3f} ± {s['std']:.3f} (n={len(group)})", flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.out)
    return bp.measure_check(rows)


if __name__ == "__main__":
    sys.exit(main())
