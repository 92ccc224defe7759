"""train -> export --to llama.cpp -> llama-server for the block drafters (DFlash: z-lab's DFlashDraftModel
layout, DSpark: speculators' DSparkSpeculator, DFlash 2: z-lab's DFlash2DraftModel), on the embedded target
builtin:pycode-tiny: the shipped debug recipes for a few steps (DFlash 2: DFlash's recipe with kind dflash2
and a selector top-k that fits llama.cpp's lattice row), the draft GGUF written by llama.cpp's own converter
(arch "dflash", target_layers = the drafter's aux ids, the mask token, the block size; DSpark's Markov and
confidence tensors; DFlash 2's convolutions and selector), loaded by llama-server, then `draftsmith eval --engine llama.cpp` at k = one whole block on a
few prompts: output with the draft equals output without, and llama.cpp's tau is within 5 % of draftsmith's.

Needs llama.cpp built by `bash scripts/install_llama_cpp.sh`; skips without it, unless
DRAFTSMITH_REQUIRE_LLAMA_CPP=1 (set by .ci/run after the install script succeeded)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target_gguf(tools, tmp_path_factory):
    """pycode-tiny's GGUF, converted once for both kinds (each export then takes --target-gguf)."""
    from draftsmith.export.llamacpp.tools import convert
    from draftsmith.targets.load import resolve_path

    return convert(tools, Path(resolve_path("builtin:pycode-tiny")), tmp_path_factory.mktemp("t") / "target.gguf")


# DFlash 2 has no pycode-tiny recipe: DFlash's, with the DFlash 2 pieces (top-k 8: 8 * 9 <= hidden 128)
RECIPE_OVERRIDES = {"dflash2": ("dflash", ["drafter.kind=dflash2", "drafter.selector_top_k=8", "drafter.selector_rank=16",
                                           "drafter.conv_group_size=16"])}


def train_tiny(kind: str, out) -> str:
    from draftsmith import config
    from draftsmith.train.loop import train

    recipe, extra = RECIPE_OVERRIDES.get(kind, (kind, []))
    cfg = config.load(REPO / "recipes" / "debug" / f"{recipe}-pycode-tiny.yaml",
                      [*extra, "train.max_steps=20", "train.batch_size=4", "train.eval_every=0", f"train.output_dir={out}/run",
                       "data.max_samples=64", "data.eval_samples=2", "logging.progress_bar=false",
                       "train.precision=fp32", "target.device=cpu"])
    return train(cfg).final_checkpoint


@pytest.mark.parametrize("kind", ["dflash", "dspark", "dflash2"])
def test_block_drafter_train_export_serve_round_trip(kind, tools, target_gguf, tmp_path, capsys):
    from gguf import GGUFReader

    from draftsmith.checkpoint import load_drafter
    from draftsmith.cli import main
    from draftsmith.export.llamacpp.block import gguf_block_problems

    ckpt = train_tiny(kind, tmp_path)
    drafter = load_drafter(ckpt, device="cpu").drafter
    k = drafter.tokens_per_round(drafter.cfg)
    out = tmp_path / "gguf"
    assert main(["export", str(ckpt), "--to", "llama.cpp", "--out", str(out), "--num-speculative-tokens", str(k),
                 "--target-gguf", str(target_gguf)]) == 0
    side = json.loads((out / "draftsmith.json").read_text())
    assert side["check"]["loaded"] and side["check"]["draft_n"] > 0  # llama-server loaded both and drafted
    assert side["spec_type"] == ("draft-dflash" if kind == "dflash2" else f"draft-{kind}")
    assert side["draft"] == f"draft-{kind}.gguf"
    reader = GGUFReader(str(out / side["draft"]))
    fields = reader.fields
    assert fields["general.architecture"].contents() == "dflash"
    assert list(fields["dflash.target_layers"].contents()) == side["aux_layer_ids"] == list(drafter.aux_layer_ids)
    assert gguf_block_problems(out / side["draft"], drafter) == []
    names = {t.name for t in reader.tensors}
    assert "token_embd.weight" not in names  # the target's embedding, shared through llama.cpp's ctx_other
    assert ({"markov_w1.weight", "markov_w2.weight", "conf_proj.weight"} <= names) == (kind == "dspark")
    dflash2_tensors = {"blk.0.attn_conv_base", "blk.1.ffn_conv_proj.weight", "selector_predecessor.weight",
                       "selector_successor.weight", "selector_hidden.weight"}
    assert (dflash2_tensors <= names) == (kind == "dflash2")
    if kind == "dflash2":  # what switches llama.cpp's draft-dflash to the selector walk
        assert fields["dflash.selector_top_k"].contents() == drafter.top_k == 8

    result = tmp_path / "parity.json"
    capsys.readouterr()
    code = main(["eval", str(ckpt), "--engine", "llama.cpp", "--engine-export", str(out), "--workloads", "pycode",
                 "--k", str(k), "--num-prompts", "3", "--max-new-tokens", "24", "--out", str(result),
                 "--check-lossless"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    e = json.loads(result.read_text())["workloads"]["pycode"]["engine"]
    assert e["output_equals_target_only"] == e["num_requests"] == 3
    assert e["target_only_equals_draftsmith"] == 3 and e["prompt_lengths_match"]
    assert e["draft_n"] > 0 and e["rounds"] > 0
    assert e["acceptance_length"] == pytest.approx(e["draftsmith_acceptance_length"], rel=0.05), printed

