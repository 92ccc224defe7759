"""Robustness harness: a received checkpoint (drafter.json, config.yaml, drafter.safetensors) and
its target's files (config.json, tokenizer files, chat template) damaged, and bad flags, through
`eval`, `export`, `inspect` and `profile`, in-process, each case in a forked child under a CPU-time
and memory limit (tests/robustness/sandbox.py says what is asserted).

Generated inputs per test in CI (DRAFTSMITH_HARNESS_EXAMPLES=N runs N random ones instead):
  eval:    12 bad flag values, 10 damaged config.yaml values, 6 damaged config.yaml documents,
           8 damaged drafter.json values, 8 damaged drafter.json documents, 8 damaged safetensors
           headers, 8 damaged target files; fixed: 9 hostile chat templates, 8 known bad flags,
           2 known config.yaml documents
  export:  10 bad flag values, 8 damaged drafter.json / config.yaml values, 8 damaged safetensors,
           4 NaN / inf weights; fixed: 6 --out paths onto the user's files
  inspect: 10 damaged target config.json / tokenizer files
  profile: 6 bad flag values
Known findings of issue 22 have their own tests (they failed before the fixes).
"""
from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

CKPT = world.CHECKPOINT
WEIGHTS = f"{CKPT}/drafter.safetensors"
DRAFTER_JSON = f"{CKPT}/drafter.json"
CONFIG_YAML = f"{CKPT}/config.yaml"
EVAL = ["eval", CKPT, *world.EVAL_FAST, "--out", "out/r.json"]
# the tensors of the world's EAGLE-3 drafter (4-layer target, hidden 32, draft vocabulary 64)
TENSORS = ["d2t", "fc.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight", "norm.weight", "t2d"]
FLOAT_TENSORS = ["fc.weight", "lm_head.weight", "midlayer.self_attn.q_proj.weight", "norm.weight"]
DRAFTER_JSON_PATHS = [("kind",), ("options",), ("options", "ttt_steps"), ("options", "draft_vocab_size"),
                      ("options", "num_heads"), ("feature_layers",), ("feature_layers", 0), ("target",),
                      ("target", "fingerprint"), ("target", "vocab_size"), ("target", "hidden_size"), ("step",)]
# config.yaml keys whose bad values reach the drafter's rebuild and the eval (not its length: data/train keys
# do not matter at eval time)
CONFIG_KEYS = ["target", "target.path", "target.dtype", "target.device", "drafter", "drafter.kind",
               "drafter.options", "drafter.options.draft_vocab_size", "drafter.options.num_heads",
               "drafter.options.step_decay", "drafter.options.intermediate_size", "data.chat_template", "name"]


def _eval(damage: S.Damage | None = None, extra: list[str] = (), names: list[str] = (), **kw) -> Case:
    return Case([*EVAL, *extra], names=list(names) + (damage.names if damage else []), outputs=["out"],
                seconds=kw.pop("seconds", 60), label=damage.label if damage else "", **kw)


def _export(damage: S.Damage | None = None, fmt: str = "vllm", extra: list[str] = (), names: list[str] = (),
            **kw) -> Case:
    return Case(["export", CKPT, "--to", fmt, "--out", "exp", *extra], names=list(names) + (damage.names if damage else []),
                outputs=["exp"], seconds=kw.pop("seconds", 60), label=damage.label if damage else "", **kw)


# --------------------------------------------------------------------------- eval: flags

SMALL_INTS = st.sampled_from([-3, -1, 0, 1, 2, 3])
EVAL_FLAGS = {
    "--k": st.sampled_from([-1, 0, 1, 3, 8]), "--num-prompts": S.flag_ints, "--max-new-tokens": SMALL_INTS,
    "--warmup": SMALL_INTS, "--repeats": SMALL_INTS, "--seed": S.flag_ints, "--top-k": S.flag_ints,
    "--top-p": S.flag_floats, "--temperature": S.flag_floats.filter(lambda v: v not in ("nan", "inf")),
    "--tree": st.sampled_from(["dynamic", "static", "chain", ""]), "--tree-depth": SMALL_INTS,
    "--tree-topk": SMALL_INTS, "--verify-budget": SMALL_INTS, "--prompt-format": st.sampled_from(["raw", "chat", "x"]),
    "--workloads": st.sampled_from(["nosuch", "jsonl:", "jsonl:data/none.jsonl", "jsonl:data/chat.jsonl",
                                    "jsonl:recipe.yaml", "jsonl:target", "jsonl:/dev/null"]),
    "--concurrency-sweep": st.sampled_from(["1,2", "-1", "a,b", "1,,2", "2"]),
    "--out": st.sampled_from(["out/r.json", "out/", "out/a/b/c.json"]), "--data-dir": S.flag_texts,
}


@st.composite
def flag_values(draw, table: dict, count: int = 2) -> list[str]:
    flags = draw(st.lists(st.sampled_from(sorted(table)), min_size=1, max_size=count, unique=True))
    argv = []
    for flag in flags:
        argv += [flag, str(draw(table[flag]))]
    return argv


@harness_settings(12)
@given(extra=flag_values(EVAL_FLAGS))
def test_eval_bad_flags(check, extra):
    check(_eval(extra=extra, names=[a for a in extra if a.startswith("--")] + [a for a in extra[1::2] if a]))


KNOWN_EVAL_FLAGS = [(["--temperature", "nan"], "low: --temperature nan"), (["--temperature", "inf"], "low: --temperature nan"), (["--dtype", "int8"], "10"),
                    (["--device", "cuda"], "low: --device cuda without CUDA"), (["--batch-size", "0"], "low: --batch-size 0"),
                    (["--workloads", ","], "low: --workloads ,"), (["--k", "100000"], "9"),
                    (["--out", CONFIG_YAML], "low: eval --out CKPT/config.yaml")]


@pytest.mark.parametrize("extra, finding", KNOWN_EVAL_FLAGS, ids=[" ".join(e) for e, _ in KNOWN_EVAL_FLAGS])
def test_eval_known_flag_findings(check, extra, finding):
    check(_eval(extra=extra, names=[extra[0]], expect_error=True, seconds=15))


# --------------------------------------------------------------------------- eval: damaged checkpoint files

@harness_settings(10)
@given(damage=S.yaml_value_damage(CONFIG_YAML, CONFIG_KEYS))
def test_eval_damaged_config_yaml(check, damage):
    check(_eval(damage), [damage])


@pytest.mark.parametrize("kind", ["bomb_value", "deep_list"])
def test_eval_known_config_yaml_documents(check, kind):
    damage = S.yaml_document_damage(CONFIG_YAML, kind)
    check(_eval(damage, seconds=10), [damage])


@harness_settings(6)
@given(damage=st.one_of(S.byte_damage(CONFIG_YAML, text_only=True),
                        S.yaml_structure_damage(CONFIG_YAML, ["list", "scalar", "tabs", "binary_tag", "python_tag",
                                                              "huge_int"])))
def test_eval_damaged_config_yaml_document(check, damage):
    # an empty config.yaml is the default recipe: the fingerprint check then names the checkpoint, which is fine
    check(_eval(damage, names=[CKPT]), [damage])


@harness_settings(8)
@given(damage=S.json_damage(DRAFTER_JSON, DRAFTER_JSON_PATHS))
def test_eval_damaged_drafter_json_values(check, damage):
    check(_eval(damage), [damage])


@harness_settings(8)
@given(damage=st.one_of(S.whole_json_damage(DRAFTER_JSON), S.byte_damage(DRAFTER_JSON)))
def test_eval_damaged_drafter_json_document(check, damage):
    check(_eval(damage), [damage])


@harness_settings(8)
@given(damage=S.safetensors_damage(WEIGHTS, TENSORS, allow_non_finite=False))
def test_eval_damaged_safetensors(check, damage):
    check(_eval(damage), [damage])


@harness_settings(8)
@given(damage=st.one_of(S.json_damage("target/config.json", [("num_hidden_layers",), ("hidden_size",),
                                                              ("vocab_size",), ("max_position_embeddings",),
                                                              ("eos_token_id",), ("rope_theta",), ("model_type",)]),
                        S.byte_damage("target/tokenizer.json"), S.byte_damage("target/tokenizer_config.json"),
                        S.json_damage("target/tokenizer_config.json", [("eos_token",), ("bos_token",),
                                                                        ("model_max_length",), ("tokenizer_class",)])))
def test_eval_damaged_target_files(check, damage):
    check(_eval(damage, names=["target"]), [damage])


TEMPLATE_FINDINGS = {"nested_loops": "13", "huge_output": "13", "include": "low: {% include %}",
                     "attribute_escape": "low: a template the sandbox blocked", "raises": "low: template error",
                     "syntax_error": "low: template error", "undefined_filter": "low: template error"}


@pytest.mark.parametrize("kind", sorted(S.TEMPLATES))  # TEMPLATE_FINDINGS: which issue-22 finding each one was
def test_eval_hostile_chat_template(check, kind):
    damage = S.Damage(f"chat template {kind}", lambda root: (root / "target/chat_template.jinja").write_text(
        S.TEMPLATES[kind]), ["chat_template.jinja", "chat template", "chat_template", "template"])
    check(_eval(damage, seconds=15), [damage])  # CPU s; the step bound stops a loop at ~1.5 s


# --------------------------------------------------------------------------- export

EXPORT_FLAGS = {"--to": st.sampled_from(["vllm", "sglang", "trtllm", "hf", "onnx", ""]),
                "--num-speculative-tokens": st.sampled_from([-1, 0, 1, 2, 4]),
                "--dtype": st.sampled_from(["float32", "bfloat16", "float16", "int8"]),
                "--max-model-len": S.flag_ints, "--verifier": S.flag_texts}


@harness_settings(10)
@given(extra=flag_values(EXPORT_FLAGS))
def test_export_bad_flags(check, extra):
    check(_export(extra=extra, names=[a for a in extra if a.startswith("--")] + [a for a in extra[1::2] if a]))


@harness_settings(8)
@given(damage=st.one_of(S.json_damage(DRAFTER_JSON, DRAFTER_JSON_PATHS),
                        S.yaml_value_damage(CONFIG_YAML, CONFIG_KEYS)))
def test_export_damaged_metadata(check, damage):
    check(_export(damage), [damage])


@harness_settings(8)
@given(damage=S.safetensors_damage(WEIGHTS, TENSORS, allow_non_finite=False),
       fmt=st.sampled_from(["vllm", "sglang", "trtllm"]))
def test_export_damaged_safetensors(check, damage, fmt):
    check(_export(damage, fmt), [damage])


@harness_settings(4)
@given(damage=S.safetensors_damage(WEIGHTS, FLOAT_TENSORS, only=["nan", "inf"]),
       fmt=st.sampled_from(["vllm", "sglang", "trtllm"]))
def test_export_non_finite_weights(check, damage, fmt):
    check(_export(damage, fmt, expect_error=True), [damage])


@pytest.mark.parametrize("out", [".", CKPT, "runs/base", "target", "recipe.yaml", "results/base.json"])
def test_export_out_onto_user_files(check, out):
    """--out at something that is not a previous export: refused, nothing changed."""
    check(Case(["export", CKPT, "--to", "vllm", "--out", out], names=["--out", out.rstrip("/")], outputs=[], seconds=60,
               expect_error=True))


# --------------------------------------------------------------------------- inspect

@harness_settings(10)
@given(damage=st.one_of(S.json_damage("target/config.json", [("num_hidden_layers",), ("hidden_size",),
                                                              ("num_attention_heads",), ("vocab_size",),
                                                              ("max_position_embeddings",), ("rope_scaling",),
                                                              ("model_type",), ("architectures",), ("head_dim",)]),
                        S.whole_json_damage("target/config.json"), S.byte_damage("target/tokenizer.json"),
                        S.json_damage("target/tokenizer_config.json", [("eos_token",), ("tokenizer_class",)])),
       kind=st.sampled_from([[], ["--kind", "eagle3"], ["--kind", "nosuch"], ["--json"]]))
def test_inspect_damaged_target(check, damage, kind):
    check(Case(["inspect", "target", *kind], names=damage.names + ["target"], seconds=30), [damage])


# --------------------------------------------------------------------------- profile

PROFILE_BASE = ["profile", CKPT, "--workloads", f"jsonl:{world.PROMPTS}", "--k-max", "2", "--num-prompts", "1",
                "--max-new-tokens", "4", "--batches", "1,2", "--contexts", "16", "--repeats", "1",
                "--overhead-batch", "1", "--device", "cpu", "--out", "prof/p.json"]
PROFILE_FLAGS = {"--k-max": SMALL_INTS, "--repeats": SMALL_INTS, "--batches": st.sampled_from(["0", "-1", "1,,2", "a"]),
                 "--contexts": st.sampled_from(["0", "-16", "100000", "x"]), "--num-prompts": SMALL_INTS,
                 "--max-new-tokens": SMALL_INTS, "--overhead-batch": SMALL_INTS,
                 "--validate-batches": st.sampled_from(["0", "1", "-2", "x"])}


@harness_settings(6)
@given(extra=flag_values(PROFILE_FLAGS, count=1))
def test_profile_bad_flags(check, extra):
    check(Case([*PROFILE_BASE, *extra], names=[extra[0], extra[1]], outputs=["prof"], seconds=60))


def test_harness_world_is_valid(world_dir):
    """The inputs every case damages are themselves good: a checkpoint and a result eval wrote."""
    meta = json.loads((world_dir / DRAFTER_JSON).read_text())
    assert meta["kind"] == "eagle3" and meta["step"] == 2
    assert yaml.safe_load((world_dir / CONFIG_YAML).read_text())["target"]["path"] == "target"
    assert set(S.read_safetensors_header(world_dir / WEIGHTS)[0]) >= set(TENSORS)
    assert json.loads((world_dir / world.RESULT).read_text())["schema"] == "draftsmith.eval-results"
