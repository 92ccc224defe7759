"""The SmolLM2-135M-Instruct recipe end to end in a real engine: recipes/cpu/eagle3-smollm2-135m.yaml trains
2 steps (online features, a few chat rows), `draftsmith export --to llama.cpp --target-gguf <the installed
Q4_1 file> --gguf-type q4_0` writes the draft through llama.cpp's converter and llama-quantize, and
llama-server serves it with the Q4_1 target as it is: its output with the draft equals its output without.
The same for a DFlash block drafter on the recipe's target and data (its drafter section replaced, q8_0): the
export keeps the draft's mask token when it takes the Q4_1 file's tokenizer (without it llama-server aborted).

Needs the model (`bash scripts/install_smollm2.sh`) and llama.cpp (`bash scripts/install_llama_cpp.sh`);
skips without either, unless DRAFTSMITH_REQUIRE_SMOLLM2=1 / DRAFTSMITH_REQUIRE_LLAMA_CPP=1 (set by .ci/run
after the installs succeeded)."""
from __future__ import annotations

import json
import os

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

ROWS = [
    ("Give me three tips for staying healthy.",
     "1. Eat a balanced diet with plenty of fruits and vegetables.\n2. Exercise regularly.\n3. Get enough sleep."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("Write a haiku about the sea.", "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."),
    ("Explain what a CPU does in one sentence.",
     "A CPU executes the instructions of computer programs by performing arithmetic, logic and control operations."),
]


@pytest.fixture(scope="module")
def smollm2():
    from draftsmith.targets.installed import resolve

    try:
        return resolve("smollm2-135m-instruct")
    except FileNotFoundError as exc:
        if os.environ.get("DRAFTSMITH_REQUIRE_SMOLLM2") == "1":
            pytest.fail(f"{exc} (DRAFTSMITH_REQUIRE_SMOLLM2=1 requires it)")
        pytest.skip(f"SmolLM2-135M-Instruct is not installed: {exc}")


# the block drafter the test serves beside EAGLE-3: llama.cpp's draft-dflash takes the full vocabulary
DFLASH = {"kind": "dflash", "block_size": 4, "num_layers": 1, "aux_layer_ids": [2, 15, 27]}
CASES = {"eagle3": ("q4_0", "Q4_0"), "dflash": ("q8_0", "Q8_0")}  # --gguf-type, a tensor type it must write


def trained(kind: str, out) -> str:
    import yaml

    from draftsmith import config
    from draftsmith.train.loop import train

    data = out / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": q},
                                                     {"role": "assistant", "content": a}]}) + "\n" for q, a in ROWS))
    recipe = REPO / "recipes" / "cpu" / "eagle3-smollm2-135m.yaml"
    if kind == "dflash":  # the same recipe with its drafter section replaced
        raw = yaml.safe_load(recipe.read_text())
        recipe = out / "dflash-smollm2.yaml"
        recipe.write_text(yaml.safe_dump({**raw, "drafter": DFLASH}))
    cfg = config.load(recipe, [f"data.path=[{data}]", "regenerate.output=null", "data.eval_samples=0", "features.mode=online", "features.cache_dir=null",
                               "features.label_topk=null",
                               "train.max_steps=2", "train.batch_size=2", "train.eval_every=0", "train.save_every=0",
                               f"train.output_dir={out}/run", "logging.progress_bar=false", "train.precision=fp32"])
    return train(cfg).final_checkpoint


@pytest.mark.parametrize("kind", list(CASES))
def test_two_steps_export_quantized_and_serve_identically(kind, smollm2, tools, tmp_path):
    from gguf import GGUFReader

    from draftsmith.cli import main
    from draftsmith.config import TargetConfig
    from draftsmith.export.llamacpp.tools import LlamaServer
    from draftsmith.targets.load import from_config

    gguf_type, tensor_type = CASES[kind]
    ckpt = trained(kind, tmp_path)
    out = tmp_path / "gguf"
    assert main(["export", str(ckpt), "--to", "llama.cpp", "--out", str(out), "--target-gguf", str(smollm2),
                 "--gguf-type", gguf_type, "--num-speculative-tokens", "3"]) == 0
    side = json.loads((out / "draftsmith.json").read_text())
    assert side["draft_gguf_type"] == gguf_type and side["target"] == str(smollm2)  # the Q4_1 file served as it is
    assert side["check"]["loaded"]
    draft = out / side["draft"]
    reader = GGUFReader(str(draft))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert tensor_type in types.values(), types  # the converter (q8_0) or llama-quantize (q4_0) wrote that type
    if kind == "eagle3":  # the recipe's norm_before_residual reaches llama.cpp's graph (src/models/eagle3.cpp)
        fields = {name: f.contents() for name, f in reader.fields.items()}
        assert fields.get("eagle3.norm_before_residual") is True, {k: v for k, v in fields.items() if "eagle3." in k}
    if kind == "dflash":  # the trained mask token, aux layers and block survive taking the Q4_1 file's tokenizer
        from draftsmith.checkpoint import load_drafter
        from draftsmith.export.llamacpp.block import gguf_block_problems

        assert gguf_block_problems(draft, load_drafter(ckpt, device="cpu").drafter) == []

    tok = from_config(TargetConfig(path="installed:smollm2-135m-instruct")).tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for q, _ in ROWS[:2]]
    with LlamaServer(tools, smollm2, draft=draft, spec_type=side["spec_type"], k=3,
                     max_requests=4) as spec, LlamaServer(tools, smollm2, max_requests=4) as base:
        for ids in prompts:
            with_draft, without = spec.complete(list(ids), 32), base.complete(list(ids), 32)
            assert with_draft["tokens"] == without["tokens"]  # greedy: the draft never changes the output
            assert with_draft["timings"].get("draft_n", 0) > 0  # and it did draft


def test_requantize_script_writes_the_type_asked_and_refuses_others(smollm2, tools, tmp_path):
    """scripts/requantize_smollm2.sh (issue 41's Q4_0 target): the Q4_1 file requantized by llama-quantize,
    every quantized tensor now Q4_0, the file renamed into place; an unknown type is refused (exit 2)."""
    import subprocess

    from gguf import GGUFReader

    script = REPO / "scripts" / "requantize_smollm2.sh"
    bad = subprocess.run(["bash", str(script), "Q3_K", str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 2 and "Q3_K" in bad.stderr and not list(tmp_path.iterdir())
    done = subprocess.run(["bash", str(script), "Q4_0", str(tmp_path)], capture_output=True, text=True, check=True)
    out = tmp_path / "SmolLM2-135M-Instruct.Q4_0.gguf"
    assert done.stdout.strip().splitlines()[-1] == str(out)
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left
    kinds = {t.tensor_type.name for t in GGUFReader(str(out)).tensors}
    source = {t.tensor_type.name for t in GGUFReader(str(smollm2)).tensors}
    assert "Q4_1" in source and "Q4_0" in kinds and "Q4_1" not in kinds, (source, kinds)
