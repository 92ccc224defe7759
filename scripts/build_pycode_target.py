"""Rebuild draftsmith's embedded default target `builtin:pycode-tiny` from scratch.

A ~0.9M-parameter Llama base model (no chat template) trained on the running Python's
standard-library source code (draftsmith.data.stdlib_corpus, split "target"). It gives the
quickstart and the tests a real, non-degenerate target without any download.

    OMP_NUM_THREADS=2 python scripts/build_pycode_target.py            # ~9 min on 2 idle CPU cores
    python scripts/build_pycode_target.py --steps 20 --out /tmp/pyc    # smoke run

Steps: (1) byte-level BPE tokenizer (vocab 1024; <pad>=0, <s>=1, </s>=2) on the target split;
(2) every document becomes <s> doc </s>, all joined and cut into 256-token sequences;
(3) AdamW with linear warmup + cosine decay, seeded; (4) held-out loss / perplexity on the
"heldout" split; (5) save_pretrained (safetensors, fp32) + tokenizer + generation_config +
README.md into draftsmith/assets/pycode-tiny/.
"""
from __future__ import annotations

import argparse
import hashlib
import math
import platform
import time
from pathlib import Path

import torch

from draftsmith.data import stdlib_corpus

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "draftsmith" / "assets" / "pycode-tiny"
SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
MODEL_SHAPE = dict(
    vocab_size=1024, hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=352, max_position_embeddings=1024, tie_word_embeddings=True,
)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    p.add_argument("--batch", type=int, default=16, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per training sequence")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    p.add_argument("--log-every", type=int, default=50, help="print the train loss every N steps")
    p.add_argument("--eval-seqs", type=int, default=256, help="held-out sequences for the final eval")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    return p.parse_args(argv)


def train_tokenizer(vocab_size: int):
    """Step 1: byte-level BPE on the target split; wraps it so AutoTokenizer can reload it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2, show_progress=False,
    )
    tok.train_from_iterator((text for _, text in stdlib_corpus.documents("target")), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, f"special {s} got id {tok.token_to_id(s)}, expected {i}"
    # Llama convention: encode() prepends <s>; training sequences start documents with <s> too.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=1024,
    )


def token_stream(tokenizer, split: str) -> torch.Tensor:
    """Step 2: <s> doc </s> for every document of the split, concatenated -> [n_tokens]."""
    texts = [text for _, text in stdlib_corpus.documents(split)]
    encoded = tokenizer.backend_tokenizer.encode_batch(texts)  # each starts with <s>
    ids: list[int] = []
    for enc in encoded:
        ids.extend(enc.ids)
        ids.append(EOS_ID)
    return torch.tensor(ids, dtype=torch.long)


def build_model(seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        **MODEL_SHAPE, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    )
    return LlamaForCausalLM(cfg)


def lr_at(step: int, args) -> float:
    """Linear warmup to args.lr, then cosine decay to 10 % of it at the last step."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train(model, stream: torch.Tensor, args) -> tuple[float, float]:
    """Step 3: AdamW on random 256-token windows of the stream; returns (final loss, seconds).

    The final loss is the mean over the last log window.
    """
    gen = torch.Generator().manual_seed(args.seed)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95),
    )
    model.train()
    n_windows = stream.numel() - args.seq_len - 1
    window_losses: list[float] = []
    start = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        starts = torch.randint(0, n_windows, (args.batch,), generator=gen)  # [b]
        batch = torch.stack([stream[s : s + args.seq_len] for s in starts.tolist()])  # [b, seq]
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        window_losses.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            mean = sum(window_losses) / len(window_losses)
            print(f"step {step + 1:5d}/{args.steps}  loss {mean:.4f}  lr {lr_at(step, args):.2e}  "
                  f"{time.perf_counter() - start:6.1f}s", flush=True)
            final, window_losses = mean, []
    model.eval()
    return final, time.perf_counter() - start


@torch.no_grad()
def heldout_loss(model, stream: torch.Tensor, seq_len: int, max_seqs: int) -> tuple[float, int]:
    """Step 4: mean next-token loss over consecutive seq_len windows of the held-out stream."""
    n = min(max_seqs, stream.numel() // seq_len)
    seqs = stream[: n * seq_len].view(n, seq_len)  # [n_tokens] -> [n, seq]
    total, count = 0.0, 0
    for chunk in seqs.split(16):
        loss = model(input_ids=chunk, labels=chunk).loss
        total += loss.item() * chunk.shape[0] * (seq_len - 1)
        count += chunk.shape[0] * (seq_len - 1)
    return total / count, count


def write_readme(out: Path, stats: dict) -> None:
    sha = hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()
    text = f"""# pycode-tiny: draftsmith's embedded default target

A {stats['params'] / 1e6:.2f}M-parameter Llama **base model** (no chat template) trained by
draftsmith itself on CPython standard-library source code. It exists so that the quickstart,
examples and tests have a real (non-random) target that needs no download:
`draftsmith.targets.load.load("builtin:pycode-tiny")`. Its greedy text is Python-like (indentation,
`def`/`class`, stdlib idioms) but falls into repetition loops within a few lines and is never a
correct program; use it for acceptance and plumbing, not for quality.

- Architecture: LlamaForCausalLM, hidden 128, 4 layers, 4 heads, 2 KV heads, intermediate 352,
  max_position_embeddings 1024, rope_theta 10000, tied embeddings, fp32 safetensors.
- Tokenizer: byte-level BPE, vocab 1024; `<pad>`=0, `<s>`=1 (bos, prepended by the tokenizer),
  `</s>`=2 (eos, ends each training document). Round-trips any text exactly.
- Data: `draftsmith.data.stdlib_corpus` split "target" (sha1(relative path) % 100 < 80) of the
  Python {stats['python']} stdlib ({stats['train_tokens']:,} tokens); the "drafter" split is left
  for training drafters and "heldout" for evaluation.
- Training: {stats['steps']} AdamW steps x {stats['batch']} sequences x {stats['seq_len']} tokens,
  warmup + cosine, seed {stats['seed']}, {stats['threads']} CPU threads on {stats['machine']}.
- Training wall time: {stats['train_seconds']:.0f} s.
- Final train loss: {stats['train_loss']:.3f} (mean of the last {stats['log_every']} steps).
- Held-out loss: {stats['heldout_loss']:.3f} nats/token, perplexity {math.exp(stats['heldout_loss']):.2f}
  ({stats['heldout_tokens']:,} predicted tokens of the "heldout" split; uniform would be
  {math.log(1024):.2f}).
- model.safetensors sha256: `{sha}`

Rebuilt with:

    {stats['command']}

License: trained from the CPython standard library, which is distributed under the PSF
License Agreement; the weights and tokenizer are released with draftsmith under its license.
"""
    (out / "README.md").write_text(text)


def main(argv=None) -> int:
    import sys

    from transformers import GenerationConfig

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = train_tokenizer(MODEL_SHAPE["vocab_size"])
    train_stream = token_stream(tokenizer, "target")
    held_stream = token_stream(tokenizer, "heldout")
    print(f"tokenizer + encoding: {time.perf_counter() - t0:.1f}s; train tokens {train_stream.numel():,}, "
          f"heldout tokens {held_stream.numel():,}", flush=True)
    model = build_model(args.seed)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params:,} parameters", flush=True)
    train_loss, seconds = train(model, train_stream, args)
    loss, count = heldout_loss(model, held_stream, args.seq_len, args.eval_seqs)
    print(f"train wall time {seconds:.0f}s; final train loss {train_loss:.4f}; "
          f"held-out loss {loss:.4f} (ppl {math.exp(loss):.2f}) over {count:,} tokens", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID).save_pretrained(args.out)
    write_readme(args.out, dict(
        params=params, python=platform.python_version(), train_tokens=train_stream.numel(), steps=args.steps,
        batch=args.batch, seq_len=args.seq_len, seed=args.seed, threads=args.threads, train_seconds=seconds,
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(), train_loss=train_loss,
        log_every=args.log_every, heldout_loss=loss, heldout_tokens=count,
        command="OMP_NUM_THREADS=2 python " + " ".join(["scripts/build_pycode_target.py"] + sys.argv[1:]),
    ))
    print(f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
