"""Expected errors print one line naming the file/key/value and the fix, and exit 2; --debug
shows the traceback. The cases a new user hit (issue 11, items 14-15), each as it is typed."""
from __future__ import annotations

import pytest

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.heads import DRAFTERS


def _one_line_error(capsys, argv: list[str]) -> str:
    assert cli_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_missing_local_target_path_names_the_path_not_a_repo_id(capsys, tmp_path):
    missing = str(tmp_path / "no" / "such-model")
    err = _one_line_error(capsys, ["eval", "--target", missing, "--proposer", "ngram", "--workloads", "pycode"])
    assert missing in err and "no such directory" in err and "repo" not in err.lower()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        cli_main(["eval", "--target", str(tmp_path / "nope"), "--proposer", "ngram", "--workloads", "pycode",
                  "--debug"])


@pytest.mark.parametrize("flags, named", [(["--num-prompts", "-1"], "--num-prompts -1"), (["--k", "-2"], "--k -2"),
                                          (["--top-p", "0"], "--top-p 0.0")])
def test_out_of_range_eval_flags(capsys, flags, named):
    err = _one_line_error(capsys, ["eval", "--target", "builtin:pycode-tiny", "--proposer", "ngram",
                                   "--workloads", "pycode", *flags])
    assert named in err and "must" in err and "population" not in err


def test_workload_typo_suggests_groups(capsys):
    err = _one_line_error(capsys, ["eval", "--target", "builtin:pycode-tiny", "--proposer", "ngram",
                                   "--workloads", "spec_bnch"])
    assert "did you mean 'spec_bench'" in err and "known: " in err and "spec_bench," in err


def test_missing_jsonl_workload_names_the_file_not_data_dir(capsys, tmp_path):
    path = tmp_path / "prompts.jsonl"
    err = _one_line_error(capsys, ["eval", "--target", "builtin:pycode-tiny", "--proposer", "ngram",
                                   "--workloads", f"jsonl:{path}"])
    assert str(path) in err and "--data-dir" not in err


def test_validate_reports_ranges(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("drafter:\n  kind: eagle3\n  ttt_steps: 0\ntrain:\n  lr: -0.001\n")
    assert cli_main(["validate", str(recipe)]) == 1
    out = capsys.readouterr().out
    assert "drafter.ttt_steps: must be >= 1 and <= 64, got 0" in out and "train.lr: must be > 0, got -0.001" in out


# One out-of-range option per drafter kind; each kind's Config reports its own ranges.
BAD_OPTIONS = {"eagle3": ("step_decay", 0.0), "eagle1": ("noise_range", -0.1), "medusa": ("lora_dropout", 1.0),
               "mlp_speculator": ("n_predict", 0), "draft_lm": ("shrink_layers", 0), "dflash": ("block_size", 1),
               "dspark": ("confidence_threshold", 1.0), "peagle": ("down_sample_ratio", 0.0),
               "dflash2": ("selector_top_k", 0)}


def test_every_drafter_kind_has_a_range_case():
    assert set(BAD_OPTIONS) == set(DRAFTERS.names())


@pytest.mark.parametrize("kind", sorted(BAD_OPTIONS))
def test_drafter_config_ranges(kind):
    key, value = BAD_OPTIONS[kind]
    with pytest.raises(config.ConfigError, match=f"drafter.{key}: must be"):
        config.from_dict({"drafter": {"kind": kind, key: value}})
    config.from_dict({"drafter": {"kind": kind}})  # the defaults are in range


def test_relative_missing_target_that_looks_like_a_hub_id(capsys):
    # "org/name" form, not a local directory; the space makes the hub reject it before any network call
    err = _one_line_error(capsys, ["eval", "--target", "no such/model", "--proposer", "ngram", "--workloads", "pycode"])
    assert "'no such/model': no such local directory" in err and "as a Hugging Face id it did not load" in err


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(monkeypatch, capsys):
    """Only UserError (and OSError, unknown names) is expected; a ValueError from inside draftsmith or a library is
    a bug and must keep its traceback instead of being printed as if the user could fix it."""
    from draftsmith.commands import ls
    from draftsmith.core.errors import EXPECTED, ConfigError, UserError

    def bug(args):
        raise ValueError("math domain error")  # what a library raises on a bug

    monkeypatch.setattr(ls, "main", bug)
    with pytest.raises(ValueError, match="math domain error"):
        cli_main(["ls"])

    def user_mistake(args):
        raise UserError("data.path x.jsonl: no such file; pass an existing file")

    monkeypatch.setattr(ls, "main", user_mistake)
    assert _one_line_error(capsys, ["ls"]).endswith("data.path x.jsonl: no such file; pass an existing file")
    assert issubclass(ConfigError, UserError) and ValueError not in EXPECTED


def test_draftsmith_raises_no_bare_value_error_for_user_input():
    """Every `raise ValueError` left in draftsmith/ is an internal invariant (a bug if it fires), listed here."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "draftsmith"
    found = set()
    for file in root.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and \
                    getattr(node.exc.func, "id", None) == "ValueError":
                found.add(str(file.relative_to(root)))
    # registries refusing a name registered twice (core/registry.py and export's engine_versions and
    # REFUSED tables, export/layout.py), the loop's rollback and the hybrid state rollback mode (a LoopConfig
    # field, no flag), the vocabulary loss's shapes, packing and streaming invariants, the testing helpers' own
    # arguments
    assert found == {"core/registry.py", "export/engine_versions.py", "export/layout.py", "eval/loop.py",
                     "targets/state_cache.py", "heads/vocab_loss.py", "data/dataset.py", "data/streaming.py",
                     "testing/__init__.py"}
