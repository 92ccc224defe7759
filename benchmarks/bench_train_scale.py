"""EAGLE-3 training at the shapes users train: peak memory and tokens/s of one training step
(forward + backward), today's path against the memory-lean one, and speculators' EAGLE-3 beside
them. No target is loaded: the features are synthetic (random aux hidden states; soft labels from
a random lm_head applied to a random final hidden state, as an offline cache replays them).

Shapes (--shape 8b): Llama-3.1-8B: hidden 4096, 32 heads / 8 kv heads, intermediate 14336,
vocab 128,256, draft vocab 32,000, 7 TTT steps. --shape small divides the widths by 8; --shape tiny is for tests.

Paths:
  today  the loss as it was before drafter.loss_chunk (forward_loss with loss_chunk=null: same algorithm, the
         eager TTT kernel, no checkpointing); target logits [b, s, V] built from the hidden state with
         the full lm_head first (features.complete's offline replay)
  new    what a recipe gets today with train.ttt_attention auto/chunked, train.gradient_checkpointing
         and drafter.loss_chunk (default 1024): Eagle3Drafter.forward_loss itself, same target logits
  lean   `new` with labels straight from the final hidden state and the lm_head's draft rows
         (vocab_loss.soft_labels_from_hidden), so no [b, s, V] logits exist at all: bench-local, not
         a recipe option yet
  peer   speculators' Eagle3DraftModel (0.9.0), attention "eager" (its CPU-trainable path; its
         flex path has no CPU backward), same shapes, 7 TTT steps, labels from verifier_last_hidden_states

Memory modes:
  --memory fake  every path runs under FakeTensorMode: shapes and allocations without arithmetic,
                 so 8B shapes at 4k tokens are measured on a laptop; the peak is the exact
                 allocation-by-allocation peak of the step's op outputs (draftsmith.train.memory),
                 the same count a real run gives (tests/benchmarks/test_bench_train_scale.py checks it)
  --memory real  real tensors; also times the step (tokens/s) — use --real-seq to pick lengths
Weights (and their gradients' first allocation) are excluded from "step peak"; "weights" is listed.

    python benchmarks/bench_train_scale.py --shape 8b --seq 512 1024 2048 4096 --memory fake
    python benchmarks/bench_train_scale.py --shape 8b --seq 512 --memory real --paths today new
    python benchmarks/bench_train_scale.py --device cuda --shape 8b --seq 2048 8192 --memory real
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from draftsmith.heads import draft_layer, vocab_loss  # noqa: E402
from draftsmith.heads.eagle3 import Eagle3Drafter  # noqa: E402
from draftsmith.train.memory import PeakMemory  # noqa: E402

SHAPES = {
    "8b": dict(hidden=4096, heads=32, kv_heads=8, intermediate=14336, vocab=128256, draft_vocab=32000, layers=32),
    "small": dict(hidden=512, heads=4, kv_heads=1, intermediate=1792, vocab=16032, draft_vocab=4000, layers=32),
    "tiny": dict(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=512, draft_vocab=128, layers=8),  # tests
}


def llama_config(shape: dict):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=shape["hidden"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], intermediate_size=shape["intermediate"],
                       vocab_size=shape["vocab"], num_hidden_layers=shape["layers"], max_position_embeddings=131072,
                       rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5)


def build_drafter(shape: dict, ttt_steps: int, device, seed: int = 0) -> tuple[Eagle3Drafter, torch.Tensor]:
    """An 8B-shaped EAGLE-3 head (fp32 weights, bf16 frozen embedding) and a bf16 target lm_head."""
    torch.manual_seed(seed)
    tc = llama_config(shape)
    layer_cfg = draft_layer.draft_layer_config(tc)
    embed = torch.nn.Embedding(shape["vocab"], shape["hidden"], device=device, dtype=torch.bfloat16)
    embed.weight.requires_grad_(False)
    # soft labels only: vocab_loss.chunked_kl implements the KL; EAGLE-3's default label mix adds one [b, n] gather
    cfg = Eagle3Drafter.Config(ttt_steps=ttt_steps, draft_vocab_size=shape["draft_vocab"], hard_label_weight=0.0)
    aux = [2, shape["layers"] // 2, shape["layers"] - 3]
    with torch.device(device):
        drafter = Eagle3Drafter(cfg, layer_cfg, aux, shape["draft_vocab"], shape["vocab"], embed)
        draft_ids = torch.randperm(shape["vocab"])[: shape["draft_vocab"]].sort().values
        drafter.d2t.copy_(draft_ids - torch.arange(shape["draft_vocab"]))
        drafter.t2d.zero_()
        drafter.t2d[draft_ids] = True
        lm_head = torch.randn(shape["vocab"], shape["hidden"], dtype=torch.bfloat16) * shape["hidden"] ** -0.5
    return drafter, lm_head


def synthetic_batch(shape: dict, seq: int, device, seed: int = 1) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = shape["hidden"]
    ids = torch.randint(0, shape["vocab"], (1, seq), generator=g)
    batch = {"input_ids": ids, "attention_mask": torch.ones(1, seq, dtype=torch.long),
             "loss_mask": torch.ones(1, seq, dtype=torch.long),
             "aux_hidden_states": torch.randn(1, seq, 3 * h, generator=g).bfloat16(),
             "last_hidden_state": torch.randn(1, seq, h, generator=g).bfloat16()}
    return {k: v.to(device) for k, v in batch.items()}


def step_today(drafter, lm_head, batch) -> torch.Tensor:
    draft_layer.configure(drafter, "eager")
    drafter.cfg.loss_chunk = None  # every step's [b, n, dv] fp32 logits kept for backward
    logits = batch["last_hidden_state"] @ lm_head.T  # [b, s, h] -> [b, s, V] (features.logits_from_hidden)
    out = drafter.forward_loss({**batch, "target_logits": logits})
    out.loss.backward()
    return out.loss


def step_new(drafter, lm_head, batch, chunk: int = 1024) -> torch.Tensor:
    """The recipe path: forward_loss with the chunked TTT kernel, draft-layer checkpointing and loss_chunk."""
    draft_layer.configure(drafter, "auto", gradient_checkpointing=True)
    drafter.cfg.loss_chunk = chunk
    logits = batch["last_hidden_state"] @ lm_head.T  # [b, s, h] -> [b, s, V], as the target hands them over
    out = drafter.forward_loss({**batch, "target_logits": logits})
    out.loss.backward()
    return out.loss


def step_lean(drafter, lm_head, batch, chunk: int = 1024) -> torch.Tensor:
    """`new` with labels from the final hidden state: forward_loss's unroll and chunked loss, no [b, s, V] logits."""
    draft_layer.configure(drafter, "auto", gradient_checkpointing=True)
    d, ids = drafter, batch["input_ids"]
    b, s = ids.shape
    mask = (batch["loss_mask"] * batch["attention_mask"]).float()
    mask = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)  # [b, s] -> [b, s+1]
    draft_ids = d.draft_ids()
    p, top = vocab_loss.soft_labels_from_hidden(batch["last_hidden_state"], lm_head, draft_ids, chunk)  # [b, s, dv]
    total = p.new_zeros(())
    for t, state in d.unroll(batch, states=True):
        n = state.shape[1]
        loss, _ = vocab_loss.chunked_kl(state, d.logits, p[:, 1 + t : 1 + t + n], mask[:, 2 + t : 2 + t + n],
                                        draft_ids, top[:, 1 + t : 1 + t + n], chunk)
        total = total + d.cfg.step_decay**t * loss
    total.backward()
    return total


def build_peer(shape: dict, ttt_steps: int, device):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3SpeculatorConfig
    from speculators.models.eagle3.core import Eagle3DraftModel
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    tc = llama_config(shape)
    tc.num_hidden_layers = 1
    tc._attn_implementation = "eager"
    cfg = Eagle3SpeculatorConfig(
        transformer_layer_config=tc, draft_vocab_size=shape["draft_vocab"], norm_before_residual=True,
        eagle_aux_hidden_state_layer_ids=[2, shape["layers"] // 2, shape["layers"] - 3],
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=ttt_steps)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])))
    with torch.device(device):
        model = Eagle3DraftModel(cfg)
    return model


def step_peer(model, batch, ttt_steps: int) -> torch.Tensor:
    from speculators.losses import resolve_loss_config

    seq = batch["input_ids"].shape[1]
    _, loss, _ = model(hidden_states=batch["aux_hidden_states"].float(), input_ids=batch["input_ids"],
                       document_ids=torch.zeros(1, seq, dtype=torch.long, device=batch["input_ids"].device),
                       loss_mask=batch["loss_mask"].bool(),
                       verifier_last_hidden_states=batch["last_hidden_state"].float(), ttt_steps=ttt_steps,
                       ttt_step_loss_decay=0.8, loss_config=resolve_loss_config("kl_div", "eager"))
    loss.backward()
    return loss


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def measure(path: str, shape: dict, seq: int, ttt_steps: int, device: str, fake: bool, chunk: int) -> dict:
    """One training step of `path` at `seq` tokens -> {peak_bytes, seconds, weights_bytes}."""
    mode = contextlib.nullcontext()
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=False)
    with mode:
        if path == "peer":
            model, lm_head = build_peer(shape, ttt_steps, device), None
            model.train()
        else:
            model, lm_head = build_drafter(shape, ttt_steps, device)
            model.train()
        batch = synthetic_batch(shape, seq, device) if not fake else {
            k: torch.zeros(v.shape, dtype=v.dtype, device=device) for k, v in synthetic_batch(shape, 8, "cpu").items()}
        if fake:  # fake tensors carry shapes only: rebuild the batch at the real length
            batch = {k: (torch.ones if k.endswith("mask") else torch.zeros)(
                (1, seq, *v.shape[2:]), dtype=v.dtype, device=device) for k, v in batch.items()}
            batch["input_ids"] = batch["input_ids"] + 5
        t0, c0 = time.perf_counter(), time.process_time()
        with PeakMemory(device, fake_scalar=1 if fake else None) as mem:
            if path == "today":
                step_today(model, lm_head, batch)
            elif path == "new":
                step_new(model, lm_head, batch, chunk)
            elif path == "lean":
                step_lean(model, lm_head, batch, chunk)
            else:
                step_peer(model, batch, ttt_steps)
        seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"path": path, "seq": seq, "peak_bytes": mem.peak, "grad_bytes": trainable,
            "activation_peak_bytes": mem.peak - trainable, "weights_bytes": weight_bytes(model),
            "seconds": None if fake else seconds, "tokens_per_s": None if fake else seq / seconds,
            # CPU time of this process: robust when other jobs share the cores (tokens per CPU-second)
            "tokens_per_cpu_s": None if fake or device != "cpu" else seq / cpu_seconds,
            "memory": "fake" if fake else "real", "device": device}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--seq", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--paths", nargs="+", choices=["today", "new", "lean", "peer"],
                    default=["today", "new", "lean", "peer"])
    ap.add_argument("--memory", choices=["fake", "real"], default="fake")
    ap.add_argument("--ttt-steps", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=1024, help="sequence chunk of the new loss")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    shape = SHAPES[args.shape]
    rows = []
    print(f"shape {args.shape} {shape}, ttt_steps {args.ttt_steps}, memory {args.memory}, device {args.device}")
    print(f"{'path':>6} {'seq':>6} {'step peak GiB':>14} {'per token MiB':>14} {'grads GiB':>10} {'tok/s':>8} {'tok/cpu-s':>9}")
    for seq in args.seq:
        for path in args.paths:
            try:
                row = measure(path, shape, seq, args.ttt_steps, args.device, args.memory == "fake", args.chunk)
            except Exception as exc:  # a peer that does not run here is reported, not hidden
                row = {"path": path, "seq": seq, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                print(f"{path:>6} {seq:>6}  failed: {row['error']}")
                rows.append(row)
                continue
            rows.append(row)
            tps = f"{row['tokens_per_s']:.1f}" if row["tokens_per_s"] else "-"
            tpc = f"{row['tokens_per_cpu_s']:.1f}" if row.get("tokens_per_cpu_s") else "-"
            print(f"{path:>6} {seq:>6} {row['peak_bytes'] / 2**30:>14.2f} {row['peak_bytes'] / seq / 2**20:>14.2f} "
                  f"{row['grad_bytes'] / 2**30:>10.2f} {tps:>8} {tpc:>9}", flush=True)
    for path in args.paths:
        by_seq = {r["seq"]: r["peak_bytes"] for r in rows if r["path"] == path and "peak_bytes" in r}
        if 1024 in by_seq and 4096 in by_seq:
            print(f"{path}: peak growth 1k -> 4k tokens: {by_seq[4096] / by_seq[1024]:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"shape": args.shape, "dims": shape, "ttt_steps": args.ttt_steps,
                                         "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
