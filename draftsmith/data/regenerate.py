"""Regenerate the assistant turns of a data set with the target itself (self-distillation, as
EAGLE and Medusa-2 recommend): the drafter then learns the target's own distribution.

    summary = regenerate(cfg.data.path, LocalGenerator(target, cfg.regenerate, cfg.data), cfg.regenerate.output)

Output: JSONL rows {"id", "source", "messages": [...]} (OpenAI form, read back by data.format auto).
Resumable: each finished row is appended and flushed; a rerun skips ids already in the file and
redoes a torn last line. The settings (generator, target, max_new_tokens, temperature, ...) are
written to OUTPUT.summary.json BEFORE the first batch, so a rerun with other settings is refused
even after an interrupted first run. Row ids are "path:line" (unique over all inputs).
Accounting: success + error + skipped == input, printed and stored in OUTPUT.summary.json.
Rows that failed (error) are not written, so a rerun retries them.

The openai generator's API key is never chosen by a recipe (which names the endpoint): it is sent
only when the command line names its variable (--api-key-env NAME), or, for the fixed variable
DRAFTSMITH_API_KEY, when the endpoint is the one the user configured outside the recipe in
DRAFTSMITH_API_ENDPOINT (same scheme, host and port). It never goes over plain http except to
localhost, and where it goes (or that none is sent) is printed before the first request.
Answers are bounded: a response body may hold at most max_new_tokens * MAX_BYTES_PER_TOKEN bytes
(plus MAX_RESPONSE_OVERHEAD), and regenerate.timeout_s bounds each whole request (connect, headers
and body), not each socket read; a response past either bound, cut short, or nested too deeply is
an error row (retried on a rerun).
Multi-turn: each user turn followed by an assistant turn (or ending the row) is answered in
order, given the regenerated history; the original assistant turns are dropped.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.files import check_output_file, write_text_atomically
from draftsmith.core.urls import redacted
from draftsmith.data import chat, formats

MAX_EXAMPLES = 10
API_KEY_VARIABLE = "DRAFTSMITH_API_KEY"  # the one variable read without --api-key-env
API_ENDPOINT_VARIABLE = "DRAFTSMITH_API_ENDPOINT"  # the endpoint DRAFTSMITH_API_KEY belongs to
MAX_BYTES_PER_TOKEN = 64  # a token's text, JSON-escaped (\uXXXX per character), with room for fields
MAX_RESPONSE_OVERHEAD = 64 * 1024  # the JSON envelope (ids, usage, ...)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Bumped when the row-id scheme changes, so an output written with other ids is not resumed into.
ROW_IDS = "path:line"


@dataclass
class Result:
    """One generation: status "ok" (text), "error" (retry on rerun) or "skip" (never possible)."""

    status: str
    text: str = ""
    reason: str = ""


@dataclass
class RegenSummary:
    output: str
    settings: dict
    input: int = 0
    success: int = 0  # rows in the output, including `resumed` ones from earlier runs
    resumed: int = 0
    error: int = 0
    skipped: int = 0
    empty_answers: int = 0
    errors: Counter = field(default_factory=Counter)
    skips: Counter = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    torn_line_repaired: bool = False
    elapsed_s: float = 0.0

    def note(self, kind: str, source: str, reason: str) -> None:
        (self.errors if kind == "error" else self.skips)[reason.split(":")[0]] += 1
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append(f"{source}: {kind}: {reason}")

    def to_dict(self) -> dict:
        return {**asdict(self), "errors": dict(self.errors), "skips": dict(self.skips)}

    def summary(self) -> str:
        ok = self.success + self.error + self.skipped == self.input
        lines = [f"regenerate -> {self.output}",
                 f"  input {self.input} = success {self.success} (resumed {self.resumed}) + error {self.error} "
                 f"+ skipped {self.skipped} [{'ok' if ok else 'MISMATCH'}]; empty answers {self.empty_answers}; "
                 f"{self.elapsed_s:.1f}s"]
        lines += [f"    error {n:>6}  {r}" for r, n in self.errors.most_common()]
        lines += [f"    skipped {n:>4}  {r}" for r, n in self.skips.most_common()]
        lines += [f"    {e}" for e in self.examples]
        return "\n".join(lines)


# --------------------------------------------------------------------------- generators


class LocalGenerator:
    """Batched HF generate on the frozen target: left padding, greedy or sampled, stop on eos_ids."""

    def __init__(self, target, rcfg, data_cfg):
        self.target, self.rcfg = target, rcfg
        self.mode, self.max_prompt = data_cfg.chat_template, data_cfg.max_length
        tok = target.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else target.eos_ids[0]
        self.calls = 0

    def settings(self) -> dict:
        return {"generator": "local", "target": self.target.name, "fingerprint": self.target.fingerprint,
                "chat_template": chat.renderer_name(self.target.tokenizer, self.mode),
                "max_new_tokens": self.rcfg.max_new_tokens, "temperature": self.rcfg.temperature,
                "top_p": self.rcfg.top_p, "seed": self.rcfg.seed}

    @torch.no_grad()
    def generate(self, histories: list[list[dict]]) -> list[Result]:
        tok = self.target.tokenizer
        prompts = [chat.encode_prompt(tok, h, self.mode) for h in histories]
        results = [Result("skip", reason=f"prompt too long: {len(p)} tokens > data.max_length {self.max_prompt}")
                   if len(p) > self.max_prompt else None for p in prompts]
        todo = [i for i, r in enumerate(results) if r is None]
        if not todo:
            return results
        width = max(len(prompts[i]) for i in todo)
        ids = torch.full((len(todo), width), self.pad_id, dtype=torch.long)  # [b, s] left padded
        attn = torch.zeros((len(todo), width), dtype=torch.long)
        for row, i in enumerate(todo):
            ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
            attn[row, width - len(prompts[i]):] = 1
        sampling = {"do_sample": False}
        if self.rcfg.temperature > 0:
            torch.manual_seed(self.rcfg.seed + self.calls)
            sampling = {"do_sample": True, "temperature": self.rcfg.temperature, "top_p": self.rcfg.top_p}
        self.calls += 1
        device = self.target.device
        out = self.target.model.generate(
            input_ids=ids.to(device), attention_mask=attn.to(device), max_new_tokens=self.rcfg.max_new_tokens,
            eos_token_id=self.target.eos_ids, pad_token_id=self.pad_id, **sampling,
        )  # [b, width + new]
        stops = set(self.target.eos_ids)
        for row, i in enumerate(todo):
            new = out[row, width:].tolist()
            cut = next((j for j, t in enumerate(new) if t in stops), len(new))
            results[i] = Result("ok", tok.decode(new[:cut], skip_special_tokens=True).strip())
        return results


class AnswersGenerator:
    """Answers kept in a file (regenerate.answers_file, data/shipped_answers.py): no model runs; a prompt the
    file does not hold is an error row (counted; a rerun with another generator answers it)."""

    def __init__(self, rcfg):
        from draftsmith.data.shipped_answers import AnswersFile

        self.file = AnswersFile(rcfg)

    def settings(self) -> dict:
        return self.file.settings()

    def generate(self, histories: list[list[dict]]) -> list[Result]:
        answers = [self.file.lookup(h) for h in histories]
        return [Result("ok", a) if a is not None else Result("error", reason=self.file.missing) for a in answers]


def _origin(url: str) -> tuple:
    u = urllib.parse.urlparse(url)
    return u.scheme, (u.hostname or "").lower(), u.port or {"http": 80, "https": 443}.get(u.scheme)


def api_key(api_key_env: Optional[str] = None, endpoint: Optional[str] = None,
            log=print) -> tuple[Optional[str], str]:
    """-> (key or None, where it came from). The recipe names the endpoint, so a key goes there only
    when the user chose it outside the recipe: --api-key-env NAME, or DRAFTSMITH_API_KEY with the
    endpoint equal (scheme, host, port) to DRAFTSMITH_API_ENDPOINT."""
    if api_key_env:
        if not os.environ.get(api_key_env):
            raise UserError(f"--api-key-env {api_key_env}: the environment variable {api_key_env} is not set "
                             "or empty; export it, or drop --api-key-env to send no key")
        return os.environ[api_key_env], f"${api_key_env} (--api-key-env)"
    if not os.environ.get(API_KEY_VARIABLE):
        return None, "none"
    configured = os.environ.get(API_ENDPOINT_VARIABLE, "")
    if endpoint and configured and _origin(configured) == _origin(endpoint):
        return os.environ[API_KEY_VARIABLE], f"${API_KEY_VARIABLE} (the endpoint is ${API_ENDPOINT_VARIABLE})"
    why = (f"${API_ENDPOINT_VARIABLE} is not set" if not configured
           else f"regenerate.endpoint is not ${API_ENDPOINT_VARIABLE} ({redacted(configured)})")
    log(f"regenerate: ${API_KEY_VARIABLE} is set but NOT sent to {redacted(endpoint)}: {why}. A recipe chooses the endpoint, so "
        f"the key goes only to ${API_ENDPOINT_VARIABLE}, or pass --api-key-env {API_KEY_VARIABLE} to send it there")
    return None, f"none (${API_KEY_VARIABLE} withheld: {why})"


def check_endpoint(endpoint: str, has_key: bool) -> None:
    """http(s) only; an API key never travels over plain http except to this machine."""
    url = urllib.parse.urlparse(endpoint)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise UserError(f"regenerate.endpoint {redacted(endpoint)!r} is not an http(s) URL; e.g. http://127.0.0.1:8000/v1")
    if has_key and url.scheme == "http" and url.hostname not in LOCAL_HOSTS:
        raise UserError(f"regenerate.endpoint {redacted(endpoint)!r}: refusing to send the API key over plain http to "
                         f"{url.hostname}; use https://, or a server on localhost")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed (urllib would resend the Authorization header to the new URL,
    plain http or another host included); a 3xx answer becomes an HTTP error."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class _Watch:
    """One request's deadline: at timeout_s its connections are shut down, which ends any read
    blocked in them (urllib's own timeout applies to each socket read, so a server sending one
    byte every few seconds could otherwise hold a request for ever)."""

    def __init__(self, timeout_s: float):
        self.sockets: list = []  # recorded at connect: urllib drops the connection's own reference
        self.expired = False
        self._timer = threading.Timer(timeout_s, self._expire)
        self._timer.daemon = True

    def _expire(self) -> None:
        self.expired = True
        for sock in self.sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()


class _WatchedHTTP(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    """http(s) handler whose connections register with the request's _Watch (req.watch)."""

    def _open_watched(self, connection_class, req, **kwargs):
        def make(host, **kw):
            conn = connection_class(host, **kw)
            connect = conn.connect

            def connect_and_record():
                connect()
                req.watch.sockets.append(conn.sock)

            conn.connect = connect_and_record
            return conn

        return self.do_open(make, req, **kwargs)

    def http_open(self, req):
        return self._open_watched(http.client.HTTPConnection, req)

    def https_open(self, req):
        return self._open_watched(http.client.HTTPSConnection, req, context=ssl.create_default_context())


_OPENER = urllib.request.build_opener(_NoRedirect, _WatchedHTTP)


class BadResponse(UserError):
    """A response past a bound (size, time), cut short, or not the JSON asked for."""


def read_bounded(resp, limit: int, watch: _Watch) -> bytes:
    """The body, at most `limit` bytes; refused early when Content-Length says more."""
    declared = resp.headers.get("Content-Length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BadResponse(f"response of {int(declared):,} bytes is larger than {limit:,} bytes "
                          "(max_new_tokens x MAX_BYTES_PER_TOKEN + overhead)")
    chunks, size = [], 0
    while True:
        chunk = resp.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise BadResponse(f"response larger than {limit:,} bytes (max_new_tokens x MAX_BYTES_PER_TOKEN + overhead)")
    if declared and declared.isdigit() and size < int(declared):
        raise BadResponse(f"cut short: {size:,} of the {int(declared):,} bytes announced")
    return b"".join(chunks)


class HTTPGenerator:
    """An OpenAI-compatible server: {endpoint}/chat/completions, or /completions with the
    prompt rendered by draftsmith (regenerate.api = completions; needs the target tokenizer).

    api_key_env: the variable named by --api-key-env (None: DRAFTSMITH_API_KEY when set, else no key)."""

    def __init__(self, rcfg, data_cfg, tokenizer=None, api_key_env: Optional[str] = None, log=print):
        if not rcfg.endpoint:
            raise UserError("regenerate.endpoint is required for regenerate.generator=openai "
                             "(e.g. regenerate.endpoint=http://127.0.0.1:8000/v1)")
        if rcfg.api == "completions" and tokenizer is None:
            raise UserError("regenerate.api=completions renders prompts locally and needs the target tokenizer")
        self.rcfg, self.mode, self.tokenizer = rcfg, data_cfg.chat_template, tokenizer
        self.key, self.key_source = api_key(api_key_env, rcfg.endpoint, log)  # local servers need none
        check_endpoint(rcfg.endpoint, self.key is not None)
        self.log, self.announced = log, False

    def settings(self) -> dict:
        r = self.rcfg
        return {"generator": "openai", "endpoint": r.endpoint, "model": r.model, "api": r.api,
                "max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p}

    def _post(self, path: str, payload: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        url = self.rcfg.endpoint.rstrip("/") + path
        req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
        limit = self.rcfg.max_new_tokens * MAX_BYTES_PER_TOKEN + MAX_RESPONSE_OVERHEAD
        with _Watch(self.rcfg.timeout_s) as watch:
            req.watch = watch
            try:
                with _OPENER.open(req, timeout=self.rcfg.timeout_s) as resp:
                    body = read_bounded(resp, limit, watch)
            except (OSError, http.client.HTTPException, BadResponse) as exc:  # a shut-down socket reads as cut short
                if watch.expired:
                    raise TimeoutError(f"no complete answer within regenerate.timeout_s={self.rcfg.timeout_s:g}s") from exc
                raise
            if watch.expired:
                raise TimeoutError(f"no complete answer within regenerate.timeout_s={self.rcfg.timeout_s:g}s")
        try:
            return json.loads(body.decode("utf-8"))
        except RecursionError:
            raise BadResponse("JSON nested too deeply") from None

    def _one(self, history: list[dict]) -> Result:
        r = self.rcfg
        payload = {"model": r.model, "max_tokens": r.max_new_tokens, "temperature": r.temperature, "top_p": r.top_p}
        try:
            if r.api == "completions":
                body = self._post("/completions", {**payload, "prompt": chat.prompt_text(self.tokenizer, history, self.mode)})
                text = body["choices"][0]["text"]
            else:
                body = self._post("/chat/completions", {**payload, "messages": history})
                text = body["choices"][0]["message"]["content"]
        except urllib.error.HTTPError as exc:
            return Result("error", reason=f"HTTP {exc.code}: {' '.join(str(exc.reason).split())[:120]}")
        except BadResponse as exc:
            return Result("error", reason=f"bad response: {exc}")
        except TimeoutError as exc:
            return Result("error", reason=f"timeout: {exc}")
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:  # refused, reset, cut short
            return Result("error", reason=f"request failed: {type(exc).__name__} {' '.join(str(exc).split())[:160]}")
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, IndexError, TypeError) as exc:
            return Result("error", reason=f"bad response: {type(exc).__name__} {' '.join(str(exc).split())[:160]}")
        if not isinstance(text, str):
            return Result("error", reason="bad response: content is not a string")
        return Result("ok", text.strip())

    def generate(self, histories: list[list[dict]]) -> list[Result]:
        if not self.announced:  # say where the data (and key) go before the first request
            where = f"sent to {urllib.parse.urlparse(self.rcfg.endpoint).netloc}" if self.key else "not sent"
            self.log(f"regenerate: sending prompts to {redacted(self.rcfg.endpoint)} (model {self.rcfg.model}, "
                     f"API key: {self.key_source}, {where})")
            self.announced = True
        with ThreadPoolExecutor(max_workers=max(1, min(self.rcfg.batch_size, len(histories)))) as pool:
            return list(pool.map(self._one, histories))


# --------------------------------------------------------------------------- resumable output


def load_done(output: Path) -> tuple[set[str], bool]:
    """Ids already written; a torn or unparsable LAST line is cut off (it is redone)."""
    if not output.exists():
        return set(), False
    data = output.read_bytes()
    lines = data.split(b"\n")
    complete, keep = lines[:-1], len(data) - len(lines[-1])  # lines[-1] is b"" when data ends with a newline
    torn = keep < len(data)
    if complete and not torn:
        try:
            json.loads(complete[-1])
        except (json.JSONDecodeError, RecursionError):  # a complete but unparsable last line: redo it too
            torn, keep, complete = True, keep - len(complete[-1]) - 1, complete[:-1]
    done: set[str] = set()
    for n, line in enumerate(complete, start=1):
        try:
            done.add(json.loads(line)["id"])
        except (json.JSONDecodeError, KeyError, TypeError, RecursionError) as exc:
            reason = " ".join(str(exc).split())[:80] or "nested too deeply"
            raise UserError(f"{output}:{n}: not a regeneration row ({reason}); the file is damaged in the middle: "
                             "delete it (or set regenerate.output to a new path) and rerun") from exc
    if torn:
        with open(output, "r+b") as f:
            f.truncate(keep)
    return done, torn


def _check_settings(sidecar: Path, settings: dict, output: Path) -> None:
    if not output.exists() or output.stat().st_size == 0:
        return
    if not sidecar.exists():
        raise UserError(f"{output} exists but {sidecar.name} (the settings it was written with) does not, so "
                         "resuming could mix answers of other settings: delete it or set regenerate.output to a new path")
    try:
        old = json.loads(sidecar.read_text()).get("settings", {})
    except (json.JSONDecodeError, AttributeError) as exc:
        raise UserError(f"{sidecar} is damaged ({exc}); delete {output} and {sidecar.name}, "
                         "or set regenerate.output to a new path") from None
    diff = {k: (old.get(k), v) for k, v in settings.items() if old.get(k) != v}
    if diff:
        raise UserError(f"{output} was written with other settings {diff} (old, new); resuming would mix them: "
                         "delete it or set regenerate.output to a new path")


# --------------------------------------------------------------------------- driver


def _answer_points(messages: list[dict]) -> list[dict]:
    """Drop assistant turns; mark each user turn that gets an answer: in a prompt row (no
    assistant turn, e.g. MT-bench "turns") every user turn; in a conversation each user turn
    not followed by another user turn."""
    prompt_row = not any(m["role"] == "assistant" for m in messages)
    out = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            continue
        nxt = messages[i + 1]["role"] if i + 1 < len(messages) else None
        out.append({**m, "_answer": m["role"] == "user" and (prompt_row or nxt != "user")})
    return out


def _run_batch(batch: list[formats.Row], generator, summary: RegenSummary, sink) -> None:
    """Answer every marked user turn of each row in order, one generator call per turn index."""
    plans = [_answer_points(row.messages) for row in batch]
    histories: list[list[dict]] = [[] for _ in batch]
    cursors = [0] * len(batch)
    failed: dict[int, Result] = {}
    while True:
        ask = []
        for b, plan in enumerate(plans):
            while b not in failed and cursors[b] < len(plan):
                m = plan[cursors[b]]
                cursors[b] += 1
                histories[b].append({"role": m["role"], "content": m["content"]})
                if m["_answer"]:
                    ask.append(b)
                    break
        if not ask:
            break
        for b, res in zip(ask, generator.generate([histories[b] for b in ask])):
            if res.status != "ok":
                failed[b] = res
            else:
                summary.empty_answers += int(not res.text)
                histories[b].append({"role": "assistant", "content": res.text})
    for b, row in enumerate(batch):
        if b in failed:
            summary.note(failed[b].status if failed[b].status == "error" else "skipped", row.source, failed[b].reason)
            continue
        sink.write(json.dumps({"id": row.row_id, "source": row.source, "messages": histories[b]}) + "\n")
        summary.success += 1
    sink.flush()
    os.fsync(sink.fileno())


def regenerate(paths: list[str], generator, output: str, fmt: str = "auto", batch_size: int = 8,
               limit: Optional[int] = None, log=print) -> RegenSummary:
    """Regenerate the rows of `paths` into `output` (resumable); see the module docstring."""
    start = time.time()
    out, sidecar = Path(output), Path(f"{output}.summary.json")
    check_outputs(out)
    settings = {**generator.settings(), "row_ids": ROW_IDS}
    _check_settings(sidecar, settings, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "a", encoding="utf-8") as sink:
        _lock_output(sink, out)  # before load_done: a second run would cut the first one's last line as torn
        done, torn = load_done(out)
        summary = RegenSummary(output=str(out), settings=settings, torn_line_repaired=torn)
        _write_json(sidecar, summary.to_dict())  # the settings are on disk before the first answer
        seen: set[str] = set()
        batch: list[formats.Row] = []
        for raw, row, err in formats.iter_rows(paths, fmt):
            if limit is not None and summary.input >= limit:
                break
            summary.input += 1
            if err is not None:
                summary.note("skipped", raw.source, str(err))
            elif row.kind == "text":
                summary.note("skipped", raw.source, "text document: no turn to answer")
            elif row.row_id in seen:
                summary.note("skipped", raw.source, "duplicate row id: the same file is listed twice in data.path")
            elif row.row_id in done:
                seen.add(row.row_id)
                summary.success += 1
                summary.resumed += 1
            elif not any(m["role"] == "user" for m in row.messages):
                summary.note("skipped", raw.source, "no user turn to answer")
            else:
                seen.add(row.row_id)
                batch.append(row)
                if len(batch) == batch_size:
                    _run_batch(batch, generator, summary, sink)
                    batch = []
                    log(f"regenerate: {summary.input} rows read, {summary.success} done, {summary.error} errors")
        if batch:
            _run_batch(batch, generator, summary, sink)
        summary.elapsed_s = time.time() - start
        _write_json(sidecar, summary.to_dict())
    return summary


def _lock_output(sink, out: Path) -> None:
    """One regeneration per output file at a time: an exclusive flock on the open output, held until it is
    closed (the kernel drops it when the process dies). Two runs into one file each wrote every row."""
    import fcntl

    try:
        fcntl.flock(sink.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"regenerate.output {out}: another regeneration is writing it now; wait for it to end "
                        "(a rerun then resumes where it stopped), or set regenerate.output to another file") from None


def regenerate_for_recipe(cfg, target=None, limit=None, log=print, api_key_env=None) -> RegenSummary:
    """Regenerate a recipe's cfg.data.path into cfg.regenerate.output (`draftsmith prepare`, and `train`
    before it reads the data); returns the RegenSummary. api_key_env: the variable named by --api-key-env
    (the openai generator's key). target: the loaded target (the local generator loads it if None)."""
    rc = cfg.regenerate
    check_outputs(rc.output)  # before any model loads
    if rc.generator == "local":
        from draftsmith.targets import load as target_mod

        target = target or target_mod.from_config(cfg.target)
        generator = LocalGenerator(target, rc, cfg.data)
    elif rc.generator == "answers":
        generator = AnswersGenerator(rc)
    else:
        tokenizer = None
        if rc.api == "completions":
            tokenizer = target.tokenizer if target is not None else recipe_tokenizer(cfg)
        generator = HTTPGenerator(rc, cfg.data, tokenizer, api_key_env=api_key_env, log=log)
    summary = regenerate(cfg.data.path, generator, rc.output, fmt=cfg.data.format, batch_size=rc.batch_size,
                         limit=limit, log=log)
    log(summary.summary())
    return summary


def recipe_tokenizer(cfg):
    """The tokenizer of a recipe's target (no weights loaded)."""
    from transformers import AutoTokenizer

    from draftsmith.targets.load import hf_kwargs, locate

    local, gguf_name = locate(cfg.target.path, cfg.target.gguf_file)  # a .gguf target carries its tokenizer
    return AutoTokenizer.from_pretrained(local, revision=cfg.target.revision,
                                         trust_remote_code=cfg.target.trust_remote_code, **hf_kwargs(gguf_name))


def _write_json(path: Path, data: dict) -> None:
    write_text_atomically(path, json.dumps(data, indent=2), "regenerate.output")  # never over a FIFO or device


def check_outputs(output: str | Path) -> None:
    """regenerate.output and its .summary.json beside it: missing or regular files, else one line (a FIFO
    would hang the append, a device node would be replaced by the summary's rename)."""
    check_output_file(output, "regenerate.output")
    check_output_file(f"{output}.summary.json", "regenerate.output's summary")
