"""llama.cpp serving without llama.cpp: the refusals of --to llama.cpp / eval --engine, the engine's tau
accounting against draftsmith's own, the verdict, the converter's pre-tokenizer fallback, the reader."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from draftsmith.eval import engine
from draftsmith.eval.loop import Generation, RoundStats
from draftsmith.eval.metrics import request_metrics
from draftsmith.export.llamacpp import layouts as llamacpp
from draftsmith.export.llamacpp.convert import gpt2_byte_level
from draftsmith.export.llamacpp.tools import LlamaCppMissing, find_llama_cpp


def fake_loaded(kind="eagle3", model_type="llama", aux=(1, 2, 4), act="silu", **cfg):
    """A loaded drafter without weights: the kind's typed Config and its class facts (what the gates ask)."""
    from draftsmith import config as config_mod
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get(kind)
    typed, problems, _ = config_mod.typed_drafter_options(kind, {"ttt_steps": 3, **cfg} if kind == "eagle3" else cfg)
    assert not problems, problems
    drafter = SimpleNamespace(kind=kind, aux_layer_ids=list(aux), cfg=typed, layer_config=SimpleNamespace(hidden_act=act),
                              attention_window=cls.attention_window, eagle31_norms=cls.eagle31_norms,
                              tokens_per_round=cls.tokens_per_round)
    return SimpleNamespace(drafter=drafter, target=SimpleNamespace(config=SimpleNamespace(model_type=model_type)))


# ---------------------------------------------------------------- refusals

@pytest.mark.parametrize("kind", ["medusa", "mlp_speculator", "peagle", "eagle1"])
def test_kinds_llamacpp_does_not_serve_are_refused_with_the_reason(kind):
    why = llamacpp.refusal(fake_loaded(kind))
    assert why is not None and why.startswith(f"--to llama.cpp does not take {kind} drafters: ")
    assert "\n" not in why


def test_eagle3_on_a_graph_without_feature_capture_is_refused():
    why = llamacpp.refusal(fake_loaded(model_type="gemma3_text"))
    assert "gemma3_text" in why and "no EAGLE-3 feature capture" in why and "draft-simple" in why


@pytest.mark.parametrize("options, needle", [({"aux": (1, 3)}, "exactly 3"), ({"aux": (0, 1, 2, 3)}, "exactly 3"),
                                             ({"fc_norm": True}, "drafter.fc_norm=true"),
                                             ({"norm_output": True}, "drafter.norm_output=true"),
                                             ({"act": "gelu"}, "not SiLU")])
def test_eagle3_options_llamacpp_cannot_run_are_refused(options, needle):
    assert needle in llamacpp.refusal(fake_loaded(**options))


@pytest.mark.parametrize("loaded", [fake_loaded(), fake_loaded(model_type="qwen3", norm_before_residual=True),
                                    fake_loaded("draft_lm", model_type="gemma3_text")])
def test_what_llamacpp_serves_passes(loaded):
    assert llamacpp.refusal(loaded) is None


def test_missing_llama_cpp_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_LLAMA_CPP_DIR", str(tmp_path))
    monkeypatch.delenv("DRAFTSMITH_LLAMA_SERVER", raising=False)
    with pytest.raises(LlamaCppMissing, match="bash scripts/install_llama_cpp.sh"):
        find_llama_cpp()


def test_export_cli_refuses_a_kind_in_one_line(tmp_path, capsys):
    from draftsmith.cli import main
    from tests.export.conftest import make_checkpoint

    ckpt = make_checkpoint(tmp_path, "medusa", {"num_heads": 2})
    capsys.readouterr()  # the checkpoint's own progress output
    code = main(["export", str(ckpt), "--to", "llama.cpp", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "does not take medusa drafters: llama.cpp has no Medusa heads" in err[0]
    assert not (tmp_path / "out").exists()


def test_target_gguf_is_refused_for_other_formats(tmp_path, capsys):
    from draftsmith.cli import main

    code = main(["export", str(tmp_path), "--to", "vllm", "--out", str(tmp_path / "o"), "--target-gguf", "x.gguf"])
    assert code == 2 and "--target-gguf applies to --to llama.cpp" in capsys.readouterr().err
    code = main(["export", str(tmp_path), "--to", "sglang", "--out", str(tmp_path / "o"), "--gguf-type", "q8_0"])
    assert code == 2 and "--gguf-type applies to --to llama.cpp (the draft GGUF's tensor type)" in capsys.readouterr().err


def test_a_q4_0_draft_without_llama_quantize_names_the_install(tmp_path):
    from draftsmith.export.llamacpp.tools import LlamaCppTools, write_draft

    tools = LlamaCppTools(server=tmp_path / "bin" / "llama-server", converter=tmp_path / "convert_hf_to_gguf.py")
    with pytest.raises(LlamaCppMissing, match="llama-quantize not found .*scripts/install_llama_cpp.sh"):
        write_draft(tools, tmp_path / "hf", tmp_path / "d.gguf", "q4_0")
    with pytest.raises(engine.UserError, match="--gguf-type 'q2_k': choose one of f32, f16, bf16, q8_0, q4_0"):
        write_draft(tools, tmp_path / "hf", tmp_path / "d.gguf", "q2_k")


# ---------------------------------------------------------------- tau accounting

def reply_for(rounds: list[tuple[int, int]]) -> dict:
    """What llama-server reports for a request whose rounds (drafted, accepted) are given: the first
    token from the prompt pass, then accepted + 1 per round (tools/server/server-context.cpp)."""
    new = 1 + sum(a + 1 for _d, a in rounds)
    return {"tokens_predicted": new, "tokens": list(range(new)), "tokens_evaluated": 9,
            "timings": {"draft_n": sum(d for d, _a in rounds), "draft_n_accepted": sum(a for _d, a in rounds),
                        "predicted_per_second": 100.0, "predicted_ms": 10.0}}


def generation_for(rounds: list[tuple[int, int]]) -> Generation:
    stats = [RoundStats(d, a, a + 1, 0.0, 0.0, 0.0) for d, a in rounds]
    new = 1 + sum(a + 1 for _d, a in rounds)
    return Generation(prompt_ids=[1] * 9, tokens=list(range(new)), stop="length", ttft_s=0.01, latency_s=0.1,
                      rounds=stats, k=3)


@pytest.mark.parametrize("rounds", [[(3, 3)] * 5, [(3, 0)] * 7, [(3, 1), (3, 2), (3, 0), (3, 3), (2, 2), (1, 0)],
                                    [(5, 4), (5, 0), (5, 5), (0, 0)]])
def test_engine_tau_counts_as_draftsmith_does(rounds):
    got = engine.engine_request(reply_for(rounds), prompt_len=9)
    want = request_metrics(generation_for(rounds), generation_for([]), 5)
    assert got["rounds"] == want["rounds"] == len(rounds)
    assert got["acceptance_length"] == pytest.approx(want["acceptance_length"])
    assert got["accepted"] == want["accepted"] and got["proposed"] == want["proposed"]


def test_a_reply_without_drafts_is_tau_one_and_an_impossible_one_is_refused():
    plain = engine.engine_request({"tokens_predicted": 17, "timings": {}}, prompt_len=4)
    assert plain["rounds"] == 16 and plain["acceptance_length"] == 1.0 and plain["proposed"] == 0
    with pytest.raises(ValueError, match="more than a round can commit"):
        engine.engine_request({"tokens_predicted": 5, "timings": {"draft_n": 9, "draft_n_accepted": 4}}, prompt_len=4)


def test_pool_is_sum_committed_over_sum_rounds():
    a = engine.engine_request(reply_for([(3, 3)] * 2), 9)  # 8 committed in 2 rounds
    b = engine.engine_request(reply_for([(3, 0)] * 6), 9)  # 6 committed in 6 rounds
    pooled = engine.pool([a, b])
    assert pooled["acceptance_length"] == pytest.approx(14 / 8)
    assert pooled["acceptance_rate"] == pytest.approx(6 / 24) and pooled["rounds"] == 8


# ---------------------------------------------------------------- verdict

def test_verdict_agrees_within_tolerance_and_names_causes_beyond():
    assert engine.verdict(2.0, 2.08, True, True, [])["verdict"] == "agree"
    far = engine.verdict(2.0, 1.5, True, True, [])
    assert far["verdict"] == "disagree" and far["gap"] == pytest.approx(-0.25)
    assert any(c.startswith("aux ids") for c in far["likely_causes"])
    assert any(c.startswith("rope") for c in far["likely_causes"])
    prompt = engine.verdict(2.0, 1.5, False, True, [])["likely_causes"]
    assert prompt[0].startswith("prompt format") and not any(c.startswith("aux ids") for c in prompt)
    target = engine.verdict(2.0, 1.5, True, False, [])["likely_causes"]
    assert any("target decodes differently" in c for c in target)
    named = engine.verdict(2.0, 1.0, True, True, ["aux ids: the draft GGUF extracts [2, 3, 4]"])["likely_causes"]
    assert named == ["aux ids: the draft GGUF extracts [2, 3, 4]"]


# ---------------------------------------------------------------- converter fallback, reader

def test_gpt2_fallback_only_for_gpt2_byte_level(tmp_path):
    def tok(pre, model="BPE", normalizer=None):
        path = tmp_path / f"{len(list(tmp_path.iterdir()))}.json"
        path.write_text(json.dumps({"model": {"type": model}, "pre_tokenizer": pre, "normalizer": normalizer}))
        return path

    assert gpt2_byte_level(tok({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}))
    assert gpt2_byte_level(tok({"type": "Sequence", "pretokenizers": [{"type": "ByteLevel", "use_regex": True}]}))
    assert not gpt2_byte_level(tok({"type": "ByteLevel", "use_regex": False}))
    assert not gpt2_byte_level(tok({"type": "Metaspace"}))
    assert not gpt2_byte_level(tok({"type": "ByteLevel"}, model="Unigram"))
    assert not gpt2_byte_level(tok({"type": "ByteLevel"}, normalizer={"type": "NFC"}))
    assert not gpt2_byte_level(tmp_path / "absent.json")


def test_results_reader_and_leaderboard_take_the_engine_section(tmp_path):
    from draftsmith.report.leaderboard import build_rows
    from draftsmith.report.parity import parity_lines
    from draftsmith.report.results_io import MalformedResultError, load_result

    section = {"name": "llama.cpp", "acceptance_length": 2.2, "acceptance_rate": 0.4, "draft_n": 30,
               "draft_n_accepted": 12, "draftsmith_acceptance_length": 2.25, "draftsmith_acceptance_rate": 0.41,
               "draftsmith_per_position_acceptance": [0.6, 0.4, None], "decode_speedup": {"median": 1.3, "p90": 1.5},
               "output_equals_target_only": 10, "num_requests": 10, "target_only_equals_draftsmith": 10,
               "gap": -0.022, "verdict": "agree", "likely_causes": []}
    data = {"schema": "draftsmith.eval-results", "schema_version": 1, "definitions": "draftsmith-v1",
            "config": {"k": 3, "temperature": 0.0}, "target": {"name": "t"}, "drafter": {"kind": "eagle3", "name": "d"},
            "hardware": {"device": "cpu"},
            "workloads": {"mt_bench": {"aggregate": {"acceptance_length": {"mean": 2.3, "pooled": 2.25},
                                                     "acceptance_rate": 0.41, "per_position_acceptance": [0.6, 0.4, None]},
                                       "engine": section}}}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    rows = build_rows([load_result(path)])
    assert rows[0].engine_tau == 2.2 and rows[0].fmt("engine_tau") == "2.20"
    assert "llama.cpp tau 2.200" in parity_lines("mt_bench", section)[0]
    section["acceptance_length"] = "high"
    path.write_text(json.dumps(data))
    with pytest.raises(MalformedResultError, match="engine.acceptance_length"):
        load_result(path)


def test_engine_compare_names_llamacpp_spec_types_and_chains():
    setups = engine.compare_setups("ngram-mod, draft+ngram-simple,ngram-mod", "draft-eagle3")
    assert setups == [{"name": "ngram-mod", "spec_type": "ngram-mod", "draft": False},
                      {"name": "draft+ngram-simple", "spec_type": "draft-eagle3,ngram-simple", "draft": True}]
    every = engine.compare_setups("ngram", "draft-dflash")
    assert len(every) == 2 * len(engine.NGRAM_TYPES)
    assert {s["spec_type"] for s in every if s["draft"]} == {f"draft-dflash,{t}" for t in engine.NGRAM_TYPES}
    assert engine.compare_setups("", "draft-eagle3") == []
    with pytest.raises(engine.UserError, match="'ngram-lookup' is not one of llama.cpp's draftless spec types"):
        engine.compare_setups("ngram-lookup", "draft-eagle3")
    with pytest.raises(engine.UserError, match="draft\\+TYPE"):
        engine.compare_setups("draft+draft-simple", "draft-eagle3")


def test_a_compared_proposer_is_counted_against_the_same_target_only_replies():
    def reply(tokens, accepted, per_s):
        return engine.engine_request({"tokens_predicted": len(tokens), "tokens": tokens,
                                      "timings": {"draft_n": accepted + 2, "draft_n_accepted": accepted,
                                                  "predicted_per_second": per_s}}, 5)

    base = [reply([1, 2, 3, 4, 5], 0, 100.0), reply([6, 7, 8, 9, 10], 0, 50.0)]
    ngram = [reply([1, 2, 3, 4, 5], 2, 150.0), reply([6, 7, 8, 9, 0], 1, 50.0)]
    c = engine.compare_section(ngram, base)
    assert c["decode_speedup"]["median"] == pytest.approx(1.25)  # 1.5x and 1.0x
    assert c["output_equals_target_only"] == 1 and c["num_requests"] == 2
    assert c["draft_n_accepted"] == 3 and c["draft_n"] == 7
    assert c["acceptance_length"] == pytest.approx(8 / (2 + 3))  # committed 4 + 4 over rounds (4-2) + (4-1)


def test_llama_server_command_for_a_draftless_proposer_and_a_chain(tmp_path):
    from draftsmith.export.llamacpp.tools import LlamaCppTools, LlamaServer

    tools = LlamaCppTools(server=tmp_path / "llama-server", converter=tmp_path / "convert_hf_to_gguf.py")
    ngram = LlamaServer(tools, tmp_path / "t.gguf", spec_type="ngram-mod", k=3).command()
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-mod" and "-md" not in ngram
    chain = LlamaServer(tools, tmp_path / "t.gguf", draft=tmp_path / "d.gguf", spec_type="draft-eagle3,ngram-mod",
                        k=3).command()
    assert chain[chain.index("--spec-type") + 1] == "draft-eagle3,ngram-mod" and "-md" in chain
    assert "--spec-type" not in LlamaServer(tools, tmp_path / "t.gguf").command()


def test_parity_lines_show_each_compared_proposer():
    from draftsmith.report.parity import parity_lines

    section = {"name": "llama.cpp", "draftsmith_per_position_acceptance": [0.5], "draftsmith_acceptance_length": 1.5,
               "draftsmith_acceptance_rate": 0.5, "acceptance_length": 1.5, "acceptance_rate": 0.5,
               "draft_n_accepted": 5, "draft_n": 10, "gap": 0.0, "verdict": "agree",
               "decode_speedup": {"median": 1.2, "p90": 1.4}, "output_equals_target_only": 2, "num_requests": 2,
               "target_only_equals_draftsmith": 2,
               "compare": {"ngram-mod": {"decode_speedup": {"median": 0.98, "p90": 1.01}, "acceptance_length": 1.0,
                                         "draft_n_accepted": 0, "draft_n": 3, "output_equals_target_only": 2,
                                         "num_requests": 2}}}
    lines = parity_lines("mt_bench", section)
    assert any("llama.cpp ngram-mod: decode speedup 0.98x median, 1.01x p90" in line and "0/3 drafts" in line
               for line in lines)
