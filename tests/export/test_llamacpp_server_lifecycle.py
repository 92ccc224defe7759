"""Trust round 4 (issue 34), the llama.cpp side: a server that dies with draftsmith (even on SIGKILL),
bounded and checked replies, a received --engine-export that names files outside itself, and
--num-speculative-tokens 0."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draftsmith.core.errors import UserError
from draftsmith.export.layout import ExportOptions
from draftsmith.export.llamacpp import layouts as llamacpp
from draftsmith.export.llamacpp.tools import MAX_REPLY_BYTES, LlamaCppError, parse_reply
from tests.conftest import REPO

# ---------------------------------------------------------------- replies

GOOD = {"tokens_predicted": 2, "timings": {"predicted_ms": 1.0}, "tokens": [5, 6]}


def test_a_good_reply_is_read():
    assert parse_reply(json.dumps(GOOD).encode()) == GOOD


@pytest.mark.parametrize("body, says", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b" " * (MAX_REPLY_BYTES + 1), "over 16 MiB"),
    (b"\xff\xfe not json", "not JSON"),
    (b"[1, 2]", "JSON list, not an object"),
    (json.dumps({"tokens_predicted": "2", "timings": {}}).encode(), "lacks tokens_predicted/timings"),
    (json.dumps({**GOOD, "tokens": [1, "x"]}).encode(), "not a list of token ids"),
])
def test_a_bad_reply_is_one_line(body, says):
    with pytest.raises(LlamaCppError) as err:
        parse_reply(body)
    assert says in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- the server dies with draftsmith

FAKE_SERVER = textwrap.dedent('''
    import http.server, sys
    port = int(sys.argv[sys.argv.index("--port") + 1])
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"{}")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
''')

PARENT = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    from draftsmith.export.llamacpp.tools import LlamaCppTools, LlamaServer
    tools = LlamaCppTools(server=Path(sys.argv[1]), converter=Path(sys.argv[1]))
    with LlamaServer(tools, Path(sys.argv[2])) as srv:
        print(srv.proc.pid, flush=True)
        time.sleep(120)
''')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"  # a zombie waiting for init to reap it is gone
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's prctl")
def test_sigkill_of_draftsmith_takes_the_server_with_it(tmp_path):
    server = tmp_path / "llama-server"
    server.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    server.chmod(0o755)
    model = tmp_path / "t.gguf"
    model.write_bytes(b"GGUF")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(server), str(model)], stdout=subprocess.PIPE,
                              text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "llama-server outlived the SIGKILLed draftsmith"
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)


# ---------------------------------------------------------------- a received --engine-export

def _export_dir(tmp_path, **side):
    d = tmp_path / "exp"
    d.mkdir()
    (d / "draft-eagle3.gguf").write_bytes(b"GGUF")
    (d / "target.gguf").write_bytes(b"GGUF")
    base = {"format": "llama.cpp", "draft": "draft-eagle3.gguf", "target": "target.gguf", "spec_type": "draft-eagle3",
            "drafter_kind": "eagle3"}
    (d / "draftsmith.json").write_text(json.dumps({**base, **side}))
    return d


def test_a_sound_export_dir_is_read(tmp_path):
    side = llamacpp.read_export_dir(_export_dir(tmp_path))
    assert side["draft"] == str((tmp_path / "exp" / "draft-eagle3.gguf").resolve())


def test_an_absolute_target_gguf_outside_stays(tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"GGUF")
    assert llamacpp.read_export_dir(_export_dir(tmp_path, target=str(outside)))["target"] == str(outside.resolve())


@pytest.mark.parametrize("side, says", [
    ({"draft": "../../etc/passwd"}, "`draft` '../../etc/passwd' points outside the export"),
    ({"draft": "/etc/passwd"}, "points outside the export"),
    ({"target": "../secret.gguf"}, "`target` '../secret.gguf' points outside the export"),
    ({"target": "/etc/passwd"}, "points outside the export"),
    ({"draft": 5}, "`draft` must be a non-empty string"),
    ({"spec_type": None}, "`spec_type` must be a non-empty string"),
    ({"draft": "missing.gguf"}, "is not a regular file"),
    ({"format": ["x"]}, "is not 'llama.cpp'"),
])
def test_a_damaged_export_dir_is_one_line(tmp_path, side, says):
    with pytest.raises(UserError) as err:
        llamacpp.read_export_dir(_export_dir(tmp_path, **side))
    assert says in str(err.value) and "draftsmith.json" in str(err.value)


def test_a_deeply_nested_sidecar_is_one_line(tmp_path):
    d = _export_dir(tmp_path)
    (d / "draftsmith.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="nested too deeply"):
        llamacpp.read_export_dir(d)


# ---------------------------------------------------------------- --num-speculative-tokens 0

def test_zero_speculative_tokens_is_refused_not_replaced(eagle3_loaded):
    layout = llamacpp.layout_of(eagle3_loaded.drafter.kind)
    with pytest.raises(UserError, match=r"--num-speculative-tokens 0: llama.cpp drafts at least 1 token"):
        layout.plan(eagle3_loaded, ExportOptions(num_speculative_tokens=0), Path("."))
