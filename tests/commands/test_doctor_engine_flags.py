"""doctor reads each engine's command line as that engine's own parser does (issue 44, item 1):

- vLLM (vllm/utils/argparse_utils.py FlexibleArgumentParser, 0.20-0.33): '_' is '-' only up to the first '.', so
  `--speculative_config.num_speculative_tokens 60` is the key `num_speculative_tokens`; the dotted keys merge into
  one JSON appended after every other word, so they REPLACE a `--speculative-config` JSON given too. Checked against
  vLLM's own parser code where scripts/fetch_vllm_config_code.sh has fetched it (it runs on a CPU).
- SGLang (a stdlib argparse.ArgumentParser, allow_abbrev on): its aliases (`--model`, `--speculative-draft-model`,
  the DFLASH / DSPARK block sizes), unique prefixes; underscores, ambiguous prefixes and unknown options refused.
  Checked against argparse itself, built with every option SGLang 0.5.23 registers (export/sglang/cli_flags.py).
- llama-server (common/arg.cpp of llama-cpp-python 0.3.36's llama.cpp): every '_' of a `--` word is '-', there is no
  `--flag=value`, --spec-type values add up, LLAMA_ARG_* variables, removed flags refused.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from draftsmith.core.errors import UserError
from draftsmith.export.doctor.args import Command
from draftsmith.export.sglang import doctor as sglang_doctor
from draftsmith.export.sglang.cli_flags import OPTIONS
from draftsmith.export.vllm import doctor as vllm_doctor
from tests.commands.doctor_exports import build_exports
from tests.commands.test_doctor import LLAMACPP, last_line, replace, run, served

PAIRS = [("eagle3", "vllm"), ("eagle3", "sglang"), ("dflash", "sglang"), ("dspark", "sglang"), ("eagle3", LLAMACPP)]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    return build_exports(tmp_path_factory.mktemp("doctor-flags"), PAIRS)


def spec_words(directory: Path) -> tuple[list[str], dict]:
    """The export's vLLM command without its --speculative-config, and that config."""
    words = last_line(served(directory))
    i = words.index("--speculative-config")
    return words[:i] + words[i + 2:], json.loads(words[i + 1])


# --------------------------------------------------------------------------- vLLM

def test_vllm_dotted_key_replaces_the_json(exports, capsys):
    """The issue's case: JSON k = 2 (the export's), `--speculative-config.num_speculative_tokens 60` after it. vLLM runs
    {"num_speculative_tokens": 60} alone: no draft model, no method. doctor said "matches" with exit 0."""
    directory = exports[("eagle3", "vllm")]
    code, lines = run(capsys, directory, "--", *last_line(served(directory)),
                      "--speculative-config.num_speculative_tokens", "60")
    assert code == 1, lines
    assert any(line.startswith("mismatch speculative config: vLLM will take --speculative-config.num_speculative_tokens "
                               "as the whole speculative config") for line in lines), lines
    assert any(line.startswith("mismatch draft model: vLLM will load no draft model") for line in lines), lines
    assert not any("num-speculative-tokens" in line for line in lines), lines


def test_vllm_every_key_dotted_is_the_exports_config(exports, capsys):
    directory = exports[("eagle3", "vllm")]
    words, spec = spec_words(directory)
    dotted = [w for key, value in spec.items() for w in (f"--speculative_config.{key}", str(value))]
    code, lines = run(capsys, directory, "--", *words, *dotted)
    assert code == 0, lines
    bigger = [w if w != str(spec["num_speculative_tokens"]) else "65" for w in dotted]  # past core/bounds' 64
    code, lines = run(capsys, directory, "--", *words, *bigger)
    assert code == 1 and any(line.startswith("mismatch num_speculative_tokens") for line in lines), lines


def test_vllm_underscores_after_the_dot_are_the_key(exports, capsys):
    """`--speculative-config.num-speculative-tokens` is a key vLLM's SpeculativeConfig does not have (listed, not
    read as k); `--speculative_config.num_speculative_tokens=2` is k."""
    directory = exports[("eagle3", "vllm")]
    words, spec = spec_words(directory)
    base = [f"--speculative-config.{k}={v}" for k, v in spec.items() if k != "num_speculative_tokens"]
    code, lines = run(capsys, directory, "--", *words, *base, "--speculative-config.num-speculative-tokens", "2")
    assert any(line.startswith("not checked:") and "speculative_config.num-speculative-tokens" in line for line in lines)
    code, lines = run(capsys, directory, "--", *words, *base, f"--speculative_config.num_speculative_tokens={spec['num_speculative_tokens']}")
    assert code == 0, lines


VLLM_CODE = Path(os.environ.get("DRAFTSMITH_VLLM_CONFIG_CODE", Path.home() / ".cache/draftsmith/vllm-config-code"))
VLLM_VERSIONS = sorted(p.name for p in VLLM_CODE.glob("*") if (p / "vllm/utils/argparse_utils.py").is_file())
VLLM_PARSER = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from vllm.utils.argparse_utils import FlexibleArgumentParser
out = []
for argv in json.loads(sys.stdin.read()):
    parser = FlexibleArgumentParser()  # `vllm serve`'s: a positional model, --speculative-config json.loads (arg_utils)
    parser.add_argument("subcommand")
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--speculative-config", type=json.loads, default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    try:
        ns = parser.parse_args(argv)
        out.append({"spec": ns.speculative_config or {}, "target": ns.model_tag, "dtype": ns.dtype})
    except (Exception, SystemExit) as exc:
        out.append({"error": type(exc).__name__})
print(json.dumps(out))
"""

VLLM_LINES = [
    ["m", "--speculative-config", '{"model": "d", "num_speculative_tokens": 5, "method": "eagle3"}'],
    ["m", "--speculative-config", '{"model": "d", "num_speculative_tokens": 5}', "--speculative-config.num_speculative_tokens", "60"],
    ["m", "--speculative_config.model", "d", "--speculative_config.num_speculative_tokens=7", "--dtype", "half"],
    ["m", "--speculative-config.method", "eagle3", "--speculative-config.draft_tensor_parallel_size", "1k"],
    ["m", "--speculative-config.a.b_c", "2K", "--speculative-config.a.d", '{"x": [1]}', "--speculative-config.l+", "1,2",
     "--speculative-config.l+=3"],
    ["m", "--speculative-config.model", "--dtype", "--gpu-memory-utilization", "0.8"],
    ["m", "--speculative-config={\"model\": \"a.b\"}", "--served_model_name", "x.y"],
    ["--model", "m", "--speculative-config", "{}", "--speculative-config.model", "d"],
    ["m", "--speculative-config.num_speculative_tokens", "1_000", "--speculative-config.method", "null"],
    ["m", "--config", "{config}", "--speculative-config.num_speculative_tokens", "4"],
    ["--config", "{config}", "m", "--dtype", "float32"],
    ["m", "--dtype=bfloat16", "--config", "{config}"],
]
VLLM_CONFIG = {"speculative-config": {"model": "d", "num_speculative_tokens": 5, "method": "eagle3"},
               "dtype": "half", "enforce_eager": True, "gpu-memory-utilization": 0.5}


@pytest.mark.skipif(not VLLM_VERSIONS, reason="vLLM's parser code is not fetched (bash scripts/fetch_vllm_config_code.sh)")
@pytest.mark.parametrize("version", VLLM_VERSIONS)
def test_vllm_reading_matches_vllms_own_parser(version, tmp_path):
    """doctor's vLLM reader and vLLM's FlexibleArgumentParser (run from the fetched wheel) agree on the speculative
    config, the target and --dtype of every command line above (a --config YAML file included)."""
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump(VLLM_CONFIG))
    lines = [[w.replace("{config}", str(config)) for w in argv] for argv in VLLM_LINES]
    done = subprocess.run([sys.executable, "-c", VLLM_PARSER, str(VLLM_CODE / version)], input=json.dumps(
        [["serve", *argv] for argv in lines]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert sum("error" in t for t in theirs) == 1, theirs  # `--config FILE m`: "No model specified!"
    for argv, vllm in zip(lines, theirs):
        if "error" in vllm:  # vLLM refuses the line: doctor too, in one line
            with pytest.raises(UserError):
                vllm_doctor.read(Command({}, ["vllm", "serve", *argv]), "test")
            continue
        ours = vllm_doctor.read(Command({}, ["vllm", "serve", *argv]), "test")
        assert (ours.spec, ours.target, ours.dtype) == (vllm["spec"], vllm["target"], vllm["dtype"]), argv


# --------------------------------------------------------------------------- SGLang

def sglang_parser() -> argparse.ArgumentParser:
    """SGLang's parser as far as option resolution goes: argparse.ArgumentParser(prog="sglang serve") with every
    option string SGLang 0.5.23 registers, each taking one value, aliases sharing one dest."""
    parser = argparse.ArgumentParser(prog="sglang serve", exit_on_error=False)
    groups = {name: [name] for name in OPTIONS}
    for name, alias in (("--model-path", "--model"), ("--speculative-draft-model-path", "--speculative-draft-model")):
        groups[name].append(alias)
        groups.pop(alias)
    for name, spellings in groups.items():
        parser.add_argument(*spellings, dest=name, default=None)
    return parser


SGLANG_LINES = [
    ["--model", "t", "--speculative-algo", "EAGLE3", "--speculative-draft-model", "d", "--speculative-num-st", "2"],
    ["--model-path=t", "--speculative-algorithm=DFLASH", "--speculative-dflash-block=4", "--dtype", "float32"],
    ["--model-path", "t", "--speculative-eagle-top", "1", "--speculative-num-draft-tok", "3", "--speculative-token-m", "x"],
]


@pytest.mark.parametrize("argv", SGLANG_LINES)
def test_sglang_reading_matches_argparse(argv):
    ns = vars(sglang_parser().parse_args(argv))
    ours = sglang_doctor.read(Command({}, ["python", "-m", "sglang.launch_server", *argv]), "test")
    assert not ours.refused
    for option, (name, _) in sglang_doctor.KNOWN.items():
        if option in ns and ours.get(name) is not None:
            assert ours.get(name) == ns[option], option
    assert {n for n, v in ns.items() if v is not None} == {o for o, (n, _) in sglang_doctor.KNOWN.items()
                                                           if ours.get(n) is not None and o in ns}


@pytest.mark.parametrize("word", ["--speculative_algorithm", "--speculative-draft", "--speculative-nonsense"])
def test_sglang_refuses_what_argparse_refuses(exports, capsys, word):
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        sglang_parser().parse_args([word, "EAGLE3"])
    directory = exports[("eagle3", "sglang")]
    code, lines = run(capsys, directory, "--", *last_line(served(directory)), word, "EAGLE3")
    assert code == 1 and any(line.startswith("mismatch command line: SGLang will refuse to start") and word in line
                             for line in lines), lines


def test_sglang_aliases_and_prefixes_are_read(exports, capsys):
    directory = exports[("eagle3", "sglang")]
    words = [w.replace("--model-path", "--model").replace("--speculative-draft-model-path", "--speculative-draft-model")
             for w in last_line(served(directory))]
    words = replace(words, "--speculative-num-steps", None) + ["--speculative-num-st", "5"]
    code, lines = run(capsys, directory, "--", *words)
    assert any(line.startswith("note k: SGLang will draft 5 steps") for line in lines), lines


def test_sglang_block_size_aliases(exports, capsys):
    """--speculative-dflash-block-size N is N draft tokens; --speculative-dspark-block-size G is G + 1; a different
    --speculative-num-draft-tokens beside either makes SGLang refuse to start; unset, SGLang reads the export's."""
    dflash, dspark = exports[("dflash", "sglang")], exports[("dspark", "sglang")]
    words = replace(last_line(served(dflash)), "--speculative-num-draft-tokens", None)
    assert run(capsys, dflash, "--", *words, "--speculative-dflash-block-size", "4")[0] == 0
    assert run(capsys, dflash, "--", *words)[0] == 0
    code, lines = run(capsys, dflash, "--", *words, "--speculative-dflash-block-size", "8")
    assert code == 1 and any("verify 8 tokens" in line for line in lines), lines
    code, lines = run(capsys, dflash, "--", *last_line(served(dflash)), "--speculative-dflash-block-size", "5")
    assert code == 1 and any("refuse to start (--speculative-dflash-block-size 5 stands for" in line for line in lines)
    words = replace(last_line(served(dspark)), "--speculative-num-draft-tokens", None)
    assert run(capsys, dspark, "--", *words, "--speculative-dspark-block-size", "3")[0] == 0
    code, lines = run(capsys, dspark, "--", *words, "--speculative-dspark-block-size", "4")
    assert code == 1, lines


# --------------------------------------------------------------------------- llama.cpp

def test_llamacpp_flags_as_arg_cpp_reads_them(exports, capsys):
    directory = exports[("eagle3", LLAMACPP)]
    words = last_line(served(directory))
    code, lines = run(capsys, directory, "--", *[w.replace("--spec-draft-n-max", "--spec_draft_n_max") for w in words])
    assert code == 0, lines
    i = words.index("--spec-draft-n-max")
    code, lines = run(capsys, directory, "--", *words[:i], f"--spec-draft-n-max={words[i + 1]}", *words[i + 2:])
    assert code == 1 and any("refuse to start: --spec-draft-n-max=" in line and "no --flag=value" in line
                             for line in lines), lines
    code, lines = run(capsys, directory, "--", *words, "--spec-type", "draft-dflash")  # adds a second type
    assert code == 1 and any(line.startswith("mismatch spec-type") and "draft-eagle3,draft-dflash" in line
                             for line in lines), lines
    code, lines = run(capsys, directory, "--", "LLAMA_ARG_SPEC_TYPE=draft-dflash", *words)
    assert code == 1 and any(line.startswith("mismatch spec-type") for line in lines), lines
    code, lines = run(capsys, directory, "--", *replace(words, "--spec-draft-n-max", None), "--draft-max", "2")
    assert code == 1 and any("the argument has been removed" in line for line in lines), lines
