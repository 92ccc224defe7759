"""NVIDIA Model Optimizer (nvidia-modelopt) EAGLE-3 and Medusa on issue 10's protocol, scored by draftsmith.

Model Optimizer 0.47.0 needs transformers < 5.15 while draftsmith runs on 5.24, so this script runs in
its own virtualenv and never imports draftsmith. draftsmith exports the protocol (the exact training
rows, batch by batch, and the eval set) and scores the chains this script writes, with the same
walk_rounds as every other peer in benchmarks/bench_peers.py.

Virtualenv (the CPU torch build lies on disk; never an unpinned torch):
    python3 -m venv /work/venv-modelopt
    /work/venv-modelopt/bin/pip install "torch==2.13.0"
    /work/venv-modelopt/bin/pip install "torch==2.13.0" "transformers<5.15" requests "nvidia-modelopt==0.47.0"
        # resolved to transformers 5.14.1; requests is needed by modelopt but not declared

Commands (from the repository root):
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/bench_peers.py --export-protocol runs/mo/protocol \\
        --steps 300 --seeds 0 1 2 --workdir runs/mo/work
    OMP_NUM_THREADS=1 /work/venv-modelopt/bin/python benchmarks/peer_modelopt.py --protocol runs/mo/protocol \\
        --mode eagle3 medusa --seeds 0 1 2 --steps 300 --out runs/mo/chains
        # also, each with --seeds 0 1 2: --mode eagle3 --eagle-target-sized; --mode medusa --medusa-heads 4;
        # --mode medusa --lr 1e-4 --warmup 1000 (ModelOpt's eagle3 recipe lr)
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python benchmarks/bench_peers.py --workdir runs/mo/work \\
        --score-chains runs/mo/chains/modelopt-eagle3-300-seed*.json --out benchmarks/results/modelopt/eagle3-300.json
        # one scoring per variant (the chain files' names); results in benchmarks/results/modelopt/

Model Optimizer settings (everything else at its 0.47.0 defaults):
  eagle3  mtsp.convert(model, [("eagle", cfg)]): the default EAGLE-3 architecture (1 Llama decoder
          layer, intermediate 14336, 32 heads x 128, 8 kv heads, last layernorm, aux hidden states),
          eagle_ttt_steps 3, eagle_loss_decay_factor 0.9, logit distillation, frozen base; changed:
          eagle_aux_hidden_state_layer_ids [0, 1, 3], the protocol's aux layers [1, 2, 4] in
          hidden_states numbering (ModelOpt hooks decoder-layer outputs; its own default on a
          5-layer target would be [1] only), and eagle_use_torch_compile False (eager on CPU; no
          change to the maths). --eagle-target-sized shapes the draft layer like the target's layers
          (intermediate 172, 8 heads x 8, 4 kv heads on stories260K), the size draftsmith's and
          speculators' drafters have; ModelOpt's default layer holds ~38x their parameters here.
  medusa  mtsp.convert(model, [("medusa", cfg)]): medusa_num_layers 1 (default); medusa_num_heads 3
          (the default is 2; 3 matches draftsmith's 3-head Medusa and the issue author's run); the
          loss is its forward's (heads coefficient 0.2, decay 0.8). Its head i predicts token
          t + 1 + i (head 0 repeats the LM head), so the chain is heads 1 .. n-1: 3 heads draft 2
          tokens a round, and the chains are walked with k = 2.
  optimizer (the protocol's peer setting, as the speculators row in bench_peers.py): AdamW over the
          trainable parameters, constant lr 3e-3, grad clip 1.0, --steps steps of the exported batches
          (4 rows each, right-padded to the longest row of the run, padding masked). ModelOpt's
          eagle3 recipe (lr 1e-4, 1000 warmup steps, linear) never leaves warmup in 300 steps;
          --lr / --warmup reproduce it if wanted.

Chains (chains[p][t][j]: the step-t token the drafter proposes from position j, predicting seq[j+2+t]):
  eagle3  teacher-forced: the model's own training-time-test unroll (its forward run with train-mode
          control flow under no_grad, the logits of each TTT step captured), as for speculators;
          "chains_loop" also holds ModelOpt's own proposer (pseudo_speculative_generate, k = 3 drafts
          from every anchor), the check that the teacher-forced chain is what its drafting does.
  medusa  one forward; heads 1 .. n-1 at position j.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import modelopt
import modelopt.torch.speculative as mtsp
import torch
import transformers
from transformers import AutoModelForCausalLM

MODES = ("eagle3", "medusa")


def load_base(path: str):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.to("cpu")


def convert(model, mode: str, aux_layers: list[int], medusa_heads: int, target_sized: bool = False):
    if mode == "eagle3":
        arch = {"eagle_aux_hidden_state_layer_ids": aux_layers}
        if target_sized:  # the draft layer shaped like the target's layers (draftsmith's and speculators' size)
            arch.update({key: getattr(model.config, key) for key in
                         ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")})
        cfg = {"eagle_use_torch_compile": False, "eagle_architecture_config": arch}
        return mtsp.convert(model, [("eagle", cfg)]), cfg
    cfg = {"medusa_num_heads": medusa_heads, "medusa_num_layers": 1}
    model = mtsp.convert(model, [("medusa", cfg)])
    for name, p in model.named_parameters():  # its forward runs the base under no_grad; train the heads only
        p.requires_grad_(name.startswith("medusa_heads."))
    return model, cfg


def pad_batch(rows: list[dict], length: int) -> dict:
    """Exported rows -> right-padded [b, length] tensors; ModelOpt's TTT masks are cached per step, so
    every batch of a run has the same length."""
    b = len(rows)
    ids = torch.zeros(b, length, dtype=torch.long)
    attn = torch.zeros(b, length, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        ids[i, :n] = torch.tensor(row["input_ids"])
        attn[i, :n] = 1
        if not all(row["loss_mask"][1:]):
            raise ValueError("a row masks tokens past its first; this script trains plain-text rows only")
    return {"input_ids": ids, "attention_mask": attn}


def train(model, mode: str, batches: list, steps: int, lr: float, warmup: int) -> float:
    length = max(len(r["input_ids"]) for batch in batches[:steps] for r in batch)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0)
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        batch = pad_batch(batches[step], length)
        if mode == "eagle3":  # its default loss mask is the attention mask
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        else:
            labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        if step % max(1, steps // 4) == 0 or step == steps - 1:
            print(f"  step {step + 1}/{steps} loss {out.loss.item():.4f}", flush=True)
    model.eval()
    return time.perf_counter() - t0


@torch.no_grad()
def eagle_chain(model, seq: torch.Tensor, k: int) -> list[list[int]]:
    """The TTT unroll, teacher-forced: step t's logits at position i come from the chain anchored at
    i - t and predict seq[i + 2], so chains[t][j] = argmax(step-t logits at j + t)."""
    captured, inner = [], model._eagle_forward
    def capture(*args, **kwargs):
        out = inner(*args, **kwargs)
        captured.append(out[2][0].argmax(-1))  # eagle_logits [s, V] -> [s]
        return out
    model._eagle_forward = capture
    model._cached_attn_blk_masks = {}  # keyed by TTT step only; this sequence's length differs
    was = model.eagle_ttt_steps
    try:
        model.eagle_ttt_steps = k
        model.train()  # the TTT loop runs only in training mode (no dropout in this module)
        model(input_ids=seq, attention_mask=torch.ones_like(seq))
    finally:
        model.eval()
        model.eagle_ttt_steps = was
        del model._eagle_forward
        model._cached_attn_blk_masks = {}
    s = seq.shape[1]
    return [[int(captured[t][j + t]) if j + t < s else -1 for j in range(s)] for t in range(k)]


@torch.no_grad()
def eagle_loop_chain(model, seq: torch.Tensor, prompt_len: int, k: int) -> list[list[int]]:
    """ModelOpt's own drafting from every anchor j the walk can use (pseudo_speculative_generate)."""
    s = seq.shape[1]
    chains = [[-1] * s for _ in range(k)]
    for j in range(prompt_len - 1, s - 1):
        base, draft = model.pseudo_speculative_generate(seq[:, : j + 1], steps=k)
        assert int(base[0, 0]) == int(seq[0, j + 1]), "the base's greedy token differs from the continuation"
        for t in range(k):
            chains[t][j] = int(draft[0, t])
    return chains


@torch.no_grad()
def medusa_chain(model, seq: torch.Tensor) -> list[list[int]]:
    out = model(input_ids=seq, attention_mask=torch.ones_like(seq))
    return [head[0].argmax(-1).tolist() for head in out.medusa_logits[1:]]  # head 0 repeats the LM head


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--protocol", type=Path, required=True, help="bench_peers.py --export-protocol's directory")
    ap.add_argument("--mode", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=0, help="linear warmup steps (0: constant lr)")
    ap.add_argument("--medusa-heads", type=int, default=3)
    ap.add_argument("--eagle-target-sized", action="store_true",
                    help="eagle3's draft layer with the target's intermediate size and heads instead of ModelOpt's "
                         "default shapes (intermediate 14336, 32 x 128 heads)")
    ap.add_argument("--no-loop-check", action="store_true", help="skip ModelOpt's own proposer for eagle3")
    ap.add_argument("--out", type=Path, required=True, help="chain files go here, one per mode and seed")
    args = ap.parse_args(argv)
    evaluation = json.loads((args.protocol / "eval.json").read_text())
    aux = [i - 1 for i in evaluation["aux_layers_hidden_states_index"]]  # hidden_states[i] = layer i-1's output
    k = evaluation["k"]
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        data = json.loads((args.protocol / f"train-seed{seed}.json").read_text())
        assert data["steps"] >= args.steps, f"the export holds {data['steps']} steps"
        for mode in args.mode:
            torch.manual_seed(seed)
            model, cfg = convert(load_base(evaluation["target"]), mode, aux, args.medusa_heads, args.eagle_target_sized)
            trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            print(f"{mode} seed {seed}: {trainable} trainable parameters", flush=True)
            train_s = train(model, mode, data["batches"], args.steps, args.lr, args.warmup)
            chains, loop, t0 = [], [], time.perf_counter()
            for p in evaluation["prompts"]:
                seq = torch.tensor(p["prompt"] + p["continuation"])[None]
                if mode == "eagle3":
                    chains.append(eagle_chain(model, seq, k))
                    if not args.no_loop_check:
                        loop.append(eagle_loop_chain(model, seq, len(p["prompt"]), k))
                else:
                    chains.append(medusa_chain(model, seq))
            variant = {"medusa": f"-{args.medusa_heads}heads", "eagle3": "-targetsized" if args.eagle_target_sized else ""}
            run = {"peer": f"modelopt-{mode}{variant[mode]}",
                   "seed": seed, "steps": args.steps, "k": k if mode == "eagle3" else args.medusa_heads - 1,
                   "train_s": train_s, "chain_s": time.perf_counter() - t0, "trainable_params": trainable,
                   "settings": {"modelopt": modelopt.__version__, "transformers": transformers.__version__,
                                "torch": torch.__version__, "convert": cfg, "optimizer": "AdamW", "lr": args.lr,
                                "warmup": args.warmup, "grad_clip": 1.0, "batch": "exported, 4 rows",
                                "threads": torch.get_num_threads()},
                   "eval": [{"prompt": p["prompt"], "continuation": p["continuation"]} for p in evaluation["prompts"]],
                   "chains": chains}
            if loop:
                run["chains_loop"] = loop
            tag = f"-lr{args.lr:g}-w{args.warmup}" if (args.lr, args.warmup) != (3e-3, 0) else ""
            path = args.out / f"{run['peer']}{tag}-{args.steps}-seed{seed}.json"
            path.write_text(json.dumps(run))
            print(f"{mode} seed {seed}: trained in {train_s:.0f} s -> {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
