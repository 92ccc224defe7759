"""What each engine serves for the hybrid and vision-language targets (issue 42): can_export answers [] or one line
naming the engine's gap (engine, release, source file), from the tables in export/<engine>/targets.py and
llama.cpp's FEATURE_CAPTURE."""
import pytest

from draftsmith.export import can_export, engine_versions
from draftsmith.export.layout import layouts
from draftsmith.export.llamacpp.layouts import FEATURE_CAPTURE
from draftsmith.targets.archs import TINY

HYBRIDS = ["qwen3-next", "qwen3.5", "qwen3.5-moe", "lfm2", "falcon-h1", "nemotron-h", "granite-4-hybrid", "kimi-linear"]
VLMS = ["gemma3-vl", "qwen2.5-vl", "qwen3-vl", "qwen3-vl-moe"]
AUX = {"eagle3", "peagle", "dflash", "dspark"}  # the vLLM kinds that read the target's aux hidden states

# (format, kind) each engine refuses per target, as read from its code (the modules' docstrings say where);
# every other (format, kind) with a layout is served.
REFUSED = {
    "qwen3-next": set(),
    "qwen3.5": set(),
    "qwen3.5-moe": set(),
    "lfm2": {("vllm", k) for k in AUX} | {("sglang", "eagle3"), ("sglang", "eagle1"), ("trtllm", "eagle3")},
    "falcon-h1": {("vllm", k) for k in AUX} | {("sglang", "eagle3"), ("sglang", "dflash"), ("sglang", "dspark"),
                                               ("trtllm", "eagle3")},
    "nemotron-h": {("sglang", "eagle3")},
    "granite-4-hybrid": {("vllm", k) for k in AUX} | {("sglang", k) for k in ("eagle3", "eagle1", "dflash", "dspark")}
                        | {("trtllm", "eagle3")},
    "kimi-linear": {("sglang", "eagle3"), ("sglang", "eagle1"), ("sglang", "dflash"), ("trtllm", "eagle3")},
    "gemma3-vl": {("vllm", k) for k in AUX} | {("sglang", "dflash"), ("sglang", "dspark"), ("trtllm", "eagle3")},
    "qwen2.5-vl": {("sglang", "dflash"), ("sglang", "dspark"), ("trtllm", "eagle3")},
    "qwen3-vl": {("trtllm", "eagle3")},
    "qwen3-vl-moe": {("trtllm", "eagle3")},
}
SOURCES = {"vllm": "vLLM 0.33.0", "sglang": "SGLang 0.5.23", "trtllm": "TensorRT-LLM main"}
# llama.cpp: the target graphs that store layer inputs (t_layer_inp) among the new ones
LLAMACPP_CAPTURE = {"qwen3-next", "qwen3.5", "qwen3.5-moe", "lfm2", "nemotron-h"}


def _config(name):
    return TINY[name][1]()


def _kinds(fmt):
    return [k for k in layouts(fmt).names() if not engine_versions.versions(fmt)
            or engine_versions.serving(fmt, engine_versions.versions(fmt)[-1], k).served]


@pytest.mark.parametrize("name", HYBRIDS + VLMS)
def test_every_new_target_is_in_every_engine_table(name):
    model_type = _config(name).model_type
    for fmt, table in engine_versions.TARGETS.items():
        assert model_type in table.model_types(), f"{fmt} has no row for {model_type}"


@pytest.mark.parametrize("name", HYBRIDS + VLMS)
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm"])
def test_table_refuses_exactly_the_gaps_read(name, fmt):
    config = _config(name)
    for kind in _kinds(fmt):
        reasons = engine_versions.target_refusals(fmt, None, kind, config)
        if (fmt, kind) not in REFUSED[name]:
            assert reasons == [], (name, fmt, kind, reasons)
            continue
        assert len(reasons) == 1 and "\n" not in reasons[0], reasons
        line = reasons[0]
        assert line.startswith(f"--to {fmt}: {SOURCES[fmt]}"), line
        assert "/" in line and config.model_type in line, line  # names the target and the engine's source path


@pytest.mark.parametrize("name", HYBRIDS + VLMS)
@pytest.mark.parametrize("fmt", ["vllm", "sglang", "trtllm", "llama.cpp"])
def test_can_export_answers_one_line_or_nothing(name, fmt):
    """The public answer: [] when served, else one-line reasons, one of which names the engine's gap."""
    config = _config(name)
    for kind in _kinds(fmt):
        reasons = can_export(kind, fmt, None, config)
        assert all("\n" not in r for r in reasons), reasons
        if fmt == "llama.cpp":
            feature_kind = kind != "draft_lm"
            if feature_kind and name not in LLAMACPP_CAPTURE:
                assert any("feature capture in llama.cpp" in r for r in reasons) or any(
                    "AutoModelForCausalLM" in r for r in reasons), reasons
            continue
        if (fmt, kind) in REFUSED[name]:
            assert reasons, (name, fmt, kind)
            assert any(SOURCES[fmt] in r or "AutoModelForCausalLM" in r for r in reasons), reasons
        else:
            assert reasons == [], (name, fmt, kind, reasons)


@pytest.mark.parametrize("name", sorted(LLAMACPP_CAPTURE))
def test_llamacpp_captures_the_hybrids_whose_graph_stores_layer_inputs(name):
    assert _config(name).model_type in FEATURE_CAPTURE
    assert can_export("eagle3", "llama.cpp", None, _config(name)) == []


def test_vllm_release_gaps_point_at_the_release_that_serves():
    qwen3_next = _config("qwen3-next")
    line, = can_export("eagle3", "vllm", "0.20.0", qwen3_next)
    assert "vLLM 0.20.0" in line and "Qwen3NextForCausalLM" in line and "SupportsEagle3" in line
    assert line.endswith("vLLM 0.33.0 does: pass --engine-version 0.33.0")
    assert can_export("eagle3", "vllm", "0.27.0", qwen3_next) == []
    line, = can_export("eagle1", "vllm", "0.9.2", qwen3_next)  # no model class at all in 0.9.2's registry
    assert "vLLM 0.9.2 has no model class for a qwen3_next target (model_executor/models/registry.py)" in line
    # a release that serves no EAGLE-3 at all says that once, not the target gap on top
    reasons = can_export("eagle3", "vllm", "0.9.2", qwen3_next)
    assert len(reasons) == 1 and "speculators" in reasons[0]
    nemotron = _config("nemotron-h")
    assert can_export("dflash", "vllm", "0.20.0", nemotron)[0].endswith("pass --engine-version 0.33.0")
    gemma = _config("gemma3-vl")
    assert can_export("eagle3", "vllm", "0.27.0", gemma)[0].endswith(
        "no vLLM release draftsmith has read does: export another kind or format")


def test_real_qwen35_checkpoint_model_type_is_listed_too():
    """A real Qwen3.5 checkpoint is the VLM config (model_type qwen3_5); vLLM 0.20 serves it, not the text config."""
    from transformers import Qwen3_5Config

    vlm = Qwen3_5Config()
    assert vlm.model_type == "qwen3_5"
    assert engine_versions.target_refusals("vllm", "0.20.0", "eagle3", vlm) == []
    text = _config("qwen3.5")
    line, = engine_versions.target_refusals("vllm", "0.20.0", "eagle3", text)
    assert "no model class for a qwen3_5_text target" in line and line.endswith("pass --engine-version 0.33.0")
    assert "qwen3_5" in FEATURE_CAPTURE and "qwen3_5_text" in FEATURE_CAPTURE


def test_llama4_vlm_rows():
    """Llama-4 checkpoints are model_type llama4 (Llama4ForConditionalGeneration in every engine): vLLM captures its aux
    hidden states from 0.20 (mllama4.py: SupportsEagle3), SGLang 0.5.23 for EAGLE-3 only (no DFlash capture method),
    TensorRT-LLM's Llama4DecoderLayer captures them."""
    from transformers import Llama4Config

    llama4 = Llama4Config()
    assert llama4.model_type == "llama4"
    for fmt, kind in (("vllm", "eagle3"), ("vllm", "dflash"), ("sglang", "eagle3"), ("trtllm", "eagle3")):
        assert engine_versions.target_refusals(fmt, None, kind, llama4) == [], (fmt, kind)
    assert engine_versions.target_refusals("vllm", "0.9.2", "eagle1", llama4) == []  # EAGLE-1: the last hidden state
    line, = engine_versions.target_refusals("vllm", "0.9.2", "eagle3", llama4)
    assert "Llama4ForConditionalGeneration (model_executor/models/mllama4.py) lacks SupportsEagle3" in line
    for kind in ("dflash", "dspark"):
        line, = engine_versions.target_refusals("sglang", None, kind, llama4)
        assert "srt/models/mllama4.py" in line and "set_dflash_layers_to_capture" in line


def test_attention_only_targets_are_not_in_the_tables():
    llama = _config("llama3")
    for fmt in engine_versions.TARGETS:
        for kind in _kinds(fmt):
            assert engine_versions.target_refusals(fmt, None, kind, llama) == []


def test_table_rows_have_only_what_some_need_names():
    """A row lists the engine names (interfaces, methods) its class has; each is one some kind's Need reads."""
    for fmt, table in engine_versions.TARGETS.items():
        needs = [table.needs(kind) for kind in layouts(fmt).names()]
        named = set().union(*[n.all_of | n.any_of for n in needs if n is not None])
        for model_type in table.model_types():
            for release in table.releases:
                row = table.get(model_type, release)
                assert row is None or row.has <= named, (fmt, model_type, release, row.has - named)


def test_export_refuses_a_drafter_for_a_target_the_engine_does_not_serve(tmp_path):
    """`draftsmith export` asks the same tables as can_export: an EAGLE-3 drafter of a Gemma-3 VLM target is refused
    for vLLM (its Gemma3ForConditionalGeneration has no EAGLE-3 capture) before any file is written, and taken by
    SGLang, which serves it."""
    import torch

    from draftsmith import config as config_mod
    from draftsmith.checkpoint import LoadedDrafter
    from draftsmith.core.errors import UserError
    from draftsmith.export import export
    from draftsmith.heads import DRAFTERS
    from draftsmith.testing import arch_target

    target = arch_target("gemma3-vl")
    cls = DRAFTERS.get("eagle3")
    recipe = config_mod.from_dict({"target": {"path": "gemma3-vl (built in code)"},
                                   "drafter": {"kind": "eagle3", **cls.tiny_options}})
    torch.manual_seed(0)
    drafter = cls.from_target(recipe.drafter.options, target).eval()
    loaded = LoadedDrafter(drafter=drafter, target=target, config=recipe,
                           meta={"kind": "eagle3", "step": 1, "target": target.identity()})
    with pytest.raises(UserError) as err:
        export(None, "vllm", tmp_path / "vllm", loaded=loaded, validate=False)
    assert "\n" not in str(err.value) and "vLLM 0.33.0" in str(err.value) and "Gemma3" in str(err.value), err.value
    assert not (tmp_path / "vllm").exists()
    assert export(None, "sglang", tmp_path / "sglang", loaded=loaded, validate=False).out_dir.is_dir()
