"""Regeneration: local batched generate (left padding) and an OpenAI-compatible HTTP endpoint
(stub server on 127.0.0.1); resumable output with exact accounting after an interruption."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from draftsmith.config import DataConfig, RegenerateConfig
from draftsmith.data import chat, regenerate
from draftsmith.testing import tiny_target
from tests.helpers import reply_json


def _conv(i, turns=1):
    msgs = []
    for t in range(turns):
        msgs += [{"from": "human", "value": f"question {i}.{t}"}, {"from": "gpt", "value": "old answer"}]
    return {"conversations": msgs}


def _data(tmp_path, n=6):
    lines = [json.dumps(_conv(i, turns=1 + i % 2)) for i in range(n)]
    lines.insert(2, "{broken json")  # input line 3: skipped
    lines.insert(4, json.dumps({"text": "a document"}))  # input line 5: skipped (nothing to answer)
    lines.append(json.dumps({"turns": ["prompt only", "and a follow-up"]}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return str(path), n + 3


def _rows(out):
    return [json.loads(line) for line in open(out)]


@pytest.fixture(scope="module")
def target():
    return tiny_target(num_layers=2, hidden=32)


def test_left_padded_batch_equals_one_by_one(target):
    rc = RegenerateConfig(max_new_tokens=6)
    gen = regenerate.LocalGenerator(target, rc, DataConfig())
    hists = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "a much longer question here"}]]
    batched = [r.text for r in gen.generate(hists)]
    single = [gen.generate([h])[0].text for h in hists]
    assert batched == single
    # and equals a plain greedy continuation of the prompt ids
    ids = torch.tensor([chat.encode_prompt(target.tokenizer, hists[1], "auto")])
    out = target.model.generate(input_ids=ids, max_new_tokens=6, do_sample=False, eos_token_id=target.eos_ids,
                                pad_token_id=0)[0, ids.shape[1]:].tolist()
    cut = next((j for j, t in enumerate(out) if t in target.eos_ids), len(out))
    assert batched[1] == target.tokenizer.decode(out[:cut], skip_special_tokens=True).strip()


def test_interrupted_run_resumes_with_exact_accounting(tmp_path, target):
    path, n_input = _data(tmp_path)
    out = str(tmp_path / "out.jsonl")
    rc = RegenerateConfig(max_new_tokens=4, batch_size=2)
    gen = regenerate.LocalGenerator(target, rc, DataConfig())
    first = regenerate.regenerate([path], gen, out, batch_size=2, limit=4, log=lambda *_: None)
    assert (first.input, first.success, first.error, first.skipped) == (4, 3, 0, 1)
    with open(out, "a") as f:
        f.write('{"id": "' + path + ':9", "messa')  # a torn last line (killed mid-write)
    second = regenerate.regenerate([path], gen, out, batch_size=2, log=lambda *_: None)
    assert second.torn_line_repaired
    assert second.input == n_input and second.success + second.error + second.skipped == second.input
    assert (second.success, second.resumed, second.skipped, second.error) == (n_input - 2, 3, 2, 0)
    rows = _rows(out)
    assert len(rows) == len({r["id"] for r in rows}) == n_input - 2
    sidecar = json.loads(open(out + ".summary.json").read())
    assert sidecar["input"] == n_input and sidecar["success"] == n_input - 2 and sidecar["skips"]
    # multi-turn rows keep their structure; the old answers are gone
    two_turn = next(r for r in rows if r["id"] == f"{path}:2")
    assert [m["role"] for m in two_turn["messages"]] == ["user", "assistant", "user", "assistant"]
    assert all(m["content"] != "old answer" for m in two_turn["messages"])
    prompt_row = rows[-1]
    assert [m["role"] for m in prompt_row["messages"]] == ["user", "assistant", "user", "assistant"]
    # a third run does nothing new
    third = regenerate.regenerate([path], gen, out, batch_size=2, log=lambda *_: None)
    assert third.resumed == third.success == n_input - 2 and len(_rows(out)) == n_input - 2


def test_changed_settings_refuse_to_mix(tmp_path, target):
    path, _ = _data(tmp_path)
    out = str(tmp_path / "out.jsonl")
    gen = regenerate.LocalGenerator(target, RegenerateConfig(max_new_tokens=2), DataConfig())
    regenerate.regenerate([path], gen, out, limit=1, log=lambda *_: None)
    other = regenerate.LocalGenerator(target, RegenerateConfig(max_new_tokens=3), DataConfig())
    with pytest.raises(ValueError, match="other settings.*max_new_tokens"):
        regenerate.regenerate([path], other, out, log=lambda *_: None)


class _Stub(BaseHTTPRequestHandler):
    requests: list = []
    fail_on = "question 3."

    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Stub.requests.append((self.path, body, self.headers.get("Authorization")))
        text = body["messages"][-1]["content"] if "messages" in body else body["prompt"]
        if _Stub.fail_on and _Stub.fail_on in text:
            self.send_response(500)
            self.end_headers()
            return
        n_user = sum(m["role"] == "user" for m in body.get("messages", []))
        answer = f"answer to [{text}] after {n_user - 1} turns"
        choice = {"message": {"role": "assistant", "content": answer}} if "messages" in body else {"text": answer}
        reply_json(self, {"choices": [choice]})

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Stub.requests = []
    _Stub.fail_on = "question 3."
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def test_http_endpoint_with_one_failing_request(tmp_path, server, monkeypatch):
    monkeypatch.setenv("STUB_KEY", "sekrit")
    path, n_input = _data(tmp_path)
    out = str(tmp_path / "out.jsonl")
    rc = RegenerateConfig(generator="openai", endpoint=server, model="stub", max_new_tokens=8, batch_size=3,
                          timeout_s=10)
    gen = regenerate.HTTPGenerator(rc, DataConfig(), api_key_env="STUB_KEY")
    s = regenerate.regenerate([path], gen, out, batch_size=3, log=lambda *_: None)
    assert (s.input, s.error, s.skipped) == (n_input, 1, 2) and s.success == n_input - 3
    assert "HTTP 500" in next(iter(s.errors)) and any("error: HTTP 500" in e for e in s.examples)
    assert all(p == "/v1/chat/completions" and auth == "Bearer sekrit" for p, _, auth in _Stub.requests)
    rows = {r["id"]: r for r in _rows(out)}
    # turn 2 was asked with the regenerated turn-1 answer in its history
    two = rows[f"{path}:2"]["messages"]
    assert two[1]["content"] == "answer to [question 1.0] after 0 turns"
    assert two[3]["content"] == "answer to [question 1.1] after 1 turns"
    sent = next(b for _, b, _ in _Stub.requests if b["messages"][-1]["content"] == "question 1.1")
    assert sent["messages"][1]["content"] == two[1]["content"] and sent["max_tokens"] == 8
    # the failed row is retried on rerun once the server recovers
    _Stub.fail_on = None
    again = regenerate.regenerate([path], gen, out, batch_size=3, log=lambda *_: None)
    assert (again.success, again.error, again.resumed) == (n_input - 2, 0, n_input - 3)


def test_http_completions_api_sends_rendered_prompt(tmp_path, server, target):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello"}) + "\n")
    rc = RegenerateConfig(generator="openai", endpoint=server, api="completions", timeout_s=10)
    gen = regenerate.HTTPGenerator(rc, DataConfig(), target.tokenizer)
    s = regenerate.regenerate([str(path)], gen, str(tmp_path / "o.jsonl"), log=lambda *_: None)
    assert s.success == 1
    (p, body, _), = _Stub.requests
    assert p == "/v1/completions" and body["prompt"] == "<s>User: hello\nAssistant:"


def test_unreachable_endpoint_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hello"}) + "\n")
    rc = RegenerateConfig(generator="openai", endpoint="http://127.0.0.1:9/v1", timeout_s=2)
    s = regenerate.regenerate([str(path)], regenerate.HTTPGenerator(rc, DataConfig()), str(tmp_path / "o.jsonl"),
                              log=lambda *_: None)
    assert (s.input, s.error, s.success) == (1, 1, 0) and "request failed" in s.examples[0]
