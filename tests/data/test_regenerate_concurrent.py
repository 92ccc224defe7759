"""Two regenerations into one output file at the same time (issue 44, "Also"): the earlier test server
answered in milliseconds, so two runs never overlapped. Here every answer takes SLOW seconds, the second
run starts while the first is waiting for an answer, and it is refused in one line before it sends a
request or touches the file; the first finishes with every row once. Without the lock both runs wrote
every row (duplicates), and the second cut the first one's unfinished last line as "torn"."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftsmith.config import DataConfig, RegenerateConfig
from draftsmith.core.errors import UserError
from draftsmith.data import regenerate
from tests.helpers import reply_json

SLOW = 0.4  # seconds per answer; 6 rows one at a time keep the first run busy for about 2.4 s
ROWS = 6


class _SlowStub(BaseHTTPRequestHandler):
    requests: list = []
    first = threading.Event()

    def do_POST(self):  # noqa: N802 (http.server API)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _SlowStub.requests.append((time.monotonic(), body["messages"][-1]["content"]))
        _SlowStub.first.set()
        time.sleep(SLOW)
        reply_json(self, {"choices": [{"message": {"role": "assistant", "content": "ok"}}]})

    def log_message(self, *args):
        pass


@pytest.fixture
def slow_server():
    _SlowStub.requests, _SlowStub.first = [], threading.Event()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStub)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()
    srv.server_close()


def _run(path, out, endpoint):
    rc = RegenerateConfig(generator="openai", endpoint=endpoint, model="stub", max_new_tokens=8, batch_size=1,
                          timeout_s=30)
    return regenerate.regenerate([path], regenerate.HTTPGenerator(rc, DataConfig()), out, batch_size=1,
                                 log=lambda *_: None)


def test_a_second_regeneration_into_the_same_file_is_refused_while_the_first_runs(tmp_path, slow_server):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"turns": [f"question {i}"]}) + "\n" for i in range(ROWS)))
    out = str(tmp_path / "out.jsonl")
    first: dict = {}
    thread = threading.Thread(target=lambda: first.update(summary=_run(str(data), out, slow_server)))
    thread.start()
    assert _SlowStub.first.wait(30), "the first regeneration sent no request"
    started = time.monotonic()
    with pytest.raises(UserError, match="regenerate.output .*out.jsonl: another regeneration is writing it now"):
        _run(str(data), out, slow_server)
    refused = time.monotonic()
    sent_while_refusing = [t for t, _ in _SlowStub.requests if started <= t <= refused]
    thread.join(60)
    assert not thread.is_alive()
    # the two truly overlapped: the first was still answering rows after the second was refused
    assert any(t > refused for t, _ in _SlowStub.requests), "the first run had ended before the second started"
    assert len(sent_while_refusing) <= 1  # at most the first run's own next request; the second sent none
    assert len(_SlowStub.requests) == ROWS
    ids = [json.loads(line)["id"] for line in open(out)]
    assert len(ids) == len(set(ids)) == ROWS and first["summary"].success == ROWS
    again = _run(str(data), out, slow_server)  # the lock is gone with the first run: a rerun resumes everything
    assert (again.success, again.resumed) == (ROWS, ROWS) and len(_SlowStub.requests) == ROWS
