"""`draftsmith doctor`: the serve command `export` prints passes for every kind x format pair can_export allows;
planted mismatches (at least 3 per engine) are each caught with the corrected flag in their line; unknown flags
are listed as not checked; hostile input is one line and exit 2."""
from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from draftsmith import checkpoint
from draftsmith.cli import main as cli_main
from draftsmith.export import EXPORTERS, can_export, engine_versions, export
from draftsmith.export.doctor.run import diagnose, prediction
from draftsmith.export.layout import ExportOptions, layouts
from draftsmith.heads import DRAFTERS
from tests.export.conftest import make_checkpoint

LLAMACPP = "llama.cpp"


def newest_release(kind: str, fmt: str) -> tuple[bool, str | None]:
    """(can export, the newest release that serves it; None for a format without a release table)."""
    for version in reversed(engine_versions.versions(fmt) or [None]):
        if not can_export(kind, fmt, version):
            return True, version
    return False, None


PAIRS = [(kind, fmt, newest_release(kind, fmt)[1]) for kind in DRAFTERS.names() for fmt in EXPORTERS.names()
         if newest_release(kind, fmt)[0]]


def llamacpp_dry_export(loaded, out: Path, monkeypatch) -> None:
    """The llama.cpp sidecar and serve command as `export --to llama.cpp` writes them, without llama.cpp's binaries
    (the converter and llama-server are not run: doctor reads the sidecar and the command only)."""
    from draftsmith.export.llamacpp import tools as llamacpp_tools

    monkeypatch.setattr(llamacpp_tools, "find_llama_cpp",
                        lambda: SimpleNamespace(server=Path("/opt/llama.cpp/bin/llama-server"), version=lambda: "test"))
    layout = layouts(LLAMACPP).get(loaded.drafter.kind)(LLAMACPP, "llama.cpp", loaded.drafter.kind)
    opts = ExportOptions()
    files = layout.build(loaded, opts, out)
    files.sidecar["serve_command"] = layout.serve_command(out, loaded, opts)
    out.mkdir(parents=True)
    (out / "draftsmith.json").write_text(json.dumps(files.sidecar, default=str))


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """kind -> format -> export directory, for every pair of PAIRS (tiny drafters, no download)."""
    monkeypatch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("doctor")
    built: dict[str, dict[str, Path]] = {}
    try:
        for kind in sorted({k for k, _, _ in PAIRS}):
            ckpt = make_checkpoint(root / kind, kind, dict(DRAFTERS.get(kind).tiny_options))
            loaded = checkpoint.load_drafter(ckpt, device="cpu")
            for k, fmt, version in PAIRS:
                if k != kind:
                    continue
                out = root / f"{kind}-{fmt}"
                if fmt == LLAMACPP:
                    llamacpp_dry_export(loaded, out, monkeypatch)
                else:
                    export(ckpt, fmt, out, ExportOptions(engine_version=version), validate=False, loaded=loaded)
                built.setdefault(kind, {})[fmt] = out
    finally:
        monkeypatch.undo()
    return built


def served(export_dir: Path) -> str:
    return json.loads((export_dir / "draftsmith.json").read_text())["serve_command"]


def last_line(command: str) -> list[str]:
    return shlex.split([line for line in command.splitlines() if not line.startswith("#")][-1])


def run(capsys, *argv) -> tuple[int, list[str]]:
    code = cli_main(["doctor", *map(str, argv)])
    captured = capsys.readouterr()
    return code, (captured.out + captured.err).strip().splitlines()


def test_every_pair_is_covered():
    fmts = {(k, f) for k, f, _ in PAIRS}
    assert {("eagle3", "vllm"), ("dspark", "sglang"), ("eagle3", "trtllm"), ("dspark", LLAMACPP), ("draft_lm", "hf"),
            ("mlp_speculator", "vllm"), ("medusa", "vllm"), ("dflash2", LLAMACPP)} <= fmts


@pytest.mark.parametrize("kind,fmt,version", PAIRS, ids=[f"{k}-{f}" for k, f, _ in PAIRS])
def test_the_exported_serve_command_passes(exports, capsys, kind, fmt, version):
    directory = exports[kind][fmt]
    release = ["--engine-version", version] if version else []
    code, lines = run(capsys, directory, *release, "--", served(directory))  # as printed, comments and all
    assert code == 0, lines
    assert not any(line.startswith("mismatch") for line in lines)
    code, _ = run(capsys, directory, *release, "--", *last_line(served(directory)))  # as shell words
    assert code == 0


def vllm_spec(directory: Path, **changes) -> list[str]:
    words = last_line(served(directory))
    i = words.index("--speculative-config")
    spec = {**json.loads(words[i + 1]), **changes}
    spec = {k: v for k, v in spec.items() if v is not None}
    return [*words[:i + 1], json.dumps(spec), *words[i + 2:]]


def replace(words: list[str], flag: str, value: str | None) -> list[str]:
    """words with flag's value replaced (appended when absent; the flag dropped when value is None)."""
    if flag in words:
        i = words.index(flag)
        return words[:i] + ([flag, value] if value is not None else []) + words[i + 2:]
    return words + [flag, value]


def trtllm_yaml(directory: Path, tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load((directory / "extra_llm_api_options.yaml").read_text())
    data["speculative_config"].update(changes)
    path = tmp_path / "extra.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# (kind, format, how to plant the mismatch from the export's own command, text the mismatch line must hold)
PLANTED = [
    ("dspark", "vllm", lambda d, t: vllm_spec(d, num_speculative_tokens=8), '"num_speculative_tokens": 3'),
    ("dflash", "vllm", lambda d, t: vllm_spec(d, method="eagle3"), '"method": "dflash"'),
    ("peagle", "vllm", lambda d, t: vllm_spec(d, parallel_drafting=None), '"parallel_drafting": true'),
    ("dspark", "vllm", lambda d, t: vllm_spec(d, enable_adaptive_verification=None), '"enable_adaptive_verification": true'),
    ("eagle3", "vllm", lambda d, t: vllm_spec(d, model=str(t)), '"model": "{dir}"'),
    ("eagle3", "vllm", lambda d, t: vllm_spec(d) + ["--dtype", "bfloat16"], "--dtype float32"),
    ("eagle3", "vllm", lambda d, t: ["vllm", "serve", "meta-llama/Llama-3.1-8B", *vllm_spec(d)[3:]], "vllm serve {verifier}"),
    ("mlp_speculator", "vllm", lambda d, t: vllm_spec(d)[1:], "VLLM_USE_V1=0"),
    ("dflash", "sglang", lambda d, t: replace(last_line(served(d)), "--speculative-num-draft-tokens", "8"),
     "--speculative-num-draft-tokens 4"),
    ("dspark", "sglang", lambda d, t: replace(last_line(served(d)), "--speculative-algorithm", "DFLASH"),
     "--speculative-algorithm DSPARK"),
    ("eagle3", "sglang", lambda d, t: replace(last_line(served(d)), "--speculative-draft-model-path", str(t)),
     "--speculative-draft-model-path {dir}"),
    ("eagle3", "sglang", lambda d, t: replace(last_line(served(d)), "--speculative-token-map", "hot.pt"),
     "drop --speculative-token-map"),
    ("eagle3", "sglang", lambda d, t: replace(last_line(served(d)), "--speculative-num-draft-tokens", "9"),
     "--speculative-num-draft-tokens 3"),
    ("eagle3", "trtllm", lambda d, t: ["trtllm-serve", *last_line(served(d))[1:-1], str(trtllm_yaml(d, t, eagle3_layers_to_capture=[0, 2]))],
     "speculative_config.eagle3_layers_to_capture: [0, 1, 2]"),
    ("eagle3", "trtllm", lambda d, t: [*last_line(served(d))[:-1], str(trtllm_yaml(d, t, decoding_type="MTP"))],
     "speculative_config.decoding_type: Eagle3"),
    ("eagle3", "trtllm", lambda d, t: [*last_line(served(d))[:-1], str(trtllm_yaml(d, t, speculative_model=str(t)))],
     "speculative_config.speculative_model: {dir}"),
    ("eagle3", "trtllm", lambda d, t: replace(last_line(served(d)), "--backend", "tensorrt"), "--backend pytorch"),
    ("dspark", LLAMACPP, lambda d, t: replace(last_line(served(d)), "--spec-draft-n-max", "2"), "--spec-draft-n-max 3"),
    ("dspark", LLAMACPP, lambda d, t: replace(last_line(served(d)), "--spec-draft-p-min", "0.5"), "--spec-draft-p-min 0"),
    ("dflash", LLAMACPP, lambda d, t: replace(last_line(served(d)), "--spec-type", "draft-eagle3"), "--spec-type draft-dflash"),
    ("eagle3", LLAMACPP, lambda d, t: replace(last_line(served(d)), "-md", str(t / "other.gguf")), "-md {draft}"),
    ("dflash2", LLAMACPP, lambda d, t: replace(last_line(served(d)), "--spec-draft-n-max", "2"), "--spec-draft-n-max 3"),
    ("draft_lm", LLAMACPP, lambda d, t: last_line(served(d)) + ["--spec-replace", "<s>", "[BOS]"], "drop --spec-replace"),
]


def test_at_least_three_planted_mismatches_per_engine():
    per_format = {}
    for _, fmt, _, _ in PLANTED:
        per_format[fmt] = per_format.get(fmt, 0) + 1
    assert all(per_format.get(fmt, 0) >= 3 for fmt in ("vllm", "sglang", "trtllm", LLAMACPP)), per_format


@pytest.mark.parametrize("kind,fmt,plant,fix", PLANTED, ids=[f"{k}-{f}-{i}" for i, (k, f, _, _) in enumerate(PLANTED)])
def test_a_planted_mismatch_is_caught_with_its_fix(exports, capsys, tmp_path, kind, fmt, plant, fix):
    directory = exports[kind][fmt]
    side = json.loads((directory / "draftsmith.json").read_text())
    want = fix.format(dir=directory.resolve(), verifier=side.get("verifier", {}).get("serve_as"),
                      draft=(directory / str(side.get("draft"))).resolve())
    code, lines = run(capsys, directory, "--", *plant(directory, tmp_path))
    assert code == 1, lines
    caught = [line for line in lines if line.startswith("mismatch") and want in line]
    assert caught, (want, lines)
    assert " will " in caught[0] and "trained for" in caught[0]


def test_a_release_that_cannot_serve_the_kind(exports, capsys):
    directory = exports["dspark"]["vllm"]
    code, lines = run(capsys, directory, "--engine-version", "0.20", "--", served(directory))
    assert code == 1
    assert any(line.startswith("mismatch engine release") and "serve with vLLM 0.33.0" in line for line in lines)
    # DSpark's adaptive verification fields: 0.27 serves the kind but rejects them
    code, lines = run(capsys, directory, "--engine-version", "0.27.0", "--", served(directory))
    assert code == 1 and any("reject enable_adaptive_verification" in line for line in lines)


def test_an_export_for_another_engine(exports, capsys):
    code, lines = run(capsys, exports["eagle3"]["sglang"], "--", served(exports["eagle3"]["vllm"]))
    assert code == 1 and lines[0].startswith("mismatch engine: vLLM will not load this export (sglang format)")


def test_unknown_flags_are_listed_not_passed(exports, capsys):
    directory = exports["eagle3"]["vllm"]
    code, lines = run(capsys, directory, "--", *vllm_spec(directory, draft_tensor_parallel_size=1),
                      "--gpu-memory-utilization", "0.9", "--enforce-eager")
    assert code == 0
    assert any(line.startswith("not checked:") and "--gpu-memory-utilization" in line and "--enforce-eager" in line
               and "speculative_config.draft_tensor_parallel_size" in line for line in lines)


def test_a_larger_k_for_a_chain_drafter_is_a_note(exports, capsys):
    directory = exports["eagle3"]["vllm"]
    code, lines = run(capsys, directory, "--", *vllm_spec(directory, num_speculative_tokens=6))
    assert code == 0 and any(line.startswith("note num_speculative_tokens") for line in lines)


def test_config_files(exports, capsys, tmp_path):
    vllm_dir = exports["dspark"]["vllm"]
    spec = json.loads(last_line(served(vllm_dir))[-1])
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    assert run(capsys, vllm_dir, "--config", tmp_path / "spec.json")[0] == 0
    (tmp_path / "bad.json").write_text(json.dumps({**spec, "num_speculative_tokens": 6}))
    code, lines = run(capsys, vllm_dir, "--config", tmp_path / "bad.json")
    assert code == 1 and any('"num_speculative_tokens": 3' in line for line in lines)
    trt = exports["eagle3"]["trtllm"]
    assert run(capsys, trt, "--config", trt / "extra_llm_api_options.yaml")[0] == 0
    sgl = exports["dflash"]["sglang"]
    words = last_line(served(sgl))
    args = {words[i][2:]: words[i + 1] for i in range(3, len(words), 2)}
    (tmp_path / "sglang.yaml").write_text(yaml.safe_dump({**args, "speculative_num_draft_tokens": 7}))
    code, lines = run(capsys, sgl, "--config", tmp_path / "sglang.yaml")
    assert code == 1 and any("--speculative-num-draft-tokens 4" in line for line in lines)


def test_prediction_for_a_llamacpp_block_shorter_than_the_trained_one(exports):
    directory = exports["dspark"][LLAMACPP]
    bad = replace(last_line(served(directory)), "--spec-draft-n-max", "2")
    said = prediction(directory, bad)
    assert said["predicts_lower_acceptance"] and said["exit_code"] == 1
    assert [m["field"] for m in said["mismatches"]] == ["k"]
    assert "one block of 2 tokens" in said["mismatches"][0]["engine_does"]
    assert not prediction(directory, served(directory))["predicts_lower_acceptance"]


def test_a_llamacpp_block_above_the_trained_one_is_clamped_a_note(exports):
    """llama.cpp clamps n_max to the trained block (common/speculative.cpp), so a larger k changes nothing:
    measured with a DFlash export on pycode-tiny, tau 1.07 at --spec-draft-n-max 5 and 12 alike."""
    directory = exports["dspark"][LLAMACPP]
    said = prediction(directory, replace(last_line(served(directory)), "--spec-draft-n-max", "8"))
    assert said["exit_code"] == 0 and not said["mismatches"]
    assert any("clamp --spec-draft-n-max 8" in line and "--spec-draft-n-max 3" in line for line in said["lines"])


def hostile_cases(directory: Path, tmp_path: Path) -> dict[str, list[str]]:
    huge = tmp_path / "huge.json"
    huge.write_text('{"model": "' + "x" * (50 * 2**20) + '"}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    return {
        "50 MB JSON file": ["--config", str(huge)],
        "50 MB JSON in the command": ["--", "vllm", "serve", "m", "--speculative-config", "{" + " " * (50 * 2**20) + "}"],
        "nesting 100k deep in the command": ["--", "vllm", "serve", "m", "--speculative-config", "[" * 100_000],
        "nesting 100k deep in a file": ["--config", str(deep)],
        "unbalanced quotes": ["--", "vllm serve m --speculative-config '{\"model\": \"x\"}"],
        "unknown engine": ["--", "text-generation-launcher", "--model-id", "m"],
        "no command": [],
        "a flag without its value": ["--", "vllm", "serve", "m", "--speculative-config"],
    }


def test_hostile_input_is_one_line_and_exit_2(exports, capsys, tmp_path):
    directory = exports["eagle3"]["vllm"]
    for name, argv in hostile_cases(directory, tmp_path).items():
        code, lines = run(capsys, directory, *argv)
        assert code == 2, (name, lines)
        assert len(lines) == 1 and lines[0].startswith("draftsmith doctor: error:"), (name, lines)
        assert len(lines[0]) < 400, (name, lines[0][:400])


def test_not_an_export(capsys, tmp_path):
    code, lines = run(capsys, tmp_path, "--", "vllm", "serve", "m")
    assert code == 2 and "no draftsmith.json" in lines[0]
    with pytest.raises(Exception, match="not a directory"):
        diagnose(tmp_path / "missing", ["vllm", "serve", "m"])
