"""Issue 11: `export --overwrite` replaces only a previous export's files and never the source;
`eval CKPT --target X` evaluates on X after the fingerprint check (never silently ignores it);
--revision reaches every Hub load."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from draftsmith.cli import main as cli_main
from draftsmith.export import export
from draftsmith.targets import load as target_mod
from draftsmith.testing import tiny_target


def _tree(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def source(eagle3_ckpt, tmp_path):
    """A private copy of the checkpoint (and its target), so a test may try to destroy it."""
    root = tmp_path / "src"
    shutil.copytree(Path(eagle3_ckpt).parent, root)
    cfg = yaml.safe_load((root / "final" / "config.yaml").read_text())
    cfg["target"]["path"] = str(root / "target")
    (root / "final" / "config.yaml").write_text(yaml.safe_dump(cfg))
    return root / "final"


def test_overwrite_replaces_only_a_previous_exports_files(source, eagle3_loaded, tmp_path):
    out = tmp_path / "exported"
    export(source, "sglang", out, loaded=eagle3_loaded, validate=False)
    first = json.loads((out / "draftsmith.json").read_text())["files"]
    assert first == sorted(_tree(out))
    (out / "README.md").write_text("my notes")  # the user's own file beside the export
    (out / "extra.txt").write_text("x")
    sidecar = json.loads((out / "draftsmith.json").read_text())
    (out / "stale.bin").write_text("from the old export")
    sidecar["files"].append("stale.bin")  # a file the previous export wrote and the new one does not
    (out / "draftsmith.json").write_text(json.dumps(sidecar))
    with pytest.raises(FileExistsError, match="not empty; pass --overwrite"):
        export(source, "sglang", out, loaded=eagle3_loaded, validate=False)
    export(source, "vllm", out, loaded=eagle3_loaded, validate=False, overwrite=True)
    after = _tree(out)
    assert after["README.md"] == b"my notes" and after["extra.txt"] == b"x" and "stale.bin" not in after
    assert json.loads(after["draftsmith.json"])["format"] == "vllm"


def test_overwrite_refuses_a_directory_that_is_not_an_export(source, eagle3_loaded, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="no draftsmith export"):
        export(source, "vllm", out, loaded=eagle3_loaded, validate=False, overwrite=True)
    assert _tree(out) == {"thesis.tex": b"years of work"}


def test_overwrite_never_touches_the_source_checkpoint(source, eagle3_loaded):
    before = _tree(source.parent)
    for out in (source, source.parent):  # --out is the checkpoint, or the folder holding it (--out .)
        with pytest.raises(ValueError, match="source checkpoint"):
            export(source, "vllm", out, loaded=eagle3_loaded, validate=False, overwrite=True)
    with pytest.raises(ValueError, match="inside the source checkpoint"):
        export(source, "vllm", source / "export", loaded=eagle3_loaded, validate=False, overwrite=True)
    assert _tree(source.parent) == before


def test_eval_checkpoint_with_target_runs_on_that_target_after_the_fingerprint_check(source, tmp_path, capsys):
    copy = tmp_path / "copy-of-target"
    shutil.copytree(source.parent / "target", copy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello"}\n')
    out = tmp_path / "r.json"
    args = ["eval", str(source), "--workloads", f"jsonl:{prompts}", "--k", "2", "--max-new-tokens", "4",
            "--warmup", "0", "--device", "cpu", "--out", str(out)]
    assert cli_main(args + ["--target", str(copy)]) == 0
    assert json.loads(out.read_text())["target"]["path"] == str(copy)
    other = tmp_path / "other"  # another model of the same shape
    tiny = tiny_target(num_layers=4, hidden=32, seed=3)
    tiny.model.save_pretrained(other)
    tiny.tokenizer.save_pretrained(other)
    capsys.readouterr()
    assert cli_main(args + ["--target", str(other)]) == 2  # the one-line error of an expected refusal
    assert re.search("was trained for target .* fingerprint", capsys.readouterr().err)


def test_revision_reaches_hub_loads(monkeypatch):
    import transformers

    from draftsmith.heads import draft_lm

    calls = []

    def spy(path, **kw):
        calls.append((path, kw.get("revision")))
        raise RuntimeError("stop here")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    cfg = draft_lm.DraftLMDrafter.Config(init="pretrained", path="org/draft", revision="v1.2")
    with pytest.raises(RuntimeError, match="stop here"):
        draft_lm.build_model(cfg, None)
    seen = []

    def load(path, **kw):
        seen.append((path, kw.get("revision")))
        raise RuntimeError("stop")

    monkeypatch.setattr(target_mod, "load", load)
    with pytest.raises(RuntimeError, match="stop"):
        cli_main(["eval", "--target", "org/t", "--revision", "r1", "--proposer", "ngram", "--workloads", "pycode"])
    assert calls == [("org/draft", "v1.2")] and seen == [("org/t", "r1")]
