"""Side by side: draftsmith's EAGLE-3 and vLLM speculators' Eagle3DraftModel trained on identical
token sequences with an identical budget, measured with one acceptance measure.

Protocol (issue 10; ../shared/peers-on-cpu.md):
  target    stories260K (../shared/models/stories260K-hf), fp32, aux layers [1, 2, 4]
  data      240 stories sampled from the target itself (T = 0.8, 160 new tokens, prompts drawn
            from this file's own openings, seed --data-seed), given to draftsmith as text rows;
            the token sequences draftsmith builds from them are the ones speculators gets, packed
            4 per step (draftsmith pads the same 4 per step)
  budget    --steps optimizer steps x 4 sequences (~640 tokens), 1 draft layer, 3 TTT steps
  measure   teacher-forced chain tau on target-greedy continuations: 10 held-out prompts,
            128 greedy new tokens each (EOS ignored), rounds walked exactly as the speculative
            loop walks them (k = 3): a round starting at context length c accepts the longest
            prefix of the drafter's chain from c that matches the continuation, then commits
            accepted + 1. tau = sum committed / sum rounds over all prompts (pooled).
            The chain is each model's own teacher-forced TTT unroll, so it needs no loop code.
  check     draftsmith's drafter also runs through draftsmith's real loop (eval/loop.py) on the
            same prompts; both taus must agree within 0.03 and the output must equal
            target-only greedy decoding.

    OMP_NUM_THREADS=2 python -u benchmarks/bench_peers.py --steps 300 --seeds 0 1 2
    OMP_NUM_THREADS=2 python -u benchmarks/bench_peers.py --steps 300 3000 --seeds 0 1 2 --out results/peers.json
    python benchmarks/bench_peers.py --smoke          # 2 steps, 1 seed, 2 prompts (CI runs this)
    python benchmarks/bench_peers.py --steps 300 --seeds 0 1 2 --peers draftsmith \\
        --set step_decay=0.8 --set train.min_lr_ratio=0.1     # one ablation row
    python benchmarks/bench_peers.py --peers draftsmith --features-cache int8 --workdir /tmp/bp
        # draftsmith trains from an offline feature cache of that dtype (built once in --workdir)

Outside trainers (a peer that cannot share this environment, e.g. Model Optimizer, which needs
transformers < 5.15) get the protocol as files and hand back chains; the measure stays this file's:
    python benchmarks/bench_peers.py --export-protocol runs/protocol --seeds 0 1 2 --workdir /tmp/bp
        # eval.json (prompt + greedy continuation ids) and train-seed{S}.json: the exact rows draftsmith
        # trains on for that seed, max(--steps) batches of 4 in order
    python benchmarks/bench_peers.py --score-chains runs/modelopt/*.chains.json --out results/modelopt.json
        # tau of chains made outside (benchmarks/peer_modelopt.py writes them) with walk_rounds
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith import config as config_mod  # noqa: E402
from draftsmith.eval.loop import LoopConfig, generate  # noqa: E402
from draftsmith.targets import load as target_mod  # noqa: E402

STORIES = Path(os.environ.get("DRAFTSMITH_SHARED", REPO.parent / "shared")) / "models" / "stories260K-hf"
RECIPE = REPO / "recipes" / "debug" / "eagle3-stories260k.yaml"
AUX = [1, 2, 4]
# Our own story openings: training prompts and held-out evaluation prompts never overlap.
TRAIN_OPENINGS = [
    "Once upon a time", "One day,", "There was a little", "Tom and Sue", "A big dog", "The sun was",
    "Lily liked to", "In a small town", "Ben had a", "The cat saw", "Mom said", "It was a rainy day",
    "A little bird", "Sam wanted to", "The boy found", "Anna and her mom",
]
EVAL_OPENINGS = [
    "Once upon a time, there was a girl named", "One day, a little boy went to the", "The dog and the cat",
    "Tim was very happy because", "Sara had a red ball.", "The big tree in the park", "A small fish lived",
    "Max and Lucy went to the", "The old man had a", "Jack saw a shiny",
]
DEFAULTS = {"k": 3, "eval_new_tokens": 128, "stories": 240, "story_tokens": 160, "temperature": 0.8, "batch": 4}


# --------------------------------------------------------------------------- data
def encode_prompt(target, text: str) -> torch.Tensor:
    tok = target.tokenizer
    ids = [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


@torch.no_grad()
def sample_stories(target, n: int, new_tokens: int, temperature: float, seed: int) -> list[str]:
    """n stories sampled from the target itself (ancestral sampling at `temperature`, EOS ignored).
    Story i opens with a seeded random opening; stories sharing an opening are sampled as one batch."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    choice = torch.randint(len(TRAIN_OPENINGS), (n,), generator=g).tolist()
    stories: list[str] = [""] * n
    for o, opening in enumerate(TRAIN_OPENINGS):
        rows = [i for i in range(n) if choice[i] == o]
        if not rows:
            continue
        prompt = encode_prompt(target, opening)
        step_in = prompt[None].expand(len(rows), -1)  # [r, p]
        cache, out = DynamicCache(config=target.config), []
        for _ in range(new_tokens):
            logits = target.forward(step_in, cache=cache).logits[:, -1].float() / temperature  # [r, V]
            step_in = torch.multinomial(torch.softmax(logits, -1), 1, generator=g)  # [r, 1]
            out.append(step_in)
        body = torch.cat(out, dim=1)  # [r, new_tokens]
        for r, i in enumerate(rows):
            stories[i] = target.tokenizer.decode(prompt[1:].tolist() + body[r].tolist(), skip_special_tokens=True)
    return stories


def protocol_data(target, work: Path, n_stories: int, data_seed: int, story_tokens: int = DEFAULTS["story_tokens"]) -> Path:
    """The protocol's self-sampled stories as a JSONL of text rows, written once per (n, seed, length)
    into `work` (atomically), and reused by every run and benchmark that shares the work dir."""
    name = f"stories-{n_stories}-{data_seed}" + ("" if story_tokens == DEFAULTS["story_tokens"] else f"-{story_tokens}t")
    data_file = work / f"{name}.jsonl"
    if not data_file.exists():
        t0 = time.perf_counter()
        stories = sample_stories(target, n_stories, story_tokens, DEFAULTS["temperature"], data_seed)
        tmp = data_file.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps({"text": s}) + "\n" for s in stories))
        tmp.replace(data_file)
        print(f"sampled {n_stories} stories in {time.perf_counter() - t0:.0f} s -> {data_file}", flush=True)
    return data_file


@torch.no_grad()
def greedy_continuations(target, n_prompts: int, new_tokens: int) -> list[tuple[torch.Tensor, list[int]]]:
    """(prompt ids, target-greedy continuation) through the loop's own k = 0 path, EOS ignored."""
    out = []
    for text in EVAL_OPENINGS[:n_prompts]:
        prompt = encode_prompt(target, text)
        gen = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=new_tokens, eos_ids=[]))
        out.append((prompt, gen.tokens))
    return out


# --------------------------------------------------------------------------- the one measure
def walk_rounds(preds: list[list[int]], seq: list[int], prompt_len: int, new_tokens: int, k: int) -> tuple[int, int]:
    """Rounds of the speculative loop over a fixed greedy continuation.

    preds[t][j]: the drafter's step-t token at drafter position j, which predicts seq[j + 2 + t].
    The loop commits the first token from the prefill, then each round starting at context
    length c drafts from position c - 2 and accepts the matching prefix. -> (committed, rounds).
    """
    c, committed, rounds = prompt_len + 1, 1, 0
    while committed < new_tokens:
        k_round = min(k, new_tokens - committed - 1)
        a = 0
        while a < k_round and preds[a][c - 2] == seq[c + a]:
            a += 1
        c, committed, rounds = c + a + 1, committed + a + 1, rounds + 1
    return committed - 1, rounds  # the prefill's token is not a round's


@torch.no_grad()
def target_features(target, seq: torch.Tensor, layers: list[int] = AUX, attention_mask=None) -> dict:
    """[b, s] ids -> aux hidden states [b, s, n*h] of `layers`, pre-norm last hidden [b, s, h], logits [b, s, V]."""
    captured = {}
    norm = target.model.model.norm
    handle = norm.register_forward_hook(lambda mod, inp, out: captured.__setitem__("pre", inp[0]))
    try:
        out = target.forward(seq, attention_mask=attention_mask)
    finally:
        handle.remove()
    return {"aux": torch.cat([out.hidden_states[i] for i in layers], dim=-1), "last_pre": captured["pre"],
            "logits": out.logits}


@torch.no_grad()
def draftsmith_chain(drafter, target, seq: torch.Tensor, k: int) -> list[list[int]]:
    f = target_features(target, seq, drafter.feature_layers())
    batch = {"input_ids": seq, "attention_mask": torch.ones_like(seq), "aux_hidden_states": f["aux"]}
    ids = drafter.draft_ids()
    return [ids[logits[0].argmax(-1)].tolist() for _, logits in drafter.unroll(batch, steps=k)]


@torch.no_grad()
def speculators_chain(model, target, seq: torch.Tensor, k: int) -> list[list[int]]:
    f = target_features(target, seq)
    s = seq.shape[1]
    tokens = model(hidden_states=f["aux"][:, :-1], input_ids=seq[:, 1:], document_ids=torch.zeros(1, s - 1, dtype=torch.long),
                   position_ids=torch.arange(1, s)[None], ttt_steps=k)
    d2t = model.d2t if model.d2t is not None else torch.zeros(model.config.draft_vocab_size, dtype=torch.long)
    return [(t[0] + d2t[t[0]]).tolist() for t in tokens]


def chains_tau(chains: list[list[list[int]]], evalset, k: int) -> float:
    """Pooled tau of per-prompt chains (chains[p][t][j] as walk_rounds' preds) over the eval set."""
    committed = rounds = 0
    for preds, (prompt, cont) in zip(chains, evalset, strict=True):
        c, r = walk_rounds(preds, prompt.tolist() + list(cont), len(prompt), len(cont), k)
        committed, rounds = committed + c, rounds + r
    return committed / rounds


def teacher_forced_tau(chain_fn, model, target, evalset, k: int) -> float:
    chains = [chain_fn(model, target, torch.cat([prompt, torch.tensor(cont)])[None], k) for prompt, cont in evalset]
    return chains_tau(chains, evalset, k)


@torch.no_grad()
def loop_tau(drafter, target, evalset, k: int) -> tuple[float, bool]:
    """tau through draftsmith's real loop, and whether every output equals target-only greedy."""
    committed = rounds = 0
    lossless = True
    for prompt, cont in evalset:
        gen = generate(target, drafter.make_proposer(target), prompt, LoopConfig(k=k, max_new_tokens=len(cont), eos_ids=[]))
        lossless &= gen.tokens == cont
        committed += sum(r.committed for r in gen.rounds)
        rounds += len(gen.rounds)
    return committed / rounds, lossless


# --------------------------------------------------------------------------- trainers
def protocol_config(data_file: Path, out_dir: Path, steps: int, seed: int, overrides: list[str]):
    """The EAGLE-3 debug recipe as a user runs it (its lr, schedule and the kind's defaults), on the
    protocol's data, budget, aux layers and TTT steps; `overrides` are the ablation's changes."""
    protocol = [f"data.path=[{data_file}]", "data.max_length=192", "data.text_chunk_tokens=256", "data.eval_samples=0",
                "regenerate.output=null", f"target.path={STORIES}", "target.device=cpu",
                f"drafter.aux_layer_ids=[{','.join(map(str, AUX))}]", "drafter.ttt_steps=3",
                f"train.output_dir={out_dir}", f"train.max_steps={steps}", f"train.batch_size={DEFAULTS['batch']}",
                f"train.seed={seed}", f"train.log_every={max(1, steps // 4)}", "train.eval_every=0",
                "logging.progress_bar=false"]
    extra = [o if "." in o.split("=")[0] else f"drafter.{o}" for o in overrides]
    return config_mod.load(str(RECIPE), protocol + extra)


def draftsmith_trainer(data_file: Path, out_dir: Path, steps: int, seed: int, overrides: list[str]):
    from draftsmith.train.loop import Trainer

    cfg = protocol_config(data_file, out_dir, steps, seed, overrides)
    return Trainer(cfg, overwrite=True)  # the benchmark owns its workdir


def cache_overrides(data_file: Path, work: Path, dtype: str) -> list[str]:
    """Overrides that make draftsmith train from an offline feature cache of `dtype` holding the
    protocol's rows; the cache is built on first use (`draftsmith prepare --features` does the same)."""
    from draftsmith.commands.prepare import run_features

    cache = work / f"features-{dtype}"
    extra = ["features.mode=offline", f"features.cache_dir={cache}", f"features.dtype={dtype}"]
    cfg = protocol_config(data_file, work / "cache-build", 1, 0, extra)
    run_features(cfg, log=lambda line: print(f"[cache {dtype}] {line}", flush=True))  # resumable: a full cache is kept
    return extra


def train_draftsmith(data_file, out_dir, steps, seed, overrides):
    trainer = draftsmith_trainer(data_file, out_dir, steps, seed, overrides)
    trainer.run()
    trainer.drafter.eval()
    return trainer


def speculators_model(target):
    from speculators.models.eagle3 import Eagle3DraftModel
    from transformers import AutoConfig

    verifier = AutoConfig.from_pretrained(STORIES)
    verifier.num_hidden_layers = 1  # the draft's own layer count
    vocab = target.vocab_size
    model = Eagle3DraftModel.from_training_args(
        verifier_config=verifier, t2d=torch.ones(vocab, dtype=torch.bool), d2t=torch.zeros(vocab, dtype=torch.long),
        num_layers=1, norm_before_residual=True, ttt_steps=3, draft_vocab_size=vocab,
        verifier_name_or_path=str(STORIES), target_layer_ids=AUX, draft_attn_impl="sdpa")
    return model.float()


def pack(batch: dict, feats: dict) -> dict:
    """One padded draftsmith batch -> one packed speculators row (each document shifted as shift_batch does)."""
    parts = {"input_ids": [], "hidden_states": [], "verifier_last_hidden_states": [], "loss_mask": [],
             "position_ids": [], "document_ids": []}
    for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        parts["input_ids"].append(batch["input_ids"][b, 1:length])
        parts["hidden_states"].append(feats["aux"][b, : length - 1])
        parts["verifier_last_hidden_states"].append(feats["last_pre"][b, 1:length])
        parts["loss_mask"].append(batch["loss_mask"][b, 1:length].bool())
        parts["position_ids"].append(torch.arange(1, length))
        parts["document_ids"].append(torch.full((length - 1,), b, dtype=torch.long))
    return {k: torch.cat(v)[None] for k, v in parts.items()}


def train_speculators(target, trainer, steps: int, seed: int):
    """speculators' Eagle3DraftModel from our own loop (its CLI needs an accelerator): AdamW,
    constant lr 3e-3, clip 1.0, no step decay, eager KL loss (peers-on-cpu.md)."""
    from speculators.losses import resolve_loss_config

    torch.manual_seed(seed)
    model = speculators_model(target)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    loss_config = resolve_loss_config("kl_div", "eager")
    stream = trainer.stream  # the very batches draftsmith trains on (same seed, same order)
    for _ in range(steps):
        batch = next(stream)
        feats = target_features(target, batch["input_ids"], attention_mask=batch["attention_mask"])
        packed = pack(batch, feats)
        _, loss, _ = model(**packed, ttt_steps=3, ttt_step_loss_decay=1.0, loss_config=loss_config)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return model


# --------------------------------------------------------------------------- outside trainers
def export_protocol(out: Path, work: Path, data_file: Path, evalset, steps: int, seeds: list[int], overrides: list[str]) -> None:
    """eval.json: the eval set; train-seed{S}.json: the `steps` batches draftsmith's trainer draws for
    seed S, in order, each a list of unpadded rows {input_ids, loss_mask} (right-pad them to train)."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"target": str(STORIES), "aux_layers_hidden_states_index": AUX, "k": DEFAULTS["k"], "ttt_steps": 3}
    prompts = [{"prompt": p.tolist(), "continuation": list(c)} for p, c in evalset]
    (out / "eval.json").write_text(json.dumps({**meta, "prompts": prompts}))
    for seed in seeds:
        stream = draftsmith_trainer(data_file, work / f"export-{seed}", steps, seed, overrides).stream
        batches = []
        for _ in range(steps):
            batch = next(stream)
            batches.append([{"input_ids": batch["input_ids"][b, :n].tolist(), "loss_mask": batch["loss_mask"][b, :n].tolist()}
                            for b, n in enumerate(batch["attention_mask"].sum(1).tolist())])
        (out / f"train-seed{seed}.json").write_text(json.dumps({**meta, "seed": seed, "steps": steps, "batches": batches}))
        print(f"exported {steps} batches for seed {seed} -> {out / f'train-seed{seed}.json'}", flush=True)


def score_chains(files: list[Path], evalset, out: Path | None) -> int:
    """tau of chains made outside, with this file's walk; each file's echo of the eval set must equal ours."""
    runs = []
    for f in files:
        run = json.loads(f.read_text())
        echo = [(p["prompt"], p["continuation"]) for p in run.pop("eval")]
        if echo != [(p.tolist(), list(c)) for p, c in evalset]:
            print(f"{f}: its eval set is not this protocol's (prompts or greedy continuations differ)")
            return 1
        run["tau"] = chains_tau(run.pop("chains"), evalset, run["k"])
        for extra in [key for key in run if key.startswith("chains_")]:  # e.g. chains_loop: a second proposer
            run[f"tau_{extra[len('chains_'):]}"] = chains_tau(run.pop(extra), evalset, run["k"])
        runs.append(run)
        print(json.dumps({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in run.items() if k_ != "settings"}), flush=True)
    report = {"protocol": {**DEFAULTS, "prompts": len(evalset)}, "runs": runs, "summary": {}}
    for peer in dict.fromkeys(r["peer"] for r in runs):
        for steps in dict.fromkeys(r["steps"] for r in runs if r["peer"] == peer):
            group = [r for r in runs if r["peer"] == peer and r["steps"] == steps]
            for key in [k_ for k_ in group[0] if k_.startswith("tau")]:
                s = report["summary"][f"{peer}_{key}@{steps}"] = summarize([r[key] for r in group])
                print(f"{peer}_{key}@{steps}: {s['mean']:.3f} ± {s['std']:.3f}  (min {s['min']:.3f}, max {s['max']:.3f}, n={len(group)})")
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return 0


# --------------------------------------------------------------------------- main
def summarize(values: list[float]) -> dict:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}


def measure_check(rows: list[dict]) -> int:
    """0 when every draftsmith run's teacher-forced tau equals its real-loop tau (within 0.03) and every loop output
    was lossless; else print the runs that fail and return 1 (the bench's exit status)."""
    bad = [r for r in rows if "draftsmith_tau" in r
           and (abs(r["draftsmith_tau"] - r["draftsmith_loop_tau"]) > 0.03 or not r["draftsmith_lossless"])]
    if bad:
        print(f"measure check FAILED: teacher-forced and loop tau differ by > 0.03, or the loop was lossy: {bad}")
        return 1
    print("measure check: teacher-forced tau equals the real loop's within 0.03, and every output is lossless")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[300])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--peers", default="draftsmith,speculators")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="draftsmith override, e.g. step_decay=0.8 (a drafter option) or train.lr=1e-3")
    ap.add_argument("--data-seed", type=int, default=1234)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=None, help="keeps the sampled data between runs")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--features-cache", choices=["float32", "bfloat16", "float16", "int8", "fp8"], default=None,
                    help="draftsmith trains from an offline feature cache in this dtype (online features otherwise)")
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, 8 stories, 2 prompts (CI)")
    ap.add_argument("--export-protocol", type=Path, default=None, metavar="DIR",
                    help="write the eval set and each seed's training batches here for an outside trainer, then stop")
    ap.add_argument("--score-chains", type=Path, nargs="+", default=None, metavar="FILE",
                    help="score chain files made outside (e.g. by benchmarks/peer_modelopt.py), then stop")
    args = ap.parse_args(argv)
    if not STORIES.is_dir():
        print(f"bench_peers: {STORIES} is missing; it needs ../shared beside the repository", file=sys.stderr)
        return 2
    n_stories, prompts, eval_tokens = DEFAULTS["stories"], args.prompts, DEFAULTS["eval_new_tokens"]
    if args.smoke:
        args.steps, args.seeds, n_stories, prompts, eval_tokens = [2], [0], 8, 2, 24
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target = target_mod.load(str(STORIES), dtype="float32", device="cpu")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    evalset = greedy_continuations(target, prompts, eval_tokens)
    if args.score_chains:
        return score_chains(args.score_chains, evalset, args.out)
    data_file = protocol_data(target, work, n_stories, args.data_seed)
    if args.export_protocol:
        export_protocol(args.export_protocol, work, data_file, evalset, max(args.steps), args.seeds, args.overrides)
        return 0
    k = DEFAULTS["k"]
    ds_overrides = args.overrides + (cache_overrides(data_file, work, args.features_cache) if args.features_cache else [])
    rows = []
    for steps in args.steps:
        for seed in args.seeds:
            row = {"steps": steps, "seed": seed}
            if "draftsmith" in peers:
                t0 = time.perf_counter()
                trainer = train_draftsmith(data_file, work / f"ds-{steps}-{seed}", steps, seed, ds_overrides)
                row["draftsmith_train_s"] = time.perf_counter() - t0
                row["draftsmith_tau"] = teacher_forced_tau(draftsmith_chain, trainer.drafter, target, evalset, k)
                row["draftsmith_loop_tau"], row["draftsmith_lossless"] = loop_tau(trainer.drafter, target, evalset, k)
                row["trainable_params"] = sum(p.numel() for p in trainer.drafter.trainable_parameters())
            if "speculators" in peers:
                t0 = time.perf_counter()
                fresh = draftsmith_trainer(data_file, work / f"sp-{steps}-{seed}", steps, seed, args.overrides)
                model = train_speculators(target, fresh, steps, seed)
                row["speculators_train_s"] = time.perf_counter() - t0
                row["speculators_tau"] = teacher_forced_tau(speculators_chain, model, target, evalset, k)
                row["speculators_trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
            rows.append(row)
            print(json.dumps({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in row.items()}), flush=True)
    report = {"protocol": {**DEFAULTS, "prompts": prompts, "eval_new_tokens": eval_tokens, "stories": n_stories,
                           "data_seed": args.data_seed, "aux_layers": AUX, "overrides": args.overrides,
                           "features_cache": args.features_cache},
              "runs": rows, "summary": {}}
    for steps in args.steps:
        runs = [r for r in rows if r["steps"] == steps]
        for key in ("draftsmith_tau", "draftsmith_loop_tau", "speculators_tau"):
            if runs and key in runs[0]:
                report["summary"][f"{key}@{steps}"] = summarize([r[key] for r in runs])
    for name, s in report["summary"].items():
        print(f"{name:28s} {s['mean']:.3f} ± {s['std']:.3f}  (min {s['min']:.3f}, max {s['max']:.3f}, n={len(s['values'])})")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    return measure_check(rows)


if __name__ == "__main__":
    sys.exit(main())
