"""Side by side with vLLM speculators on a draftsmith EAGLE-3 recipe that reads an offline feature cache:
held-out acc_0 / acc_1 / acc_2 against training tokens, measured by draftsmith's own evaluation.

What is the same for both (issue 41, item 4):
  rows      the batches draftsmith's Trainer draws for the recipe's seed, in order (the same BatchStream),
            with the features read from the recipe's offline cache (features.complete: aux hidden states,
            and target_logits recomputed from the cached last hidden state); `same_batches` in the output
            compares a hash of every step's input ids on both sides
  labels    speculators computes its labels as verifier_lm_head(verifier_norm(pre-norm last hidden state)),
            i.e. the target's logits over the draft vocabulary. The cache holds the post-norm state, so the
            peer is handed draftsmith's target_logits restricted to the draft vocabulary, with its
            verifier_norm and verifier_lm_head set to identity: both learn from the same teacher logits
  draft vocabulary  draftsmith's d2t / t2d (data/draft_vocab.py from the training rows' token counts), given
            to speculators' load_vocab_mappings; both keep the ids ascending, so draft id i is the same
            target id on both sides (checked)
  shape     the target's hidden size and vocabulary, the recipe's aux layers and TTT steps, 1 draft layer
  optimizer the recipe's AdamW (lr, betas, weight decay), linear warmup + cosine (train/loop.lr_lambda) over
            the same step count, max_grad_norm clipping, batch size and grad_accum, under the recipe's
            precision (its autocast)
  measure   held-out rows = the cache's last data.eval_samples rows; Trainer.evaluate itself, the code
            that logs eval_acc_i to metrics.jsonl, runs on speculators' model through a view whose `unroll`
            yields speculators' per-step logits (captured from its lm_head, one call per TTT step), so
            Eagle3Drafter.forward_loss applies draftsmith's labels, masks and hit rule to them:
            acc_t = share of held-out loss positions where the draft argmax (as a target id) equals the
            target's full-vocabulary argmax, teacher-forced, TTT step t

What is speculators' own (0.9.0, its `speculators train` defaults for eagle3, from its TrainConfig): the
layer built by its create_transformer_layer_config (llama layer, the target's heads and intermediate size,
sliding window 2048), norm_before_residual, norm_before_fc and norm_output on, fc_norm off, kl_div loss
(eager implementation: the fused one needs Triton), ttt_step_loss_decay 1.0, its packed-row collation
(shift_batch), its own weight init (HF post_init, initializer_range of the target); from the target it
copies embed_tokens (frozen), the draft-vocabulary rows of lm_head (frozen: its default) and the final
norm (label path only). Attention runs as sdpa (flex attention has no CPU backward). --peer-set changes
any of its TrainConfig fields (e.g. --peer-set norm_before_fc=false).

    python benchmarks/bench_peer_recipe.py RECIPE.yaml --steps 220 --eval-every 20 --seed 0 \\
        --workdir runs/peer --out results/peer.json [--set key=value ...]
    python benchmarks/bench_peer_recipe.py RECIPE.yaml --tokens 250000 ...       # steps from the mean row length
    python benchmarks/bench_peer_recipe.py RECIPE.yaml --peers speculators --draftsmith-metrics RUN/metrics.jsonl
        # draftsmith's curve from a run already made with the same recipe, seed and steps (its tokens_seen
        # must equal the peer's at every evaluation, else the rows differ and the bench stops)
    python benchmarks/bench_peer_recipe.py --smoke     # stories260K, a tiny cache in a temp dir, 2 steps (CI)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from draftsmith import config as config_mod  # noqa: E402
from draftsmith.core.errors import UserError  # noqa: E402
from draftsmith.data import features  # noqa: E402
from draftsmith.data.features import TopKLogits  # noqa: E402
from draftsmith.heads.eagle3 import Eagle3Drafter  # noqa: E402
from draftsmith.heads.shared import draft_ids_of  # noqa: E402
from draftsmith.heads.vocab_loss import topk_soft_labels  # noqa: E402

SMOKE_RECIPE = REPO / "recipes" / "debug" / "eagle3-stories260k.yaml"
ACC = ("eval_acc_0", "eval_acc_1", "eval_acc_2")


# --------------------------------------------------------------------------- the recipe
def recipe_config(recipe: str, overrides: list[str], out_dir: Path, steps: int | None, seed: int | None,
                  eval_every: int | None):
    """The recipe as `draftsmith train` reads it, with the bench's output dir, budget and evaluation period."""
    extra = [f"train.output_dir={out_dir}", "logging.progress_bar=false", "logging.report_to=[console]"]
    extra += [f"train.max_steps={steps}"] if steps else []
    extra += [f"train.seed={seed}"] if seed is not None else []
    extra += [f"train.eval_every={eval_every}"] if eval_every else []
    cfg = config_mod.load(recipe, overrides + extra)
    where = f"{recipe}"
    if cfg.drafter.kind != "eagle3":
        raise UserError(f"{where}: drafter.kind is {cfg.drafter.kind}; speculators' Eagle3DraftModel is the peer of "
                        "draftsmith's eagle3 only: use an eagle3 recipe")
    if cfg.features.mode != "offline" or cfg.features.source != "draftsmith":
        raise UserError(f"{where}: features.mode must be offline with draftsmith's own cache (features.cache_dir); "
                        "build it with `draftsmith prepare RECIPE --features`")
    if cfg.data.pack_length:
        raise UserError(f"{where}: data.pack_length is set; this bench packs each step's rows for speculators "
                        "itself: set data.pack_length=null")
    if cfg.train.backend != "single":
        raise UserError(f"{where}: train.backend={cfg.train.backend}; the bench runs one process: set train.backend=single")
    if not cfg.data.eval_samples:
        raise UserError(f"{where}: data.eval_samples is 0: the comparison is measured on held-out rows; set it")
    return cfg


def steps_for_tokens(trainer, tokens: int) -> int:
    """Optimizer steps whose batches hold about `tokens` training tokens (mean row length of the cache)."""
    lengths = trainer.train_set.lengths()
    per_step = trainer.cfg.train.batch_size * trainer.cfg.train.grad_accum * sum(lengths) / len(lengths)
    return max(1, math.ceil(tokens / per_step))


class HashedStream:
    """The trainer's batch stream, unchanged, recording a hash of each batch's input ids and mask."""

    def __init__(self, stream):
        self.stream, self.hashes = stream, []

    def __next__(self):
        batch = next(self.stream)
        h = hashlib.sha256(batch["input_ids"].numpy().tobytes() + batch["attention_mask"].numpy().tobytes())
        self.hashes.append(h.hexdigest()[:16])
        return batch

    def __iter__(self):
        return self

    def __getattr__(self, name):  # state_dict, epoch, ... of the stream itself
        return getattr(self.stream, name)


def curve_from_metrics(path: Path) -> list[dict]:
    """Held-out evaluations of a draftsmith run's metrics.jsonl: step, tokens_seen, eval_acc_*, eval_loss."""
    points = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if "eval_acc_0" in record:
            points.append({k: v for k, v in record.items()
                           if k in ("step", "tokens_seen", "eval_loss") or k.startswith("eval_acc_")})
    return points


# --------------------------------------------------------------------------- speculators' model
def verifier_folder(target, path: Path) -> Path:
    """What speculators reads of its verifier, written from the loaded target (a GGUF target has no HF
    folder): config.json and model.safetensors with embed_tokens, lm_head and the final norm."""
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    target.config.save_pretrained(path)
    tensors = {"model.embed_tokens.weight": target.embed_tokens.weight, "lm_head.weight": target.lm_head.weight,
               "model.norm.weight": target.model.model.norm.weight}
    save_file({k: v.detach().float().contiguous().clone() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def speculators_settings(verifier: Path, cfg, drafter, peer_set: list[str]) -> dict:
    """speculators' `train` defaults for eagle3 (its TrainConfig), with the recipe's shape and CPU's needs."""
    from speculators.train.config.schema import TrainConfig

    flat = TrainConfig.from_flat({"speculator_type": "eagle3", "verifier_name_or_path": str(verifier),
                                  "data_path": str(verifier)}).flatten()
    flat.update(target_layer_ids=list(drafter.aux_layer_ids), ttt_steps=drafter.cfg.ttt_steps,
                draft_vocab_size=len(drafter.d2t), draft_attn_impl="sdpa", loss_implementation="eager",
                mask_token_id=0)  # eagle3 reads no mask token; given so that no tokenizer is loaded
    for item in peer_set:
        key, _, value = item.partition("=")
        if key not in flat:
            raise UserError(f"--peer-set {item}: speculators' TrainConfig has no field {key!r}")
        flat[key] = json.loads(value) if value not in ("", "None") else None
    return flat


def speculators_model(settings: dict, drafter, seed: int):
    """Eagle3DraftModel built by speculators' own `build_draft_model`, on draftsmith's draft vocabulary."""
    from speculators.models.eagle3 import Eagle3DraftModel
    from speculators.train.cli import build_draft_model

    torch.manual_seed(seed)
    d2t, t2d = drafter.d2t.cpu().clone(), drafter.t2d.cpu().clone()
    model = build_draft_model(argparse.Namespace(**settings), Eagle3DraftModel, t2d, d2t, len(d2t))
    peer_ids = draft_ids_of(model.d2t) if model.d2t is not None else torch.arange(model.draft_vocab_size)
    if not torch.equal(peer_ids, drafter.draft_ids().cpu()):
        raise RuntimeError("speculators' draft vocabulary differs from draftsmith's")
    model.verifier_norm, model.verifier_lm_head = nn.Identity(), nn.Identity()  # labels: draftsmith's target logits
    return model.float()


# A label logit speculators' softmax turns into exactly 0 in float32 (exp underflows): a draft id the top-K cache
# does not hold.
ABSENT_LOGIT = -1.0e4


def peer_label_logits(target_logits, draft_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """The batch's labels as the [b, s, dv] float32 logits speculators' softmax reads: the target's logits over the
    draft vocabulary divided by drafter.label_temperature, or, from a top-K cache (features.label_topk), the log of
    draftsmith's own top-K soft labels (vocab_loss.topk_soft_labels, the same temperature) with ABSENT_LOGIT where
    they are 0, so both sides train on the same distribution. One difference is left: a position none of whose K
    entries the draft vocabulary holds teaches draftsmith nothing, while the peer's labels there are uniform (the
    peer masks by input position per TTT step, so it cannot be masked out here). Such positions are rare: the
    K largest logits almost always hold a draft id."""
    if isinstance(target_logits, TopKLogits):
        p, _ = topk_soft_labels(target_logits, draft_ids, temperature)
        return torch.where(p > 0, p.clamp_min(1e-30).log(), torch.full_like(p, ABSENT_LOGIT))
    return target_logits[..., draft_ids].float() / temperature


def packed_rows(batch: dict, draft_ids: torch.Tensor, with_labels: bool, temperature: float = 1.0) -> dict:
    """One padded draftsmith batch -> one packed speculators row, each row shifted as its shift_batch does
    (bench_peers.pack); the label slot carries the target's logits over the draft vocabulary."""
    from bench_peers import pack

    lengths = batch["attention_mask"].sum(1)
    if not torch.equal(batch["attention_mask"], (torch.arange(batch["input_ids"].shape[1])[None] < lengths[:, None]).long()):
        raise RuntimeError("the bench expects right-padded rows (draftsmith's collate)")
    feats = {"aux": batch["aux_hidden_states"].float(),
             "last_pre": peer_label_logits(batch["target_logits"], draft_ids, temperature) if with_labels
             else batch["input_ids"].new_zeros(batch["input_ids"].shape + (1,)).float()}
    packed = pack(batch, feats)
    if not with_labels:
        packed.pop("verifier_last_hidden_states")
    return packed


class SpeculatorsView(Eagle3Drafter):
    """speculators' model seen through Eagle3Drafter.forward_loss, so draftsmith's own evaluation measures it.

    `unroll` runs speculators' forward on the batch packed as it trains (document masks keep rows apart) and
    yields its step-t logits as the step state, laid out as draftsmith's [b, s-1-t, dv]; `logits` is the
    identity. The mapping: speculators' packed index i of row b is draftsmith's position j = i - offset_b (it
    reads h_j and x_{j+1}); its step t at index i is trained against the target at index i + t (its
    align_for_step), i.e. it predicts x_{j+2+t}, which is what draftsmith's step t at j predicts. Positions
    j >= L_b - 1 - t read the next row's tokens in the packed row; draftsmith's mask excludes them."""

    def __init__(self, peer, drafter: Eagle3Drafter):
        nn.Module.__init__(self)  # no layers of its own: the peer's
        self.cfg, self.peer, self.aux_layer_ids = drafter.cfg, peer, list(drafter.aux_layer_ids)
        self.register_buffer("d2t", drafter.d2t.clone())
        self.register_buffer("t2d", drafter.t2d.clone())

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        return state

    def unroll(self, batch, steps=None, states=False, anchors=None):
        steps = steps or self.cfg.ttt_steps
        packed = packed_rows(batch, self.draft_ids(), with_labels=False)
        captured: list[torch.Tensor] = []
        handle = self.peer.lm_head.register_forward_hook(lambda mod, inp, out: captured.append(out))
        try:
            self.peer(**packed, ttt_steps=steps)
        finally:
            handle.remove()
        b, s = batch["input_ids"].shape
        lengths = batch["attention_mask"].sum(1).tolist()
        offsets = [0] + list(torch.tensor(lengths).sub(1).cumsum(0).tolist())
        for t, logits in enumerate(captured):  # [1, sum(L_b - 1), dv]
            n = s - 1 - t
            if n <= 0:
                break
            out = logits.new_zeros(b, n, logits.shape[-1])
            for row, length in enumerate(lengths):
                m = min(n, length - 1)
                out[row, :m] = logits[0, offsets[row]: offsets[row] + m]
            yield t, out


def train_speculators(trainer, model, settings: dict, eval_every: int, log=print, on_point=None) -> dict:
    """speculators' model on the trainer's own batches, optimizer and schedule; held-out evaluation every
    eval_every steps through trainer.evaluate() (the draftsmith measure). -> curve, times, batch hashes.
    on_point(curve): called after each evaluation (the bench writes its partial results there)."""
    from speculators.losses import resolve_loss_config

    from draftsmith.train.loop import lr_lambda, move, with_prompt_loss

    tc = trainer.cfg.train
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(tc, trainer.total_steps))
    loss_config = resolve_loss_config(settings["loss_fn"], settings["loss_implementation"])
    view = SpeculatorsView(model, trainer.drafter)
    measured = trainer.drafter
    stream = HashedStream(trainer.stream)
    draft_ids, label_temperature = trainer.drafter.draft_ids(), trainer.drafter.cfg.label_temperature
    curve, tokens_seen, train_s, eval_s = [], 0.0, 0.0, 0.0
    model.train()
    for step in range(1, trainer.total_steps + 1):
        t0 = time.perf_counter()
        for _ in range(tc.grad_accum):
            raw = next(stream)
            tokens_seen += float(raw["attention_mask"].sum())
            batch = features.complete(trainer.target, move(raw, trainer.ctx.device), trainer.required, trainer.layers)
            if tc.loss_on_prompt:  # the recipe's train.loss_on_prompt, as draftsmith's Trainer applies it; and as the
                batch = with_prompt_loss(batch)  # rows are packed end to end, where speculators' step t reads labels t on,
                batch["loss_mask"][1:, 1 : settings["ttt_steps"]] = 0  # a row's first labels go (else the row before's)
            with trainer.autocast():
                rows = packed_rows(batch, draft_ids, with_labels=True, temperature=label_temperature)
                _, loss, _ = model(**rows, ttt_steps=settings["ttt_steps"],
                                   ttt_step_loss_decay=settings["ttt_step_loss_decay"], loss_config=loss_config)
            (loss / tc.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(params, tc.max_grad_norm)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        if step % eval_every == 0:  # where Trainer.run evaluates
            t0 = time.perf_counter()
            trainer.drafter = view  # Trainer.evaluate reads self.drafter
            try:
                point = {"step": step, "tokens_seen": tokens_seen, **trainer.evaluate()}
            finally:
                trainer.drafter = measured
            point["speculators_own_acc_0"] = own_acc_0(trainer, model, settings, loss_config)
            eval_s += time.perf_counter() - t0
            curve.append(point)
            if on_point is not None:
                on_point(curve)
            log(f"[speculators] step {step} tokens {tokens_seen:,.0f} "
                + " ".join(f"{k[5:]} {point[k]:.4f}" for k in ACC if k in point)
                + f" (its own full_acc_0 {point['speculators_own_acc_0']:.4f})")
    return {"curve": curve, "train_s": train_s, "eval_s": eval_s, "batch_hashes": stream.hashes,
            "trainable_params": sum(p.numel() for p in params)}


@torch.no_grad()
def own_acc_0(trainer, model, settings: dict, loss_config) -> float:
    """Cross-check: speculators' own step-0 accuracy (its full_acc_0) on the same held-out rows and batches,
    by its own rule: argmax over the draft vocabulary against the labels' draft-vocabulary argmax, under its
    shifted loss mask (shift_batch keeps loss_mask[j + 1] for the label at j + 1, draftsmith masks by the
    predicted token, loss_mask[j + 2]). Equal to eval_acc_0 up to those two differences."""
    from draftsmith.data import collate
    from draftsmith.train.loop import move

    model.eval()
    hits = total = 0.0
    size, pad_id = trainer.cfg.train.batch_size, trainer.target.tokenizer.pad_token_id or 0
    for start in range(0, len(trainer.heldout), size):
        items = [trainer.heldout[i] for i in range(start, min(len(trainer.heldout), start + size))]
        batch = features.complete(trainer.target, move(collate(items, pad_id), trainer.ctx.device), trainer.required,
                                  trainer.layers)
        rows = packed_rows(batch, trainer.drafter.draft_ids(), with_labels=True,
                           temperature=trainer.drafter.cfg.label_temperature)
        _, _, metrics = model(**rows, ttt_steps=1,
                              ttt_step_loss_decay=settings["ttt_step_loss_decay"], loss_config=loss_config)
        hits, total = hits + float(metrics["full_acc_0_sum"]), total + float(metrics["full_acc_0_total"])
    model.train()
    return hits / max(total, 1.0)


# --------------------------------------------------------------------------- draftsmith's own run
def run_draftsmith(cfg, target=None, log=print) -> dict:
    """`draftsmith train` on the recipe (the same Trainer), its curve read back from its metrics.jsonl."""
    from draftsmith.train.loop import Trainer

    trainer = Trainer(cfg, target=target, overwrite=True)  # the bench owns its workdir; the target already loaded
    trainer.stream = HashedStream(trainer.stream)
    t0 = time.perf_counter()
    trainer.run()
    wall = time.perf_counter() - t0
    curve = curve_from_metrics(Path(cfg.train.output_dir) / "metrics.jsonl")
    for p in curve:
        log(f"[draftsmith] step {p['step']} tokens {p['tokens_seen']:,.0f} "
            + " ".join(f"{k[5:]} {p[k]:.4f}" for k in ACC if k in p))
    return {"curve": curve, "wall_s": wall, "batch_hashes": trainer.stream.hashes,
            "trainable_params": sum(p.numel() for p in trainer.drafter.trainable_parameters())}


# --------------------------------------------------------------------------- the machine
def machine() -> dict:
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout if os.path.exists("/usr/bin/lscpu") else ""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {"model": fields.get("Model name", "").strip(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "lscpu_flags": fields.get("Flags", "").split(), "load_average": list(os.getloadavg())}


def compare(ds_curve: list[dict], sp_curve: list[dict]) -> list[dict]:
    """Per evaluation step both curves hold: tokens (equal when the rows are), acc_i of each, acc_0 ratio."""
    peer = {p["step"]: p for p in sp_curve}
    rows = []
    for p in ds_curve:
        q = peer.get(p["step"])
        if q is None:
            continue
        if abs(p["tokens_seen"] - q["tokens_seen"]) > 0.5:
            raise UserError(f"step {p['step']}: draftsmith's curve saw {p['tokens_seen']:.0f} tokens, speculators "
                            f"{q['tokens_seen']:.0f}: they did not train on the same rows (same recipe, seed and "
                            "steps needed; with --draftsmith-metrics, a run of exactly this recipe)")
        row = {"step": p["step"], "tokens_seen": p["tokens_seen"]}
        for k in ACC:
            if k in p and k in q:
                row[f"draftsmith_{k[5:]}"], row[f"speculators_{k[5:]}"] = p[k], q[k]
        row["acc_0_ratio"] = p["eval_acc_0"] / q["eval_acc_0"] if q["eval_acc_0"] > 0 else None
        rows.append(row)
    return rows


# --------------------------------------------------------------------------- main
def smoke_recipe(work: Path, log=print) -> tuple[str, list[str]]:
    """stories260K's EAGLE-3 recipe on a few Alpaca rows (no regeneration), with a float32 offline cache
    built in `work`: 2 steps of batch 4, 3 TTT steps, evaluation after each step on 4 held-out rows."""
    from draftsmith.commands.prepare import run_features

    shared = Path(os.environ.get("DRAFTSMITH_SHARED", REPO.parent / "shared"))
    overrides = [f"target.path={shared / 'models' / 'stories260K-hf'}",
                 f"data.path=[{shared / 'data' / 'alpaca' / 'alpaca_en_demo.json'}]", "data.max_samples=16",
                 "data.eval_samples=4", "regenerate.output=null", "features.mode=offline",
                 f"features.cache_dir={work / 'features'}", "features.dtype=float32", "drafter.ttt_steps=3",
                 "drafter.draft_vocab_size=256", "train.batch_size=4", "train.warmup_steps=1", "train.min_lr_ratio=0.1"]
    cfg = config_mod.load(str(SMOKE_RECIPE), overrides + [f"train.output_dir={work / 'cache-build'}"])
    run_features(cfg, log=lambda line: log(f"[cache] {line}"))
    return str(SMOKE_RECIPE), overrides


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe", nargs="?", help="an eagle3 recipe with features.mode offline and a built cache")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="recipe override key=value")
    budget = ap.add_mutually_exclusive_group()
    budget.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the recipe's)")
    budget.add_argument("--tokens", type=int, default=None, help="training tokens (steps from the mean row length)")
    ap.add_argument("--seed", type=int, default=None, help="train.seed (default: the recipe's)")
    ap.add_argument("--eval-every", type=int, default=None, help="held-out evaluation period in steps (default: the recipe's)")
    ap.add_argument("--peers", default="draftsmith,speculators")
    ap.add_argument("--draftsmith-metrics", type=Path, default=None,
                    help="draftsmith's curve from this metrics.jsonl (a run of the same recipe, seed and steps)")
    ap.add_argument("--peer-set", action="append", default=[], help="speculators TrainConfig field=value (JSON value)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="stories260K, tiny cache in the workdir, 2 steps (CI)")
    args = ap.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-peer-recipe-"))
    work.mkdir(parents=True, exist_ok=True)
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    try:
        if args.smoke:
            args.recipe, smoke_sets = smoke_recipe(work)
            args.overrides, args.steps, args.eval_every, args.seed = smoke_sets + args.overrides, 2, 1, 0
        if not args.recipe:
            ap.error("give a recipe (or --smoke)")
        return run(args, work, peers)
    except UserError as exc:
        print(f"bench_peer_recipe: {exc}", file=sys.stderr)
        return 2


def write(out: Path | None, report: dict) -> None:
    """The report as JSON (atomically: a partial report is rewritten after every evaluation)."""
    if out is None:
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(out)


def run(args, work: Path, peers: list[str]) -> int:
    from draftsmith.train.loop import Trainer

    if args.draftsmith_metrics and not args.draftsmith_metrics.is_file():
        raise UserError(f"--draftsmith-metrics {args.draftsmith_metrics}: no such file (a run's metrics.jsonl)")
    cfg = recipe_config(args.recipe, args.overrides, work / "speculators", args.steps, args.seed, args.eval_every)
    trainer = Trainer(cfg, overwrite=True)  # the peer's: its stream, held-out rows, target and draft vocabulary
    if args.tokens:
        steps = steps_for_tokens(trainer, args.tokens)
        trainer.release()
        cfg = recipe_config(args.recipe, args.overrides, work / "speculators", steps, args.seed, args.eval_every)
        trainer = Trainer(cfg, overwrite=True)
    # both evaluate where Trainer.run does (step % eval_every == 0): at least once, at the end of a short run
    eval_every = min(cfg.train.eval_every or max(1, trainer.total_steps // 10), trainer.total_steps)
    cfg.train.eval_every = eval_every
    report = {"recipe": args.recipe, "overrides": args.overrides, "tokens_requested": args.tokens,
              "steps": trainer.total_steps, "seed": cfg.train.seed,
              "eval_every": eval_every, "batch_size": cfg.train.batch_size, "grad_accum": cfg.train.grad_accum,
              "precision": cfg.train.precision, "features": {"cache_dir": cfg.features.cache_dir, "dtype": cfg.features.dtype},
              "heldout_rows": len(trainer.heldout), "draft_vocab_size": len(trainer.drafter.d2t),
              "aux_layer_ids": list(trainer.drafter.aux_layer_ids), "ttt_steps": trainer.drafter.cfg.ttt_steps,
              "machine_before": machine()}
    if "speculators" in peers:
        settings = speculators_settings(verifier_folder(trainer.target, work / "verifier"), cfg, trainer.drafter,
                                        args.peer_set)
        model = speculators_model(settings, trainer.drafter, cfg.train.seed)
        t0 = time.perf_counter()
        sp = train_speculators(trainer, model, settings, eval_every,
                               on_point=lambda curve: write(args.out, {**report, "speculators_partial": curve}))
        sp["wall_s"] = time.perf_counter() - t0
        sp["settings"] = {k: settings[k] for k in ("num_layers", "draft_arch", "norm_before_residual", "norm_before_fc",
                                                   "norm_output", "fc_norm", "embed_requires_grad", "loss_fn",
                                                   "loss_implementation", "ttt_steps", "ttt_step_loss_decay",
                                                   "target_layer_ids", "draft_vocab_size", "draft_attn_impl",
                                                   "sliding_window")}
        sp["copied_from_target"] = ("embed_tokens (frozen), lm_head rows of the draft vocabulary (frozen), final norm "
                                    "and lm_head as the label path (replaced here by draftsmith's target logits)")
        report["speculators"] = sp
    trainer.release()
    if "draftsmith" in peers:
        ds_cfg = recipe_config(args.recipe, args.overrides, work / "draftsmith", trainer.total_steps, cfg.train.seed,
                               eval_every)
        report["draftsmith"] = run_draftsmith(ds_cfg, trainer.target)
    elif args.draftsmith_metrics:
        report["draftsmith"] = {"curve": curve_from_metrics(args.draftsmith_metrics), "from": str(args.draftsmith_metrics)}
    if "draftsmith" in report and "speculators" in report:
        ds, sp = report["draftsmith"], report["speculators"]
        if "batch_hashes" in ds:
            report["same_batches"] = ds["batch_hashes"] == sp["batch_hashes"]
        report["side_by_side"] = compare(ds["curve"], sp["curve"])
        if not report["side_by_side"]:
            raise UserError("draftsmith's and speculators' curves share no evaluation step: use the same --eval-every")
        for row in report["side_by_side"]:
            print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    report["machine_after"] = machine()
    write(args.out, report)
    if report.get("same_batches") is False:
        print("bench_peer_recipe: draftsmith and speculators did not train on the same batches", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
