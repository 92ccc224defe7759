"""llama.cpp on this machine: find the binaries `scripts/install_llama_cpp.sh` built, run its own
converter (convert_hf_to_gguf.py), and run `llama-server` on 127.0.0.1 for a bounded number of
requests, always stopping it (a context manager; SIGINT and errors included).

    from draftsmith.export.llamacpp.tools import find_llama_cpp, LlamaServer
    tools = find_llama_cpp()                          # raises LlamaCppMissing with the install command
    with LlamaServer(tools, "target.gguf", draft="draft-eagle3.gguf", spec_type="draft-eagle3", k=3) as srv:
        reply = srv.complete([1, 403, 9], max_tokens=32)   # greedy, EOS ignored
        reply["timings"]["draft_n_accepted"]

Where things are: DRAFTSMITH_LLAMA_SERVER (the binary), else DRAFTSMITH_LLAMA_CPP_DIR, else
${XDG_CACHE_HOME:-~/.cache}/draftsmith/llama.cpp-0.3.36 (the install script's cache), holding
build/bin/llama-server and src/convert_hf_to_gguf.py.

Fields read from the server (llama-cpp-python 0.3.36's vendor/llama.cpp, tools/server/):
  /completion (non-streamed) `tokens` (ids, with "return_tokens": true), `tokens_predicted` (n_decoded:
  the counter the OpenAI endpoints report as usage.completion_tokens, server-task.cpp
  usage_json_oaicompat), `timings.draft_n` / `timings.draft_n_accepted` (server-common.cpp
  server_slot_stats::to_json: drafted and accepted draft tokens of the request; absent when nothing
  was drafted), `timings.predicted_ms` / `predicted_per_second` (decode time, after the first token).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import UserError

LLAMA_CPP_VERSION = "0.3.36"  # the llama-cpp-python sdist whose vendor/llama.cpp is built
INSTALL_COMMAND = "bash scripts/install_llama_cpp.sh"
STARTUP_TIMEOUT_S = 120.0  # model load + warm-up of a small model takes a few seconds
REQUEST_TIMEOUT_S = 300.0  # one completion of at most a few hundred tokens on a small model
MAX_REPLY_BYTES = 16 << 20  # a /completion reply of a few hundred token ids is a few KiB


# --gguf-type of a draft: the converter's own --outtype values, and what llama-quantize writes from the f32 file
CONVERTER_TYPES = ("f32", "f16", "bf16", "q8_0")
QUANTIZE_TYPES = {"q4_0": "Q4_0"}
GGUF_TYPES = CONVERTER_TYPES + tuple(QUANTIZE_TYPES)


class LlamaCppMissing(FileNotFoundError):
    """llama-server or the converter is not installed (the message gives the install command)."""


class LlamaCppError(OSError):
    """llama.cpp ran and failed (a conversion, a server that did not start, a bad reply)."""


@dataclass(frozen=True)
class LlamaCppTools:
    server: Path  # llama-server
    converter: Path  # convert_hf_to_gguf.py (its directory holds conversion/ and gguf-py/)

    @property
    def quantize(self) -> Path:
        """llama-quantize, built next to llama-server by the install script."""
        return self.server.parent / "llama-quantize"

    def version(self) -> str:
        out = subprocess.run([str(self.server), "--version"], capture_output=True, text=True, timeout=30)
        lines = (out.stdout + out.stderr).strip().splitlines()
        return next((line for line in lines if line.startswith("version")), lines[0] if lines else "unknown")


def default_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("DRAFTSMITH_LLAMA_CPP_DIR") or cache / "draftsmith" / f"llama.cpp-{LLAMA_CPP_VERSION}")


def find_llama_cpp() -> LlamaCppTools:
    """The installed llama-server and converter, or LlamaCppMissing naming the install command."""
    root = default_dir()
    server = Path(os.environ.get("DRAFTSMITH_LLAMA_SERVER") or root / "build" / "bin" / "llama-server")
    converter = root / "src" / "convert_hf_to_gguf.py"
    if os.environ.get("DRAFTSMITH_LLAMA_SERVER") and not (root / "src").exists():
        converter = server.resolve().parents[2] / "src" / "convert_hf_to_gguf.py"  # <root>/build/bin/llama-server
    for path, what in ((server, "llama-server"), (converter, "convert_hf_to_gguf.py")):
        if not path.is_file():
            raise LlamaCppMissing(f"{what} not found at {path}: build llama.cpp with `{INSTALL_COMMAND}` (about 21 "
                                  "minutes on 2 cores), or point DRAFTSMITH_LLAMA_CPP_DIR at its cache")
    return LlamaCppTools(server=server, converter=converter)


# ---------------------------------------------------------------- conversion (llama.cpp's own converter)

def convert(tools: LlamaCppTools, model_dir: Path, outfile: Path, outtype: str = "f32",
            target_dir: Path | None = None, timeout_s: float = 900.0) -> Path:
    """Run llama.cpp's convert_hf_to_gguf.py on an HF / speculators directory (through
    draftsmith/export/llamacpp/convert.py, which only adds a pre-tokenizer fallback) -> outfile."""
    cmd = [sys.executable, "-m", "draftsmith.export.llamacpp.convert", str(tools.converter), str(model_dir),
           "--outfile", str(outfile), "--outtype", outtype]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired as exc:
        raise LlamaCppError(f"convert_hf_to_gguf.py on {model_dir} ran past {timeout_s:.0f} s") from exc
    if done.returncode != 0 or not outfile.is_file():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        if "ModuleNotFoundError" in tail:  # the converter's Python packages are missing from this Python
            tail += f" | install what the converter needs into {sys.executable}: pip install 'draftsmith[llamacpp]'"
        raise LlamaCppError(f"llama.cpp's convert_hf_to_gguf.py failed on {model_dir}: {tail}")
    return outfile


def write_draft(tools: LlamaCppTools, model_dir: Path, outfile: Path, gguf_type: str | None,
                target_dir: Path | None = None) -> Path:
    """The draft GGUF in `gguf_type` (None: f32): the converter writes the float and q8_0 types itself;
    q4_0 is llama-quantize's output from the converter's f32 file."""
    gguf_type = gguf_type or "f32"
    if gguf_type in CONVERTER_TYPES:
        return convert(tools, model_dir, outfile, outtype=gguf_type, target_dir=target_dir)
    if gguf_type not in QUANTIZE_TYPES:
        raise UserError(f"--gguf-type {gguf_type!r}: choose one of {', '.join(GGUF_TYPES)}")
    if not tools.quantize.is_file():
        raise LlamaCppMissing(f"llama-quantize not found at {tools.quantize} (--gguf-type {gguf_type}): build it with "
                              f"`{INSTALL_COMMAND}`")
    f32 = outfile.with_name(outfile.stem + ".f32.gguf")
    convert(tools, model_dir, f32, outtype="f32", target_dir=target_dir)
    try:
        done = subprocess.run([str(tools.quantize), str(f32), str(outfile), QUANTIZE_TYPES[gguf_type]],
                              capture_output=True, text=True, timeout=600)
    finally:
        f32.unlink(missing_ok=True)
    if done.returncode != 0 or not outfile.is_file():
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise LlamaCppError(f"llama-quantize {QUANTIZE_TYPES[gguf_type]} failed on {f32.name}: {tail}")
    return outfile


# ---------------------------------------------------------------- the server

def _raise_on_sigterm():
    """In the main thread: make SIGTERM raise SystemExit (so `finally` blocks stop the server); the
    previous handler, to restore, or None where signals cannot be set (other threads)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, handler)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(parent_pid: int):
    """The child's pre-exec step: ask Linux to SIGKILL it when draftsmith dies, by any signal, SIGKILL included
    (prctl PR_SET_PDEATHSIG; the setting survives exec). If draftsmith died before the call, the child exits
    at once. Elsewhere (no prctl) the server is stopped by __exit__ / SIGTERM / SIGINT only."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        prctl = None

    def pre_exec():
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # draftsmith is already gone
            os._exit(1)

    return pre_exec


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """llama-server on 127.0.0.1:<free port> for the `with` block; stopped on exit, errors and SIGINT.

    draft + spec_type (draft-eagle3 | draft-simple | ..., or a chain such as draft-eagle3,ngram-mod) + k
    (--spec-draft-n-max) serve speculatively; draft=None with spec_type (ngram-mod, ...) serves a draftless
    proposer; draft=None and spec_type=None serve the target alone. max_requests bounds what one server answers."""

    def __init__(self, tools: LlamaCppTools, model: Path, draft: Path | None = None, spec_type: str | None = None,
                 k: int | None = None, threads: int = 1, ctx: int = 0, max_requests: int = 1000,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S):
        self.tools, self.model, self.draft, self.spec_type, self.k = tools, Path(model), draft, spec_type, k
        self.threads, self.ctx, self.max_requests, self.startup_timeout_s = threads, ctx, max_requests, startup_timeout_s
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.requests = 0
        self._log = None
        self._sigterm = None

    def command(self) -> list[str]:
        cmd = [str(self.tools.server), "-m", str(self.model), "--host", "127.0.0.1", "--port", str(self.port),
               "-t", str(self.threads), "-tb", str(self.threads), "-c", str(self.ctx), "-np", "1",
               "--no-webui", "--temp", "0", "--no-repack"]
        # --no-repack: the vendored build's CPU weight repacking segfaults while loading the Q4_K_M Gemma-3-270M
        # file on this machine (AVX-512 / AMX CPU; measured 2026-12-01, with and without --no-warmup); without
        # repacking it serves. Both servers of a comparison run the same kernels, so speedups stay like for like.
        if self.draft is not None:
            cmd += ["-md", str(self.draft), "--spec-type", self.spec_type or "draft-simple",
                    "--spec-draft-n-max", str(self.k), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
                    "-td", str(self.threads), "-tbd", str(self.threads)]
        elif self.spec_type is not None:  # a draftless proposer (ngram-*), with llama.cpp's own defaults
            cmd += ["--spec-type", self.spec_type]
        return cmd

    def __enter__(self) -> "LlamaServer":
        self.port = free_port()
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self._sigterm = _raise_on_sigterm()  # SIGTERM unwinds through __exit__ too (SIGINT already does)
        try:
            # its own session / process group: stopping it never touches anything else; and it dies with
            # draftsmith, even on SIGKILL (the parent-death signal, _die_with_parent)
            self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_die_with_parent(os.getpid()))
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 6) -> str:
        if self._log is None:
            return ""
        try:
            text = Path(self._log.name).read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise LlamaCppError(f"llama-server exited with status {self.proc.returncode} while loading "
                                    f"{self.model.name}{' + ' + Path(self.draft).name if self.draft else ''}: "
                                    f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            time.sleep(0.25)
        raise LlamaCppError(f"llama-server did not become healthy within {self.startup_timeout_s:.0f} s: {self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the group started above, nothing else
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
        if getattr(self, "_sigterm", None) is not None:
            signal.signal(signal.SIGTERM, self._sigterm)
            self._sigterm = None
        if self._log is not None:
            self._log.close()
            Path(self._log.name).unlink(missing_ok=True)
            self._log = None

    def complete(self, prompt_ids: list[int], max_tokens: int) -> dict:
        """One greedy, non-streamed /completion of exactly max_tokens tokens (EOS ignored, no prompt
        cache); the reply as JSON."""
        if self.proc is None:
            raise LlamaCppError("llama-server is not running (use LlamaServer in a `with` block)")
        if self.requests >= self.max_requests:
            raise LlamaCppError(f"this llama-server answered its {self.max_requests} requests; start a new one")
        self.requests += 1
        body = {"prompt": [int(t) for t in prompt_ids], "n_predict": int(max_tokens), "temperature": 0.0,
                "top_k": 1, "ignore_eos": True, "cache_prompt": False, "return_tokens": True, "stream": False}
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as r:
                body = r.read(MAX_REPLY_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise LlamaCppError(f"llama-server answered {exc.code}: {exc.read(300)!r}") from exc
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise LlamaCppError(f"llama-server request failed ({exc}): {self.log_tail()}") from exc
        return parse_reply(body)


def parse_reply(body: bytes) -> dict:
    """A /completion reply, checked: at most MAX_REPLY_BYTES of JSON, an object with `tokens_predicted` (an int)
    and `timings` (an object), `tokens` a list of ints when present; else LlamaCppError in one line."""
    if len(body) > MAX_REPLY_BYTES:
        raise LlamaCppError(f"llama-server's reply is over {MAX_REPLY_BYTES >> 20} MiB; not read")
    try:
        reply = json.loads(body)
    except RecursionError:
        raise LlamaCppError("llama-server's reply is nested too deeply to be a /completion reply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise LlamaCppError(f"llama-server's reply is not JSON ({str(exc)[:80]})") from None
    if not isinstance(reply, dict):
        raise LlamaCppError(f"llama-server's reply is a JSON {type(reply).__name__}, not an object")
    if not isinstance(reply.get("tokens_predicted"), int) or not isinstance(reply.get("timings"), dict):
        raise LlamaCppError(f"llama-server reply lacks tokens_predicted/timings: {sorted(reply)[:20]}")
    tokens = reply.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or not all(type(t) is int for t in tokens)):
        raise LlamaCppError("llama-server reply's `tokens` is not a list of token ids")
    return reply
