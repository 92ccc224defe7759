"""doctor on hostile input (issue 44, items 4, 5, 6, 7 and 15): a received export's serve_command of 200,000 `env`
words, 5,000-digit integers, deep JSON in a dotted flag, a target config.json nested 200,000 deep or not a regular
file, escape sequences in what a received export says, a TensorRT-LLM options file linked out of the export, and
k past the bound `export` applies. Each is one line (exit 2) or a finding, never a traceback, a hang or a raw escape."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from tests.commands.doctor_exports import build_exports
from tests.commands.test_doctor import LLAMACPP, last_line, run, served

PAIRS = [("eagle3", "vllm"), ("dspark", "vllm"), ("eagle3", "trtllm"), ("eagle3", LLAMACPP), ("eagle3", "sglang")]
ESC = "\x1b]0;pwned\x07\x1b[2J\x1b[31m"


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return build_exports(tmp_path_factory.mktemp("doctor-hostile"), PAIRS)


@pytest.fixture
def copy_of(exports, tmp_path):
    """A fresh copy of one export, to damage."""
    import shutil

    def make(kind: str, fmt: str) -> Path:
        out = tmp_path / f"{kind}-{fmt}"
        shutil.copytree(exports[(kind, fmt)], out, symlinks=True)
        side = json.loads((out / "draftsmith.json").read_text())
        side["serve_command"] = side["serve_command"].replace(str(exports[(kind, fmt)]), str(out))
        (out / "draftsmith.json").write_text(json.dumps(side))
        if fmt == "trtllm":
            options = out / "extra_llm_api_options.yaml"
            options.write_text(options.read_text().replace(str(exports[(kind, fmt)]), str(out)))
        return out

    return make


def edit_sidecar(directory: Path, **changes) -> None:
    side = json.loads((directory / "draftsmith.json").read_text())
    for key, value in changes.items():
        node, *path = key.split("__")
        target = side
        for part in [node, *path][:-1]:
            target = target[part]
        target[[node, *path][-1]] = value
    (directory / "draftsmith.json").write_text(json.dumps(side))


def one_line_exit_2(code: int, lines: list[str], *names: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("draftsmith doctor: error:"), lines
    assert len(lines[0]) < 600, lines[0][:600]
    assert all(name in lines[0] for name in names), (names, lines[0])


# --------------------------------------------------------------------------- item 4

@pytest.mark.parametrize("where", ["the export", "the user's command"])
def test_200k_env_words_are_one_line_in_seconds(copy_of, capsys, where):
    directory = copy_of("eagle3", "vllm")
    own = last_line(served(directory))
    command = "env " * 200_000 + own[0] + " serve m"
    start = time.perf_counter()
    if where == "the export":
        edit_sidecar(directory, serve_command=command)
        code, lines = run(capsys, directory, "--", *own)
        names = ("serve_command", "words")
    else:
        code, lines = run(capsys, directory, "--", *command.split())
        names = ("serve command", "words")
    assert time.perf_counter() - start < 10
    one_line_exit_2(code, lines, *names)


def test_a_few_env_words_still_read(exports, capsys):
    directory = exports[("eagle3", "vllm")]
    code, lines = run(capsys, directory, "--", "env", "env", "A=1", "env", *last_line(served(directory)))
    assert code == 0, lines


# --------------------------------------------------------------------------- item 5

HUGE = "9" * 5000


def test_huge_integer_in_the_speculative_config(exports, capsys):
    directory = exports[("eagle3", "vllm")]
    words = last_line(served(directory))
    spec = words[words.index("--speculative-config") + 1]
    code, lines = run(capsys, directory, "--", *[w if w != spec else spec.replace('"num_speculative_tokens": 2',
                                                                                  f'"num_speculative_tokens": {HUGE}')
                                                 for w in words])
    one_line_exit_2(code, lines, "--speculative-config", "5,000 digits")
    code, lines = run(capsys, directory, "--", *words, "--speculative-config.num_speculative_tokens", HUGE)
    one_line_exit_2(code, lines, "--speculative-config.num_speculative_tokens")


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_huge_integer_in_a_config_file(exports, capsys, tmp_path, suffix):
    directory = exports[("eagle3", "vllm")]
    path = tmp_path / f"spec{suffix}"
    path.write_text(f'{{"model": "x", "num_speculative_tokens": {HUGE}}}')  # JSON is YAML too
    code, lines = run(capsys, directory, "--config", path)
    one_line_exit_2(code, lines, str(path))
    path.write_text(f'{{"model": "x", "num_speculative_tokens": {"9" * 40}}}')  # read, then past any bound
    code, lines = run(capsys, directory, "--config", path)
    one_line_exit_2(code, lines, str(path))


@pytest.mark.parametrize("needs", [HUGE, ">= 0." + HUGE, int(HUGE[:4000]), None, "\x1b[2J>= 0.28"],
                         ids=["5000-digit string", "5000-digit minor", "5000-digit integer", "absent", "escapes"])
def test_sidecar_needs_vllm_damaged(copy_of, capsys, needs):
    directory = copy_of("dspark", "vllm")
    command = served(directory)
    side = json.loads((directory / "draftsmith.json").read_text())
    side["vllm_dspark_serving"]["needs_vllm"] = needs
    text = json.dumps(side)
    if isinstance(needs, int):  # 4,000 digits written, then made 5,000: Python's json refuses to read it back
        text = text.replace(str(needs), HUGE)
    (directory / "draftsmith.json").write_text(text)
    code, lines = run(capsys, directory, "--engine-version", "0.33.0", "--", command)
    if needs is None:
        assert code == 0, lines
    else:
        one_line_exit_2(code, lines, "draftsmith.json")
        assert "\x1b" not in lines[0]


def test_deep_json_in_a_dotted_flag(exports, capsys):
    directory = exports[("eagle3", "vllm")]
    words = last_line(served(directory))
    code, lines = run(capsys, directory, "--", *words, "--speculative-config.model", "[" * 200_000)
    one_line_exit_2(code, lines, "--speculative-config.model")
    code, lines = run(capsys, directory, "--", *words, "--speculative-config" + ".a" * 100_000, "1")
    one_line_exit_2(code, lines, "--speculative-config")


def test_a_target_config_nested_200k_deep(exports, capsys, tmp_path):
    directory = exports[("eagle3", "vllm")]
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text("[" * 200_000 + "]" * 200_000)
    words = last_line(served(directory))
    code, lines = run(capsys, directory, "--", words[0], words[1], str(target), *words[3:])
    one_line_exit_2(code, lines, "config.json")


def test_a_target_config_that_is_not_a_regular_file(exports, capsys, tmp_path):
    directory = exports[("eagle3", "vllm")]
    target = tmp_path / "target"
    target.mkdir()
    os.mkfifo(target / "config.json")
    words = last_line(served(directory))
    code, lines = run(capsys, directory, "--", words[0], words[1], str(target), *words[3:])
    one_line_exit_2(code, lines, "config.json", "FIFO")


# --------------------------------------------------------------------------- item 6

def test_escapes_from_a_received_export_are_not_printed(copy_of, capsys):
    vllm = copy_of("eagle3", "vllm")
    own = last_line(served(vllm))
    edit_sidecar(vllm, verifier__serve_as=f"meta/{ESC}Llama\nmismatch none: forged line")
    code, lines = run(capsys, vllm, "--", *own)  # the target under another path: a note quoting serve_as
    assert any("meta/" in line and "Llama mismatch none: forged line" in line for line in lines), lines
    assert not any("\x1b" in line or "\x07" in line for line in lines), lines
    assert not any(line.startswith("mismatch none") for line in lines), lines
    sglang = copy_of("eagle3", "sglang")  # the export's serve_command, printed in the "engine" finding
    edit_sidecar(sglang, serve_command=served(sglang) + f" --served-model-name {ESC}x")
    code, lines = run(capsys, sglang, "--", *last_line(served(vllm)))
    assert code == 1 and any(line.startswith("mismatch engine") for line in lines)
    assert not any("\x1b" in line or "\x07" in line for line in lines), lines
    llama = copy_of("eagle3", LLAMACPP)
    edit_sidecar(llama, draft=f"draft{ESC}.gguf")
    code, lines = run(capsys, llama, "--", *last_line(served(llama)))
    assert code == 1 and any(line.startswith("mismatch draft model") for line in lines), lines
    assert not any("\x1b" in line or "\x07" in line for line in lines), lines


def test_escapes_in_an_error_line_are_removed(copy_of, capsys):
    directory = copy_of("eagle3", "vllm")
    edit_sidecar(directory, serve_command=f"vllm serve m --speculative-config.{ESC}")
    code, lines = run(capsys, directory, "--", "vllm", "serve", "m")
    one_line_exit_2(code, lines)
    assert "\x1b" not in lines[0] and "\x07" not in lines[0]


# --------------------------------------------------------------------------- item 7

@pytest.mark.parametrize("outside", ["/etc/shadow", "../elsewhere.yaml"])
def test_trtllm_options_linked_out_of_the_export(copy_of, capsys, tmp_path, outside):
    directory = copy_of("eagle3", "trtllm")
    options = directory / "extra_llm_api_options.yaml"
    (tmp_path / "elsewhere.yaml").write_text(options.read_text())
    options.unlink()
    options.symlink_to(outside)
    code, lines = run(capsys, directory, "--", *last_line(served(directory)))
    one_line_exit_2(code, lines, "extra_llm_api_options.yaml", "a link out of the export")
    assert not any("decoding_type: None" in line for line in lines)


def test_trtllm_options_linked_inside_the_export_are_read(copy_of, capsys):
    directory = copy_of("eagle3", "trtllm")
    options = directory / "extra_llm_api_options.yaml"
    options.rename(directory / "real.yaml")
    options.symlink_to("real.yaml")
    assert run(capsys, directory, "--", *last_line(served(directory)))[0] == 0


# --------------------------------------------------------------------------- item 15

@pytest.mark.parametrize("k", [65, 10**18, True, 2.5, "3"], ids=["65", "1e18", "true", "2.5", "string"])
def test_k_past_the_export_bound_is_a_mismatch(exports, capsys, k):
    """export refuses k > 64 (core/bounds.py); doctor called 65 and 10^18 'allowed', and `true` 'draft True tokens'."""
    directory = exports[("eagle3", "vllm")]
    words = last_line(served(directory))
    i = words.index("--speculative-config")
    spec = {**json.loads(words[i + 1]), "num_speculative_tokens": k}
    code, lines = run(capsys, directory, "--", *words[:i + 1], json.dumps(spec), *words[i + 2:])
    assert code == 1, lines
    assert any(line.startswith("mismatch num_speculative_tokens") for line in lines), lines
    assert not any("True tokens" in line or "allowed" in line for line in lines), lines


@pytest.mark.parametrize("k", [65, 10**18, True], ids=["65", "1e18", "true"])
def test_trtllm_k_past_the_bound(copy_of, capsys, k):
    directory = copy_of("eagle3", "trtllm")
    options = directory / "extra_llm_api_options.yaml"
    data = yaml.safe_load(options.read_text())
    data["speculative_config"]["max_draft_len"] = k
    options.write_text(yaml.safe_dump(data))
    code, lines = run(capsys, directory, "--", *last_line(served(directory)))
    assert code == 1 and any(line.startswith("mismatch max_draft_len") for line in lines), lines
    assert not any("True tokens" in line or "allowed" in line for line in lines), lines


@pytest.mark.parametrize("flag,value", [("--speculative-num-steps", "65"), ("--speculative-num-steps", "1" + "0" * 18)])
def test_sglang_steps_past_the_bound(exports, capsys, flag, value):
    from tests.commands.test_doctor import replace

    directory = exports[("eagle3", "sglang")]
    code, lines = run(capsys, directory, "--", *replace(last_line(served(directory)), flag, value))
    assert code == 1 and any(line.startswith("mismatch k") for line in lines), lines
    assert not any("allowed" in line for line in lines), lines


# --------------------------------------------------------------------------- found by the harness (engine command lines)

def test_a_model_given_as_a_list_is_a_finding(exports, capsys):
    """`--speculative-config.model+ a,b` makes vLLM's model a list; doctor's path comparison raised TypeError."""
    directory = exports[("eagle3", "vllm")]
    code, lines = run(capsys, directory, "--", *last_line(served(directory)), "--speculative-config.model+", "a,b")
    assert code == 1 and any(line.startswith("mismatch draft model: vLLM will load the draft from ['a', 'b']")
                             for line in lines), lines


def test_an_export_command_its_engine_refuses_is_one_line(copy_of, capsys):
    """A received SGLang export whose serve_command spells --speculative_num_draft_tokens (SGLang refuses it)."""
    directory = copy_of("eagle3", "sglang")
    own = last_line(served(directory))
    edit_sidecar(directory, serve_command=served(directory).replace("--speculative-num-draft-tokens",
                                                                    "--speculative_num_draft_tokens"))
    code, lines = run(capsys, directory, "--", *own)
    one_line_exit_2(code, lines, "draftsmith.json serve_command", "unrecognized argument --speculative_num_draft_tokens")


def test_an_unreadable_options_file_names_the_flag(exports, capsys):
    directory = exports[("eagle3", "trtllm")]
    words = last_line(served(directory))
    code, lines = run(capsys, directory, "--", *words[:-1], "x" * 300)
    one_line_exit_2(code, lines, "--extra_llm_api_options", "cannot be read")
