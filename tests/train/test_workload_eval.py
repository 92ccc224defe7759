"""train.workload_eval: training measures the drafter on the target's own greedy answers to a workload's prompts
(the contexts draftsmith's loop sees), logs eval_<workload>/acc_i beside the held-out rows' eval_acc_i, and
`draftsmith plan --workload NAME` fits that curve."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith import config
from draftsmith.core.errors import UserError
from draftsmith.eval import workloads
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.report import learning_curve as lc
from draftsmith.train.loop import Trainer
from tests.conftest import refused_in_one_line


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "asks.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"ask-{i}", "prompt": f"question {i} about {'abc' * (i + 1)}"})
                              for i in range(5)) + "\n")
    return path


def _records(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_rows_are_each_prompt_and_the_targets_own_greedy_answer_with_the_answer_masked_in(tiny_run, prompts):
    cfg = tiny_run("rows", "train.eval_every=3", f"train.workload_eval.workloads=[jsonl:{prompts}]",
                   "train.workload_eval.num_prompts=3", "train.workload_eval.max_new_tokens=8")
    trainer = Trainer(cfg)
    (sets,) = trainer.workload_sets
    assert sets.key == "asks" and len(sets.rows) == 3
    # prompt_format auto: as `draftsmith eval` prompts a checkpoint of this recipe (chat rows, a target without a
    # chat template: draftsmith's plain chat format, not the raw text that encode's own auto would give)
    assert workloads.training_prompt_format(config.to_dict(cfg), trainer.target.tokenizer) == "plain"
    for item, row in zip(workloads.load(f"jsonl:{prompts}", None, 3), sets.rows):
        prompt, _ = workloads.encode(item, trainer.target.tokenizer, "plain")
        assert prompt.tolist() != workloads.encode(item, trainer.target.tokenizer, "raw")[0].tolist()
        answer = generate(trainer.target, None, prompt, LoopConfig(k=0, max_new_tokens=8)).tokens
        assert row["id"] == item["id"]
        assert row["input_ids"].tolist() == prompt.tolist() + answer  # what a lossless loop must output
        assert row["loss_mask"].tolist() == [0] * len(prompt) + [1] * len(answer)
    assert sets.answer_tokens == sum(int(r["loss_mask"].sum()) for r in sets.rows)


def test_each_evaluation_logs_the_workloads_acceptance_beside_the_held_out_rows(tiny_run, prompts, capsys):
    cfg = tiny_run("logged", "train.eval_every=3", f"train.workload_eval.workloads=[jsonl:{prompts}]",
                   "train.workload_eval.num_prompts=2", "train.workload_eval.max_new_tokens=6")
    trainer = Trainer(cfg)
    trainer.run()
    evals = [r for r in _records(trainer.output_dir) if "eval_acc_0" in r]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert {"eval_asks/loss", "eval_asks/acc_0", "eval_asks/acc_1", "eval_asks/acc_2"} <= set(r)
    # the logged numbers are the drafter's on those rows alone, not the held-out rows'
    trainer.drafter.eval()
    with torch.no_grad():
        again = trainer._measure(trainer.workload_sets[0].rows)
    assert evals[-1]["eval_asks/acc_0"] == pytest.approx(again["acc_0"], abs=1e-6)  # the log keeps 6 decimals
    assert evals[-1]["eval_asks/loss"] == pytest.approx(again["loss"], abs=1e-6)
    assert evals[-1]["eval_asks/loss"] != pytest.approx(evals[-1]["eval_loss"])
    # the target's features were kept once (not its logits, replayed from the last hidden state): the same numbers
    # as a target forward at each evaluation
    rows = trainer.workload_sets[0].rows
    assert all({"aux_hidden_states", "last_hidden_state"} <= set(r) and "target_logits" not in r for r in rows)
    with torch.no_grad():
        online = trainer._measure([{k: r[k] for k in ("id", "input_ids", "loss_mask")} for r in rows])
    assert online == pytest.approx(again, abs=1e-5)
    assert capsys.readouterr().out.count("on the loop's contexts: asks acc ") == 2


def test_without_held_out_rows_the_workloads_are_still_evaluated_and_no_held_out_number_is_made_up(tiny_run, prompts):
    cfg = tiny_run("no-heldout", "data.eval_samples=0", "train.eval_every=2",
                   f"train.workload_eval.workloads=[jsonl:{prompts}]", "train.workload_eval.num_prompts=2",
                   "train.workload_eval.max_new_tokens=4")
    trainer = Trainer(cfg)
    trainer.run()
    evals = [r for r in _records(trainer.output_dir) if "eval_asks/acc_0" in r]
    assert [r["step"] for r in evals] == [2, 4, 6]
    assert not any("eval_acc_0" in r or "eval_loss" in r for r in evals)
    with pytest.raises(UserError, match=r"logged no held-out evaluation, only its workloads' \(asks\); pass --workload"):
        lc.read_points(trainer.output_dir)
    assert len(lc.read_points(trainer.output_dir, "asks")[0]) == 3


def _workload_log(run, tokens_per_step=2e4):
    """metrics.jsonl whose mt_bench curve sits below the held-out one (as the loop's contexts do on SmolLM2)."""
    lines = []
    for step in range(20, 321, 20):
        x = step * tokens_per_step / 1e6
        record = {"step": step, "tokens_seen": step * tokens_per_step, "tokens_per_s_total": 2000.0}
        for i, (a, b) in enumerate([(0.8, 0.10), (0.75, 0.12), (0.72, 0.13)]):
            record[f"eval_acc_{i}"] = a - b * x ** -0.5
            record[f"eval_mt_bench/acc_{i}"] = a - 0.2 - b * x ** -0.5
        lines.append(json.dumps(record))
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_plan_fits_a_workloads_curve_and_names_the_ones_logged_when_asked_for_another(tmp_path, capsys):
    from draftsmith.cli import main as cli_main

    run = _workload_log(tmp_path / "run")
    held, _ = lc.read_points(run)
    mt, _ = lc.read_points(run, "mt_bench")
    assert [p.step for p in mt] == [p.step for p in held]
    assert all(m.acc[0] == pytest.approx(h.acc[0] - 0.2) for m, h in zip(mt, held))
    assert cli_main(["plan", str(run), "--workload", "mt_bench", "--goal-tau", "1.8"]) == 0
    text = capsys.readouterr().out
    assert "mt_bench acceptance against training tokens" in text and "plan: 6.4M tokens, mt_bench acc_0" in text
    assert "tau 1.8 at k=3" in text
    line = refused_in_one_line(capsys, ["plan", str(run), "--workload", "gsm8k"], "no evaluation on workload 'gsm8k'")
    assert line.endswith("the run's workloads: mt_bench")  # the held-out eval_acc_0 is no workload


def test_metric_names_of_grouped_and_file_workloads():
    assert lc.metric_name("spec_bench/qa", "acc_0") == "eval_spec_bench.qa/acc_0"
    assert lc.metric_name("jsonl:/data/chats v2.jsonl", "acc_1") == "eval_chats.v2/acc_1"
    # no workload's metric meets a held-out one: a file named selector.jsonl beside a drafter's selector_loss
    assert lc.metric_name("jsonl:/data/selector.jsonl", "loss") != "eval_selector_loss"


@pytest.mark.parametrize("overrides, needle", [
    (["train.workload_eval.workloads=[mt_bench]", "train.eval_every=0"], "set train.eval_every"),
    (["train.workload_eval.workloads=[images]"], "images is an image workload"),
    (["train.workload_eval.workloads=[long_context]"], "long_context fills the target's positions"),
    (["train.workload_eval.workloads=[mt_bench]", "train.target_sharding=fsdp2", "train.backend=fsdp2"],
     "train.target_sharding: replicate"),
    (["train.workload_eval.workloads=[mt_bench]", "train.workload_eval.num_prompts=0"], "num_prompts: must be >= 1"),
])
def test_bad_workload_settings_are_refused_by_key(overrides, needle):
    raw = {"target": {"path": "t"}, "data": {"path": ["d.jsonl"]}, "train": {"eval_every": 10}}
    with pytest.raises(config.ConfigError, match="train.workload_eval") as exc:
        config.from_dict(raw, overrides=overrides)
    assert needle in str(exc.value)


@pytest.mark.parametrize("workload, needle", [
    ("jsonl:{tmp}/none.jsonl", r"train.workload_eval.workloads: jsonl:.*none.jsonl: no such file"),
    ("gsm8kk", r"train.workload_eval.workloads: unknown workload 'gsm8kk' \(did you mean 'gsm8k'\?\)"),
    ("jsonl:{tmp}/asks.jsonl, jsonl:{tmp}/more/asks.jsonl",
     r"jsonl:.*/asks.jsonl and jsonl:.*/more/asks.jsonl would both log as eval_asks/\*; rename one prompt file"),
    ("mt_bench", r"train.workload_eval.workloads: mt_bench: workload file .*question.jsonl is missing; set "
                 r"DRAFTSMITH_DATA"),
])
def test_a_bad_workload_is_one_line_naming_it_before_any_data_is_read(tiny_run, tmp_path, monkeypatch, prompts,
                                                                        workload, needle):
    from draftsmith.train import loop

    (tmp_path / "more").mkdir()
    (tmp_path / "more" / "asks.jsonl").write_text(prompts.read_text())

    def no_data(*args, **kwargs):
        raise AssertionError("the data was read before the workloads were checked")

    monkeypatch.setattr(loop, "load_data", no_data)
    monkeypatch.setenv("DRAFTSMITH_DATA", str(tmp_path / "no-data-here"))
    cfg = tiny_run("bad", "train.eval_every=3", f"train.workload_eval.workloads=[{workload.format(tmp=tmp_path)}]")
    with pytest.raises(UserError, match=needle):
        Trainer(cfg)


def test_the_benchmark_prints_the_checkpoints_teacher_forced_numbers_beside_the_loops(tiny_run, prompts, tmp_path):
    """benchmarks/bench_workload_eval.py: the same acc_i a training evaluation logs for the final weights, beside the
    loop's per-position acceptance read from a `draftsmith eval` result, with its settings."""
    import subprocess
    import sys

    from tests.conftest import REPO

    cfg = tiny_run("bench", "train.eval_every=6", f"train.workload_eval.workloads=[jsonl:{prompts}]",
                   "train.workload_eval.num_prompts=2", "train.workload_eval.max_new_tokens=6")
    Trainer(cfg).run()
    logged = [r for r in _records(tmp_path / "bench") if "eval_asks/acc_0" in r][-1]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(config.to_yaml(cfg))
    result = tmp_path / "loop.json"
    result.write_text(json.dumps({"config": {"num_prompts": 2, "max_new_tokens": 6, "prompt_format": "auto"},
                                  "workloads": {f"jsonl:{prompts}": {"aggregate": {
                                      "per_position_acceptance": [0.5, 0.25, 0.125],
                                      "acceptance_length": {"pooled": 1.7}}}}}))
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_workload_eval.py"), str(recipe),
                          str(tmp_path / "bench" / "final"), "--eval-result", str(result)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout
    row = next(line for line in out.splitlines() if line.startswith(f"| jsonl:{prompts} |"))
    cells = [c.strip() for c in row.split("|")[2:6]]
    assert cells[0] == " / ".join(f"{logged[f'eval_asks/acc_{i}']:.3f}" for i in range(3))
    assert cells[2:] == ["0.500 / 0.250 / 0.125", "1.700"]
    assert any(line.startswith("| held-out rows |") for line in out.splitlines())
