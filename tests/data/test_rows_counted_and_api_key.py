"""Issue 11 (lose nothing, secrets): every row is read and counted, regeneration never mixes
settings or collides ids, `prepare` fails when nothing succeeded, and the regeneration server's
API key comes only from the command line (never from a recipe), is never sent over plain http
to another host, and the endpoint is printed before the first request."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from draftsmith import cli, config
from draftsmith.config import DataConfig, RegenerateConfig
from draftsmith.data import formats, regenerate
from draftsmith.data.dataset import build_dataset
from draftsmith.testing import byte_tokenizer
from tests.helpers import reply_json

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}]}


def _reasons(path, fmt="auto"):
    out = [(raw.line, err.reason if err else "ok") for raw, _row, err in formats.iter_rows([str(path)], fmt)]
    return out


def test_jsonl_whose_first_line_is_an_array_counts_every_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps([CHAT, CHAT]) + "\n" + json.dumps(CHAT) + "\n" + json.dumps(CHAT) + "\n")
    _, _, report = build_dataset(DataConfig(path=[str(path)]), byte_tokenizer())
    assert (report.read, report.used, dict(report.skipped)) == (3, 2, {formats.NOT_OBJECT: 1})
    whole = tmp_path / "list.json"  # a file that IS one JSON array is still read as a list
    whole.write_text(json.dumps([CHAT, CHAT, CHAT], indent=1))
    assert [r for _, r in _reasons(whole)] == ["ok", "ok", "ok"]


def test_bad_rows_are_skipped_and_counted_not_fatal(tmp_path):
    path = tmp_path / "d.jsonl"
    alpaca_bad = {"instruction": "q", "output": "a", "history": 5}
    deep = "[" * 200_000 + "]" * 200_000
    path.write_bytes(b"\n".join([json.dumps(CHAT).encode(), json.dumps(alpaca_bad).encode(), deep.encode(),
                                 b'{"text": "caf\xe9 au lait"}', json.dumps(CHAT).encode()]) + b"\n")
    assert _reasons(path) == [(1, "ok"), (2, formats.BAD_VALUE), (3, formats.BAD_JSON), (4, formats.NOT_UTF8),
                              (5, "ok")]
    _, _, report = build_dataset(DataConfig(path=[str(path)]), byte_tokenizer())
    assert (report.read, report.used, sum(report.skipped.values())) == (5, 2, 3)
    txt = tmp_path / "doc.txt"
    txt.write_bytes(b"ok text \xff\xfe")
    assert _reasons(txt) == [(1, formats.NOT_UTF8)]


class _Answer:
    """A generator stand-in: answers every prompt; `fail_after` batches then raises (a kill)."""

    def __init__(self, max_new_tokens=8, fail_after=None):
        self.max_new_tokens, self.fail_after, self.calls, self.asked = max_new_tokens, fail_after, 0, []

    def settings(self):
        return {"generator": "stub", "max_new_tokens": self.max_new_tokens}

    def generate(self, histories):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt
        self.calls += 1
        self.asked += [h[-1]["content"] for h in histories]
        return [regenerate.Result("ok", f"answer {h[-1]['content']}") for h in histories]


def _prompts(path, n, tag=""):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"prompt": f"q{tag}{i}"}) + "\n" for i in range(n)))
    return str(path)


def test_rerun_of_an_interrupted_first_regeneration_with_other_settings_is_refused(tmp_path):
    data, out = _prompts(tmp_path / "p.jsonl", 6), str(tmp_path / "out.jsonl")
    with pytest.raises(KeyboardInterrupt):  # killed during the FIRST run, after one batch
        regenerate.regenerate([data], _Answer(fail_after=1), out, batch_size=2, log=lambda *_: None)
    assert len(open(out).readlines()) == 2
    with pytest.raises(ValueError, match="other settings.*max_new_tokens"):
        regenerate.regenerate([data], _Answer(max_new_tokens=99), out, batch_size=2, log=lambda *_: None)
    done = regenerate.regenerate([data], _Answer(), out, batch_size=2, log=lambda *_: None)  # same settings: resumes
    assert (done.success, done.resumed) == (6, 2)


def test_row_ids_are_unique_over_files_of_the_same_name(tmp_path):
    a, b = _prompts(tmp_path / "a" / "train.jsonl", 2, "a"), _prompts(tmp_path / "b" / "train.jsonl", 2, "b")
    gen, out = _Answer(), str(tmp_path / "out.jsonl")
    s = regenerate.regenerate([a, b], gen, out, log=lambda *_: None)
    rows = [json.loads(line) for line in open(out)]
    assert (s.success, s.resumed) == (4, 0) and len({r["id"] for r in rows}) == 4
    assert sorted(gen.asked) == ["qa0", "qa1", "qb0", "qb1"]
    twice = regenerate.regenerate([a, a], _Answer(), str(tmp_path / "o2.jsonl"), log=lambda *_: None)
    assert (twice.success, twice.skipped) == (2, 2)  # the same file listed twice: counted, not answered twice


def test_prepare_exits_non_zero_when_no_row_succeeded(tmp_path, capsys):
    data = _prompts(tmp_path / "p.jsonl", 2)
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "data": {"path": [data]},
        "regenerate": {"generator": "openai", "endpoint": "http://127.0.0.1:9/v1", "timeout_s": 2,
                       "output": str(tmp_path / "regen.jsonl")}}))
    assert cli.main(["prepare", str(recipe)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["draftsmith prepare: no row was regenerated (2 read: 2 failed, 0 skipped); see the reasons above"]


# --------------------------------------------------------------------------- secrets


def test_a_recipe_cannot_name_the_api_key_variable():
    with pytest.raises(config.ConfigError, match="regenerate.api_key_env: .*--api-key-env NAME"):
        config.from_dict({"regenerate": {"generator": "openai", "endpoint": "https://x/v1", "api_key_env": "HOME"}})


class _Stub(BaseHTTPRequestHandler):
    seen: list = []
    log_lines: list = []

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        _Stub.seen.append((self.headers.get("Authorization"), len(_Stub.log_lines)))
        if self.path.startswith("/redirect"):  # e.g. to plain http on another host
            self.send_response(302)
            self.send_header("Location", "/v1/chat/completions")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        reply_json(self, {"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def stub():
    _Stub.seen, _Stub.log_lines = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _ask(endpoint, api_key_env=None):
    gen = regenerate.HTTPGenerator(RegenerateConfig(generator="openai", endpoint=endpoint, timeout_s=10), DataConfig(),
                                   api_key_env=api_key_env, log=_Stub.log_lines.append)
    return gen.generate([[{"role": "user", "content": "hi"}]])


def test_the_key_comes_only_from_the_command_line_or_draftsmith_api_key(stub, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "not-sent")
    monkeypatch.delenv("DRAFTSMITH_API_KEY", raising=False)
    _ask(stub)
    monkeypatch.setenv("DRAFTSMITH_API_KEY", "fixed")
    monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", stub)  # the user's own endpoint for that key (issue 22)
    _ask(stub)
    monkeypatch.setenv("MY_KEY", "chosen")
    _ask(stub, api_key_env="MY_KEY")
    assert [auth for auth, _ in _Stub.seen] == [None, "Bearer fixed", "Bearer chosen"]
    # the endpoint is printed before the first request (one line per generator, before its request)
    assert [n for _, n in _Stub.seen] == [1, 2, 3] and all(stub in line for line in _Stub.log_lines)
    assert "API key: $MY_KEY (--api-key-env)" in _Stub.log_lines[-1] and "chosen" not in _Stub.log_lines[-1]
    with pytest.raises(ValueError, match="--api-key-env UNSET_VAR: the environment variable UNSET_VAR is not set"):
        _ask(stub, api_key_env="UNSET_VAR")


def test_redirects_are_not_followed_with_the_key(stub, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_API_KEY", "secret")
    monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", stub)
    (res,) = _ask(stub.replace("/v1", "/redirect"))
    assert res.status == "error" and "HTTP 302" in res.reason
    assert len(_Stub.seen) == 1  # the redirect target never saw the key


def test_the_key_never_goes_over_plain_http_to_another_host(monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_API_KEY", "secret")
    for url in ("http://example.com/v1", "http://10.0.0.1:8000/v1"):
        monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", url)
        with pytest.raises(ValueError, match="refusing to send the API key over plain http"):
            regenerate.HTTPGenerator(RegenerateConfig(generator="openai", endpoint=url), DataConfig())
    for url in ("https://example.com/v1", "http://localhost:8000/v1", "http://[::1]:8000/v1"):
        monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", url)
        assert regenerate.HTTPGenerator(RegenerateConfig(generator="openai", endpoint=url), DataConfig()).key == "secret"
        regenerate.HTTPGenerator(RegenerateConfig(generator="openai", endpoint=url), DataConfig())
    monkeypatch.delenv("DRAFTSMITH_API_KEY")
    regenerate.HTTPGenerator(RegenerateConfig(generator="openai", endpoint="http://example.com/v1"), DataConfig())


def test_torchrun_relaunch_keeps_the_command_line_only_flags():
    from draftsmith.train import launch

    cmd = launch.torchrun_command(2, "r.yaml", ["train.backend=ddp"], overwrite=True, api_key_env="MY_KEY")
    assert cmd[-5:] == ["r.yaml", "--overwrite", "--api-key-env", "MY_KEY", "train.backend=ddp"]
