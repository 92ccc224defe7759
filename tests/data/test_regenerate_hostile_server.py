"""Issue 22 (trust, round 3), regeneration: the recipe does not choose where DRAFTSMITH_API_KEY goes,
`prepare` honours regenerate.limit, an answer is capped by what was asked for, a hostile server
(nested JSON, a cut body, a slow drip) is an error row, and timeout_s bounds the whole request."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from draftsmith import cli
from draftsmith.config import DataConfig, RegenerateConfig
from draftsmith.data import regenerate

OK = json.dumps({"choices": [{"message": {"role": "assistant", "content": "fine"}}]}).encode()


class _Server(BaseHTTPRequestHandler):
    mode = "ok"
    seen: list = []

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers["Content-Length"]))
        _Server.seen.append(self.headers.get("Authorization"))
        try:
            getattr(self, f"_{_Server.mode}")()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _send(self, body: bytes, length: int | None = None):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def _ok(self):
        self._send(OK)

    def _huge(self):  # 8 MB of answer declared up front
        self._send(json.dumps({"choices": [{"message": {"content": "x" * 8_000_000}}]}).encode())

    def _huge_undeclared(self):  # 8 MB with no Content-Length (read until the server closes)
        self.send_response(200)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b'{"choices": [{"message": {"content": "' + b"x" * 8_000_000 + b'"}}]}')
        self.close_connection = True

    def _nested(self):
        self._send(b"[" * 20_000 + b"]" * 20_000)  # 40 KB: within the size bound

    def _cut(self):  # promises 5,000 bytes, sends 40, hangs up
        self._send(OK[:40], length=5000)
        self.close_connection = True

    def _drip(self):  # a byte every 0.25 s: each read is quick, the whole answer takes 80 s
        body = b" " * 250 + OK  # JSON may start with white space
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for i in range(len(body)):
            self.wfile.write(body[i:i + 1])
            self.wfile.flush()
            time.sleep(0.25)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    _Server.mode, _Server.seen = "ok", []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Server)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _ask(endpoint, log=None, api_key_env=None, **rcfg):
    cfg = RegenerateConfig(generator="openai", endpoint=endpoint, **{"timeout_s": 10, "max_new_tokens": 128, **rcfg})
    gen = regenerate.HTTPGenerator(cfg, DataConfig(), api_key_env=api_key_env, log=(log if log is not None else [] ).append)
    return gen.generate([[{"role": "user", "content": "hi"}]])[0]


# --------------------------------------------------------------------------- finding 3: where the key goes


def test_draftsmith_api_key_goes_only_to_the_endpoint_configured_outside_the_recipe(server, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_API_KEY", "secret")
    monkeypatch.delenv("DRAFTSMITH_API_ENDPOINT", raising=False)
    log: list[str] = []
    assert _ask(server, log).status == "ok"  # a recipe naming any endpoint: the key is withheld
    monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", "https://api.example.com/v1")
    _ask(server, log)  # another endpoint than the configured one: withheld
    monkeypatch.setenv("DRAFTSMITH_API_ENDPOINT", server.replace("/v1", "/other"))
    _ask(server, log)  # the same scheme, host and port: sent
    monkeypatch.setenv("MY_KEY", "chosen")
    _ask(server, log, api_key_env="MY_KEY")  # named on the command line: sent to the recipe's endpoint
    assert _Server.seen == [None, None, "Bearer secret", "Bearer chosen"]
    assert "DRAFTSMITH_API_KEY is set but NOT sent" in log[0] and "DRAFTSMITH_API_ENDPOINT is not set" in log[0]
    assert "not sent" in log[1] and "is not $DRAFTSMITH_API_ENDPOINT (https://api.example.com/v1)" in log[2]
    host = server.split("/")[2]
    assert log[-2].endswith(f"sent to {host})") and "API key: $MY_KEY (--api-key-env)" in log[-1]
    assert not any("secret" in line or "chosen" in line for line in log)


def test_train_and_prepare_send_no_key_to_a_recipe_endpoint(server, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("DRAFTSMITH_API_KEY", "secret")
    monkeypatch.delenv("DRAFTSMITH_API_ENDPOINT", raising=False)
    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps({"prompt": "hello"}) + "\n")
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"path": [str(data)]}, "regenerate": {
        "generator": "openai", "endpoint": server, "output": str(tmp_path / "out.jsonl")}}))
    assert cli.main(["prepare", str(recipe)]) == 0
    assert _Server.seen == [None]
    assert "NOT sent" in capsys.readouterr().out


# --------------------------------------------------------------------------- finding 11: prepare honours limit


def test_prepare_honours_regenerate_limit(server, tmp_path):
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"path": [str(data)]}, "regenerate": {
        "generator": "openai", "endpoint": server, "output": str(out), "limit": 2}}))
    assert cli.main(["prepare", str(recipe)]) == 0
    assert len(_Server.seen) == 2 and len(out.read_text().splitlines()) == 2
    assert cli.main(["prepare", str(recipe), "--limit", "3"]) == 0  # the flag wins over the recipe
    assert len(_Server.seen) == 3 and len(out.read_text().splitlines()) == 3
    assert cli.main(["prepare", str(recipe), "--limit", "0"]) == 2


# --------------------------------------------------------------------------- finding 12: bounded answers


@pytest.mark.parametrize("mode", ["huge", "huge_undeclared"])
def test_an_answer_larger_than_asked_for_is_an_error_row(server, mode):
    _Server.mode = mode
    start = time.monotonic()
    res = _ask(server, max_new_tokens=128)
    assert res.status == "error" and "larger than" in res.reason, res
    limit = 128 * regenerate.MAX_BYTES_PER_TOKEN + regenerate.MAX_RESPONSE_OVERHEAD
    assert f"{limit:,} bytes" in res.reason and time.monotonic() - start < 5
    _Server.mode = "ok"
    assert _ask(server, max_new_tokens=128).status == "ok"


@pytest.mark.parametrize("mode, reason", [("nested", "bad response: JSON nested too deeply"),
                                          ("cut", "bad response: cut short: 40 of the 5,000 bytes announced")])
def test_a_hostile_server_is_one_error_row(server, mode, reason):
    _Server.mode = mode
    res = _ask(server)
    assert res.status == "error" and res.reason.startswith(reason), res
    assert "\n" not in res.reason and len(res.reason) < 300


def test_timeout_s_bounds_the_whole_request_not_each_read(server):
    _Server.mode = "drip"  # every read returns within 0.25 s; the answer would take 80 s
    start = time.monotonic()
    res = _ask(server, timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert res.status == "error" and "timeout" in res.reason and "regenerate.timeout_s=1s" in res.reason, res
    assert elapsed < 20, elapsed  # ~1 s; a wide margin for a busy machine, and far below the answer's 80 s


def test_a_hostile_server_counts_as_failed_rows_in_prepare(server, tmp_path, capsys):
    _Server.mode = "nested"
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(2)))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"path": [str(data)]}, "regenerate": {
        "generator": "openai", "endpoint": server, "output": str(tmp_path / "o.jsonl")}}))
    assert cli.main(["prepare", str(recipe)]) == 1  # prepare's contract: 1 when no row was answered
    captured = capsys.readouterr()
    assert "error      2  bad response" in captured.out and "Traceback" not in captured.err
