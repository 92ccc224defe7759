"""Shared test helpers (one copy, imported by the tests that need them).

    from tests.helpers import batch_for
    batch = batch_for(target, drafter)            # the drafter's own features and layers
    bench = load_repo_module("benchmarks/bench_peers.py")   # a script of the repository, as a module
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

from draftsmith.data import features


def batch_for(target, drafter=None, b: int = 2, s: int = 12, seed: int = 0, *, required=None, layers=None,
              mask_above: float = 0.3, prompt_lengths=None) -> dict[str, torch.Tensor]:
    """A seeded training batch of random ids with the target's features filled in (features.complete).

    Row 1 is right-padded by 3 tokens. The loss mask is random (uniform > mask_above, on real tokens) or,
    with prompt_lengths, 0 over each row's prompt and 1 after it. required / layers default to the
    drafter's required_features / feature_layers()."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.vocab_size, (b, s), generator=g)  # [b, s]
    attention = torch.ones(b, s, dtype=torch.long)
    attention[1, -3:] = 0  # right padding on the second row
    if prompt_lengths is None:
        loss_mask = (torch.rand(b, s, generator=g) > mask_above).long() * attention
    else:
        loss_mask = torch.zeros(b, s, dtype=torch.long)
        for row, n in enumerate(prompt_lengths):
            loss_mask[row, n:] = 1
        loss_mask = loss_mask * attention
    batch = {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
    required = set(drafter.required_features) if required is None else set(required)
    layers = (drafter.feature_layers() if drafter is not None else []) if layers is None else list(layers)
    return features.complete(target, batch, required, layers)


def reply_json(handler, obj, status: int = 200) -> None:
    """A test server's JSON answer (an http.server handler: status, Content-Type, Content-Length, the body)."""
    import json

    payload = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


def load_repo_module(relative: str):
    """A script of the repository (benchmarks/X.py, scripts/X.py) imported as module X, registered in
    sys.modules under that name (dataclasses and pickling look their module up there)."""
    path = Path(__file__).resolve().parents[1] / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module
