"""The embedded default target builtin:pycode-tiny: it loads, round-trips code and is a real model."""
from __future__ import annotations

import hashlib
import math

import pytest
import torch

from draftsmith.data import stdlib_corpus
from draftsmith.targets import load as target_mod

ASSET = target_mod.BUILTIN_DIR / "pycode-tiny"


@pytest.fixture(scope="module")
def pycode():
    return target_mod.load("builtin:pycode-tiny", dtype="float32", device="cpu")


def test_loads_with_the_documented_shape(pycode):
    cfg = pycode.config
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (1024, 128, 4)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size) == (4, 2, 352)
    assert cfg.tie_word_embeddings and pycode.vocab_size == 1024
    assert pycode.device.type == "cpu" and pycode.dtype == torch.float32
    assert pycode.eos_ids == [2]
    tok = pycode.tokenizer
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert not getattr(tok, "chat_template", None), "a base model must not carry a chat template"


def test_readme_records_the_weights_sha256():
    readme = (ASSET / "README.md").read_text()
    sha = hashlib.sha256((ASSET / "model.safetensors").read_bytes()).hexdigest()
    assert sha in readme, "README.md's sha256 is stale: rebuild with scripts/build_pycode_target.py"
    assert "build_pycode_target.py" in readme and "PSF" in readme
    assert sum(p.stat().st_size for p in ASSET.iterdir()) < 6 * 2**20


def test_tokenizer_round_trips_code(pycode):
    tok = pycode.tokenizer
    snippet = 'def f(x, *, y=None):\n\tif x:  # note: ünïcode\n        return {"k": [x ** 2]}\n\n'
    ids = tok(snippet)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) < len(snippet.encode()), "BPE should compress code below one token per byte"
    assert tok.decode(ids, skip_special_tokens=True) == snippet


def test_heldout_loss_is_far_below_uniform(pycode):
    seqs = []
    for _, text in stdlib_corpus.documents("heldout"):
        ids = pycode.tokenizer(text[:4000])["input_ids"]  # 4000 chars > 256 tokens; avoids the 1024 warning
        if len(ids) >= 256:
            seqs.append(ids[:256])
        if len(seqs) == 4:
            break
    batch = torch.tensor(seqs)  # [4, 256]
    with torch.no_grad():
        loss = pycode.model(input_ids=batch, labels=batch).loss.item()
    assert loss < 3.0, f"held-out loss {loss:.3f} nats/token (uniform is {math.log(1024):.2f})"


def _greedy(pycode, prompt: str, n: int) -> list[int]:
    ids = torch.tensor([pycode.tokenizer(prompt)["input_ids"]])  # [1, s]
    with torch.no_grad():
        out = pycode.model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0)  # [1, s + n]
    return out[0, ids.shape[1]:].tolist()


def test_greedy_continuation_is_not_degenerate(pycode):
    new = _greedy(pycode, "def ", 32)
    assert len(set(new)) > 3, f"greedy continuation of 'def ' is degenerate: {new}"
    # A random-weight model would not know Python: a method in a class body starts with __init__(self.
    text = pycode.tokenizer.decode(_greedy(pycode, "class Foo:\n    def", 6), skip_special_tokens=True)
    assert text.startswith(" __init__(self"), f"unexpected greedy method name: {text!r}"
