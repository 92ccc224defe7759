"""Adding a drafter kind is one file in heads/ plus its registration (issue 18): a toy kind defined and
registered HERE only (no other file names it) is known to `draftsmith ls`, `inspect`, `validate`, the
training loop, checkpoint loading and the speculative loop, and the architecture matrix."""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from draftsmith import config, testing
from draftsmith.cli import main as cli_main
from draftsmith.core.sampling import logits_to_probs, sample
from draftsmith.heads import DRAFTERS
from draftsmith.heads.base import Draft, Drafter, StepOutput, range_problems
from draftsmith.testing import matrix

TOY = "toy_skip"


class ToySkipDrafter(Drafter):
    """One linear head on the target's last hidden state h_j predicting token j+2 (a one-head Medusa)."""

    kind = TOY
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "last_hidden_state"})
    tiny_options = {"scale": 0.5}

    @dataclass
    class Config:
        # Multiplies the head's logits (a toy option, range-checked like every kind's).
        scale: float = 1.0

        def problems(self) -> list[str]:
            return range_problems(self, {"scale": "> 0"})

    def __init__(self, cfg, hidden: int, vocab: int):
        super().__init__()
        self.cfg = cfg
        self.head = nn.Linear(hidden, vocab, bias=False)

    @classmethod
    def from_target(cls, cfg, target, token_counts=None):
        return cls(cfg, target.hidden_size, target.vocab_size).to(target.device)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.to(self.head.weight.dtype)) * self.cfg.scale  # [b, s, h] -> [b, s, V]

    def forward_loss(self, batch):
        logits = self.logits(batch["last_hidden_state"][:, :-2])  # [b, s-2, V]: position j predicts j+2
        labels, mask = batch["input_ids"][:, 2:], batch["loss_mask"][:, 2:].float()
        loss = (nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none") * mask).sum()
        hits = ((logits.argmax(-1) == labels).float() * mask).sum()
        n = int(mask.sum())
        return StepOutput(loss=loss, metrics={"acc_0": float(hits) / max(n, 1)}, num_tokens=n)

    def make_proposer(self, target):
        return ToyProposer(self)


class ToyProposer:
    name = TOY

    def __init__(self, drafter):
        self.drafter, self.last = drafter, None

    def begin(self, prompt_ids):
        self.last = None

    @torch.no_grad()
    def commit(self, context, num_new, target_out):
        self.last = target_out.hidden_states[-1][:, -1:]  # [1, m, h] -> [1, 1, h]

    @torch.no_grad()
    def propose(self, context, k, sampling, generator=None):
        q = logits_to_probs(self.drafter.logits(self.last)[0, -1], sampling)  # [V]
        token = q.argmax() if sampling.greedy else sample(q, generator)
        return Draft(tokens=token.view(1).repeat(k), probs=q.expand(k, -1))


@pytest.fixture
def toy_kind(monkeypatch):
    """Registers the toy kind for one test (DRAFTERS is restored afterwards)."""
    monkeypatch.setitem(DRAFTERS._items, TOY, ToySkipDrafter)
    return TOY


def recipe(tmp_path, target_dir, data, **options) -> dict:
    return {"target": {"path": str(target_dir), "device": "cpu"},
            "data": {"path": [str(data)], "max_length": 48, "eval_samples": 2},
            "drafter": {"kind": TOY, **options},
            "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2, "batch_size": 2, "lr": 1e-3,
                      "warmup_steps": 1, "log_every": 1, "eval_every": 0},
            "logging": {"progress_bar": False, "report_to": []}}


def test_ls_inspect_and_validate_know_a_kind_registered_in_a_test(toy_kind, tmp_path, capsys):
    assert cli_main(["ls"]) == 0
    assert TOY in capsys.readouterr().out
    target = testing.arch_target("llama3")
    target_dir = tmp_path / "target"
    target.model.save_pretrained(target_dir)
    target.tokenizer.save_pretrained(target_dir)
    capsys.readouterr()
    assert cli_main(["inspect", str(target_dir), "--json", "--kind", TOY]) == 0
    out = capsys.readouterr().out
    rep = json.loads(out[out.index("{"):])
    assert rep["kinds"][TOY] == {"refusals": [], "formats": {}}
    assert rep["feature_bytes_per_token"][TOY]["float32"] == 32 * 4 + 5  # the last hidden state only
    import yaml

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(recipe(tmp_path, target_dir, tmp_path / "d.jsonl", scale=-1.0)))
    assert cli_main(["validate", str(bad)]) == 1
    assert "drafter.scale: must be > 0" in capsys.readouterr().out


def test_training_checkpoint_and_the_speculative_loop_know_it(toy_kind, tmp_path):
    from draftsmith.checkpoint import load_drafter
    from draftsmith.eval import proposers
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.train.loop import Trainer

    target = testing.arch_target("llama3")
    target_dir = tmp_path / "target"
    target.model.save_pretrained(target_dir)
    target.tokenizer.save_pretrained(target_dir)
    cfg = config.from_dict(recipe(tmp_path, target_dir, matrix.data_file(tmp_path)))
    trainer = Trainer(cfg, target)
    before = trainer.drafter.head.weight.detach().clone()
    result = trainer.run()
    assert len(result.losses) == 2 and not torch.equal(before, trainer.drafter.head.weight)
    loaded = load_drafter(tmp_path / "run" / "final", target=target)
    assert loaded.drafter.kind == TOY and torch.equal(loaded.drafter.head.weight, trainer.drafter.head.weight)
    prompt = matrix.prompt_for(target)
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=12, eos_ids=[])).tokens
    spec = generate(target, proposers.from_drafter(loaded.drafter, target), prompt,
                    LoopConfig(k=3, max_new_tokens=12, eos_ids=[]))
    assert spec.tokens == base and spec.rounds


def test_the_architecture_matrix_runs_it(toy_kind, tmp_path):
    assert TOY in matrix.matrix_kinds()
    (cell,) = matrix.run_arch("llama3", tmp_path, kinds=[TOY])
    assert cell.status == "ok", cell.reasons
    assert cell.checks["features"] == "last hidden state"
    assert cell.checks["export"] == f"no export format takes {TOY} drafters"
