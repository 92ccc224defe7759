"""`draftsmith eval` and `draftsmith eval --engine llama.cpp` write the results' drafter identity and config
through the same functions (eval/records.py): for the same checkpoint and flags they agree, except
for what the engine comparison runs differently and says so (one timed request per prompt, EOS ignored).
llama.cpp itself is replaced here by a stand-in that answers each request as a server without drafts would."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from draftsmith.commands import eval_engine
from draftsmith.eval import evaluate as eval_cli
from draftsmith.eval.engine import engine_request
from draftsmith.eval.options import EvalOptions
from tests.export.conftest import make_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = make_checkpoint(tmp_path_factory.mktemp("engine-results"), "eagle3", {"ttt_steps": 2})
    (path.parent / "metrics.jsonl").write_text('{"step": 10, "loss": 1.0}\n')  # the run's training log
    return path


def _no_llama_cpp(monkeypatch):
    """The engine side without llama.cpp: found tools, a served kind, and replies of a server without drafts."""
    from draftsmith.export.llamacpp import layouts as llamacpp
    from draftsmith.export.llamacpp import tools as llamacpp_tools

    tools = SimpleNamespace(server="llama-server", version=lambda: "stand-in")
    monkeypatch.setattr(llamacpp_tools, "find_llama_cpp", lambda: tools)
    monkeypatch.setattr(llamacpp, "refusal", lambda loaded: None)
    monkeypatch.setattr(llamacpp, "check_k", lambda drafter, k: None)
    monkeypatch.setattr(eval_engine, "engine_files", lambda args, loaded, work: {
        "draft": "draft.gguf", "target": "target.gguf", "spec_type": "eagle3"})
    monkeypatch.setattr(eval_engine, "gguf_problems", lambda path, drafter: [])

    def engine_side(tools, files, prompts, k, max_new_tokens, threads, setups=()):
        replies = [engine_request({"tokens_predicted": max_new_tokens, "timings": {}}, len(p)) for p in prompts]
        return replies, [dict(r) for r in replies], {s["name"]: [dict(r) for r in replies] for s in setups}

    monkeypatch.setattr(eval_engine, "engine_side", engine_side)


def test_eval_and_eval_engine_write_the_same_identity_and_config(ckpt, tmp_path, monkeypatch):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello hello hello"}\n')
    flags = dict(path=str(ckpt), workloads=f"jsonl:{prompts}", k=2, max_new_tokens=6, num_prompts=1, device="cpu")
    measured = eval_cli.run(EvalOptions(**flags, out=tmp_path / "eval.json")).results
    _no_llama_cpp(monkeypatch)
    assert eval_engine.main(EvalOptions(**flags, engine="llama.cpp", out=tmp_path / "engine.json")) == 0
    served = json.loads((tmp_path / "engine.json").read_text())
    measured = json.loads(json.dumps(measured))
    assert served["drafter"] == measured["drafter"]
    assert served["drafter"]["training_log"] == str(ckpt.parent / "metrics.jsonl")
    assert served["training_log"] == measured["training_log"]
    config = dict(served["config"])
    assert config.pop("eos_ignored") is True and config.pop("engine")["version"] == "stand-in"
    assert config == {**measured["config"], "repeats": 1, "eos_ids": []}  # the engine's one request, EOS ignored
