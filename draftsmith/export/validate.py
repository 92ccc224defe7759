"""The validation gate every export passes before it is moved into place.

It reads the files as written (never the in-memory objects) and checks, reporting every
problem at once:
  1. config.json has every key the engine reads;
  2. the tensor names are exactly the expected set (none missing, none unexpected) with the
     shapes and dtypes that config.json implies;
  3. EAGLE-3 draft vocabulary: nonzero(t2d) == d2t + arange(draft_vocab), and d2t/t2d equal
     the mapping the drafter was trained with;
  4. rope (rope_theta, rope_scaling) and max_position_embeddings equal the target's;
  5. the verifier's identity (name, architecture, vocab size, hidden size) is recorded and
     matches the target;
  6. round trip: the files re-imported into draftsmith propose exactly the same tokens as the
     trained drafter on a few contexts (greedy, k tokens each);
  7. every floating tensor is finite (a NaN or inf weight would pass the round trip, NaN against NaN).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.data import draft_vocab
from draftsmith.export.layout import (
    ExportOptions,
    ExportValidationError,
    TensorSpec,
    read_export,
    rope_scaling_of,
    target_rope,
)
from draftsmith.targets.archs import text_config


def validate_export(export_dir: Path, exporter, loaded, opts: ExportOptions, k: int) -> dict:
    """Raise ExportValidationError listing every problem; return a small report on success."""
    export_dir = Path(export_dir)
    config, side, tensors = read_export(export_dir)
    kind = loaded.drafter.kind
    problems = check_config_keys(config, exporter.required_config_keys(kind))
    problems += check_finite(tensors)
    if not problems:  # shapes are derived from config keys: only meaningful once they exist
        problems += check_tensors(tensors, exporter.expected_tensors(config, kind))
    if exporter.layout(kind).carries_vocab_map:
        problems += check_vocab_map(tensors, loaded.drafter)
    llama = exporter.llama_fields(config, kind)
    if llama is not None:
        problems += check_rope(llama, loaded.target.config)
    problems += check_verifier(side, loaded.target)
    if not problems:
        problems += exporter.check_format(export_dir, config, tensors, loaded)
    if problems:
        raise ExportValidationError(str(export_dir), problems)
    agreement = check_round_trip(export_dir, exporter, loaded, k)
    return {"tensors": len(tensors), "round_trip": agreement}


def _get(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def check_config_keys(config: dict, required: list[str]) -> list[str]:
    problems = []
    for key in required:
        try:
            value = _get(config, key)
        except KeyError:
            problems.append(f"config.json: required key {key!r} is missing (the engine reads it)")
            continue
        if value is None and not key.endswith("rope_scaling"):
            problems.append(f"config.json: key {key!r} is null")
    return problems


def check_tensors(tensors: dict[str, torch.Tensor], expected: dict[str, TensorSpec]) -> list[str]:
    """Exact name set, then shape and dtype of each tensor."""
    problems = []
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing:
        problems.append(f"model.safetensors: missing tensor(s) {missing} (the engine would leave them uninitialised)")
    if unexpected:
        problems.append(f"model.safetensors: unexpected tensor(s) {unexpected} (engines skip unknown names without a word)")
    for name in sorted(set(expected) & set(tensors)):
        want, got = expected[name], tensors[name]
        if tuple(got.shape) != want.shape:
            problems.append(f"model.safetensors: {name} has shape {list(got.shape)}, config.json implies {list(want.shape)}")
        if got.dtype != want.dtype:
            problems.append(f"model.safetensors: {name} has dtype {got.dtype}, expected {want.dtype}")
    return problems


def check_finite(tensors: dict[str, torch.Tensor]) -> list[str]:
    """One problem per floating tensor holding NaN or inf, naming it and counting the bad values."""
    problems = []
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point() and t.numel():
            bad = int((~torch.isfinite(t)).sum())
            if bad:
                problems.append(f"model.safetensors: {name} holds {bad} NaN/inf value(s) of {t.numel()}; the drafter "
                                "diverged in training (or the file is damaged): export an earlier checkpoint")
    return problems


def check_vocab_map(tensors: dict[str, torch.Tensor], drafter) -> list[str]:
    """d2t/t2d consistent with each other and identical to the trained drafter's."""
    problems = []
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if d2t is None:
        return problems  # reported as a missing tensor
    if t2d is not None:
        try:
            draft_vocab.check(d2t, t2d)
        except ValueError as exc:
            problems.append(f"model.safetensors: {exc}")
        if t2d.shape == drafter.t2d.shape and not torch.equal(t2d.cpu(), drafter.t2d.cpu()):
            problems.append("model.safetensors: t2d differs from the mapping the drafter was trained with")
    if d2t.shape != drafter.d2t.shape or not torch.equal(d2t.long().cpu(), drafter.d2t.cpu()):
        problems.append(
            "model.safetensors: d2t differs from the mapping the drafter was trained with "
            "(its lm_head rows would map to the wrong target tokens)"
        )
    return problems


def _same(a, b) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * max(1.0, abs(float(b)))
    return a == b


def check_rope(llama: dict, target_config) -> list[str]:
    """rope_theta, rope_scaling and max_position_embeddings must be the target's, never defaults."""
    problems = []
    want_pos = text_config(target_config).max_position_embeddings  # a vision-language target: its text backbone
    got_pos = llama.get("max_position_embeddings")
    if got_pos != want_pos:
        problems.append(
            f"config.json: max_position_embeddings is {got_pos}, the target's is {want_pos}; a missing or smaller "
            "value (the 2048 default) makes the server reject or mis-rotate long prompts"
        )
    rope = target_rope(target_config)
    if not _same(llama.get("rope_theta"), rope.get("rope_theta")):
        problems.append(f"config.json: rope_theta is {llama.get('rope_theta')}, the target's is {rope.get('rope_theta')}")
    want_scaling = rope_scaling_of(rope)
    got_scaling = llama.get("rope_scaling")
    if want_scaling is not None and not got_scaling:
        problems.append(
            f"config.json: rope_scaling is missing but the target uses {want_scaling}; the engine would run the "
            "drafter with unscaled rope (wrong positions past the original context)"
        )
    elif want_scaling is None and got_scaling:
        problems.append(f"config.json: rope_scaling is {got_scaling} but the target's rope is unscaled")
    elif want_scaling is not None:
        diff = sorted(k for k in set(want_scaling) | set(got_scaling)
                      if not _same(got_scaling.get(k), want_scaling.get(k)))
        if diff:
            problems.append(f"config.json: rope_scaling {got_scaling} differs from the target's {want_scaling} in {diff}")
    params = llama.get("rope_parameters")
    if params is not None:
        diff = sorted(k for k in set(params) | set(rope) if not _same(params.get(k), rope.get(k)))
        if diff:
            problems.append(f"config.json: rope_parameters {params} differ from the target's {rope} in {diff}")
    return problems


def check_verifier(side: dict, target) -> list[str]:
    """draftsmith.json records the verifier; it must be the target the drafter was trained for."""
    problems = []
    recorded = side.get("verifier") or {}
    actual = target.identity()
    for key in ("name", "architectures", "vocab_size", "hidden_size", "fingerprint"):
        if key not in recorded:
            problems.append(f"draftsmith.json: verifier.{key} is not recorded")
        elif recorded[key] != actual[key]:
            problems.append(f"draftsmith.json: verifier.{key} is {recorded[key]!r}, the target's is {actual[key]!r}")
    from draftsmith.targets.archs import export_record

    arch = json.loads(json.dumps(export_record(target), default=str))  # as written to the file
    if side.get("target_architecture") != arch:
        problems.append(f"draftsmith.json: target_architecture is {side.get('target_architecture')!r}, the target's is "
                        f"{arch!r} (embedding scale, soft-capping, window and draft rope must be recorded)")
    return problems


# --------------------------------------------------------------------------- round trip


def probe_contexts(target, n: int = 3, seed: int = 0) -> list[torch.Tensor]:
    """A few seeded contexts of different lengths over the target's vocabulary (no special ids)."""
    g = torch.Generator().manual_seed(seed)
    low = 3 if target.vocab_size > 8 else 0
    return [torch.randint(low, target.vocab_size, (length,), generator=g) for length in (5, 9, 14)[:n]]


@torch.no_grad()
def propose_tokens(drafter, target, prompt: torch.Tensor, k: int) -> list[int]:
    """Prefill like eval/loop.py (commit the prompt's target states), then k greedy draft tokens."""
    proposer = drafter.make_proposer(target)
    prompt = prompt.to(target.device)
    out = target.forward(prompt[None])  # [1, n] -> logits [1, n, V]
    context = torch.cat([prompt, out.logits[0, -1].argmax().view(1)])  # + the target's first token
    proposer.begin(prompt)
    proposer.commit(context, prompt.shape[0], out)
    return [int(t) for t in proposer.propose(context, k, SamplingParams(), None).tokens]


def reference_drafter(exporter, loaded, dtype: torch.dtype):
    """The trained drafter with its weights rounded to the export dtype (itself when they agree)."""
    floats = [t.dtype for t in loaded.drafter.state_dict().values() if t.is_floating_point()]
    if not floats or floats[0] == dtype:
        return loaded.drafter
    made = exporter.reference_drafter(loaded, dtype)
    return made if made is not None else copy.deepcopy(loaded.drafter).to(dtype)


def check_round_trip(export_dir: Path, exporter, loaded, k: int) -> str:
    """Re-import the files and require token-for-token equal proposals on every probe context."""
    _, _, tensors = read_export(export_dir)
    floats = [t.dtype for t in tensors.values() if t.is_floating_point()]
    reimported = exporter.load_back(export_dir, loaded)
    reference = reference_drafter(exporter, loaded, floats[0] if floats else torch.float32)
    contexts = probe_contexts(loaded.target)
    for i, prompt in enumerate(contexts):
        want = propose_tokens(reference, loaded.target, prompt, k)
        got = propose_tokens(reimported, loaded.target, prompt, k)
        if want != got:
            raise ExportValidationError(str(export_dir), [
                f"round trip: the re-imported {exporter.name} files propose {got} on probe context {i} "
                f"(length {prompt.shape[0]}), the trained drafter proposes {want}"
            ])
    return f"{len(contexts)} contexts x {k} tokens identical"
