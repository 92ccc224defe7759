"""The training loop: parameters change and the target does not, resume reproduces the
uninterrupted losses, checkpoints are atomic and reload into a working drafter."""
from __future__ import annotations

import pytest
import torch

from draftsmith import checkpoint as ckpt_io
from draftsmith import config
from draftsmith.testing import tiny_target
from draftsmith.train import checkpoint
from draftsmith.train.loop import Trainer, train


def test_drafter_learns_and_target_stays_bit_identical(tiny_run):
    cfg = tiny_run("a")
    trainer = Trainer(cfg)
    target_before = {k: v.clone() for k, v in trainer.target.model.state_dict().items()}
    drafter_before = {k: v.clone() for k, v in trainer.drafter.state_dict().items()}
    result = trainer.run()
    changed = [k for k, v in trainer.drafter.state_dict().items() if not torch.equal(v, drafter_before[k])]
    assert {"fc.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight"} <= set(changed)
    assert all(torch.equal(v, target_before[k]) for k, v in trainer.target.model.state_dict().items())
    assert len(result.losses) == 6 and all(torch.isfinite(torch.tensor(result.losses)))
    assert result.losses[-1] < result.losses[0]
    assert {"acc_0", "acc_1", "acc_2", "lr", "grad_norm", "tokens_per_s", "target_share"} <= set(result.last_metrics)


def test_resume_reproduces_uninterrupted_losses(tiny_run):
    full = train(tiny_run("full"))
    cfg = tiny_run("interrupted", "train.save_every=2")
    partial = train(cfg, stop_after=3)  # "crash" after step 3; the newest checkpoint is step 2
    assert checkpoint.latest(cfg.train.output_dir).name == "step_0000002"
    resumed = train(tiny_run("interrupted", "train.save_every=2", "train.resume=true"))
    assert partial.losses[:3] == pytest.approx(full.losses[:3], abs=1e-6)
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6)


def test_resume_extends_a_finished_run_from_final(tiny_run):
    """train.resume=true on a finished run with a larger max_steps continues from `final` (step 6),
    not from the older step checkpoint (step 4), which would redo steps 5 and 6."""
    cfg = tiny_run("done", "train.save_every=4")
    first = train(cfg)
    assert [p.name for p in checkpoint.step_dirs(cfg.train.output_dir)] == ["step_0000004"]
    more = tiny_run("done", "train.save_every=4", "train.resume=true", "train.max_steps=8")
    trainer = Trainer(more)
    assert trainer.resume_path.name == "final"
    extended = trainer.run()
    assert len(extended.losses) == 8 and extended.losses[:6] == pytest.approx(first.losses, abs=0)


def test_checkpoint_reloads_and_rotation(tiny_run):
    cfg = tiny_run("rot", "train.save_every=1", "train.keep_last=2")
    trainer = Trainer(cfg)
    result = trainer.run()
    steps = [p.name for p in checkpoint.step_dirs(cfg.train.output_dir)]
    assert steps == ["step_0000004", "step_0000005"]
    loaded = ckpt_io.load_drafter(result.final_checkpoint)
    for key, value in trainer.drafter.state_dict().items():
        assert torch.equal(loaded.drafter.state_dict()[key], value), key
    assert config.to_dict(loaded.config) == config.to_dict(cfg)
    assert loaded.meta["feature_layers"] == trainer.drafter.feature_layers()


def test_crash_mid_write_keeps_previous_checkpoint(tiny_run, monkeypatch):
    cfg = tiny_run("crash", "train.max_steps=2")
    trainer = Trainer(cfg)
    trainer.run()
    final = trainer.output_dir / "final"
    before = (final / "drafter.safetensors").read_bytes()

    def torn_save(tensors, path):
        with open(path, "wb") as f:
            f.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_io, "save_file", torn_save)
    with pytest.raises(OSError, match="disk full"):
        ckpt_io.save(final, trainer.drafter, trainer.target, cfg, step=99)
    assert (final / "drafter.safetensors").read_bytes() == before
    assert [p.name for p in trainer.output_dir.iterdir() if ".tmp-" in p.name] == []
    assert ckpt_io.load_drafter(final).meta["step"] == 2


def test_checkpoint_for_another_target_is_refused(tiny_run):
    cfg = tiny_run("other", "train.max_steps=1")
    result = train(cfg)
    with pytest.raises(ValueError, match="was trained for target .* fingerprint"):
        ckpt_io.load_drafter(result.final_checkpoint, target=tiny_target(num_layers=4, hidden=32, seed=1))


def _recording_loss_masks(trainer) -> list:
    """Wrap the trainer's drafter call so each batch's loss_mask and attention_mask are kept."""
    seen, call = [], trainer.model.forward

    def forward(batch):
        seen.append((batch["loss_mask"].clone(), batch["attention_mask"].clone()))
        return call(batch)

    trainer.model.forward = forward
    return seen


def test_loss_on_prompt_trains_every_real_position_and_evaluates_on_the_answers(tiny_run):
    for on in (False, True):
        trainer = Trainer(tiny_run(f"lop-{on}", f"train.loss_on_prompt={str(on).lower()}"))
        seen = _recording_loss_masks(trainer)
        trainer._train_step()
        loss_mask, attention = seen[-1]
        assert bool((loss_mask != attention).any()) is not on  # the prompt positions: trained only with the option
        assert bool((loss_mask <= attention).all())
        trainer.evaluate()
        held_loss, held_attention = seen[-1]
        assert bool((held_loss < held_attention).any())  # held out: the answers' mask, either way


def test_loss_on_prompt_is_refused_for_a_kind_without_target_labels_by_key():
    raw = {"target": {"path": "t"}, "data": {"path": ["d.jsonl"]}, "drafter": {"kind": "medusa"},
           "train": {"loss_on_prompt": True}}
    with pytest.raises(config.ConfigError, match="train.loss_on_prompt: drafter kind medusa"):
        config.from_dict(raw)
    config.from_dict({**raw, "drafter": {"kind": "eagle3"}})  # a kind that learns from the target's logits
    packed = {**raw, "data": {"path": ["d.jsonl"], "pack_length": 2048}}
    config.from_dict({**packed, "drafter": {"kind": "eagle3"}})  # its labels stay in their document
    with pytest.raises(config.ConfigError, match="train.loss_on_prompt: drafter kind peagle.*data.pack_length"):
        config.from_dict({**packed, "drafter": {"kind": "peagle"}})


def test_every_rank_checks_output_dir_before_rank_0_writes_in_it(tiny_run, monkeypatch):
    """Ranks meet at a barrier between the output_dir check and the first write (metrics.jsonl): without it a
    rank that starts late finds rank 0's fresh log and refuses the directory (a 2-rank fsdp2 run failed so)."""
    from draftsmith.train import loop, parallel

    events = []
    claim, setup, logger = Trainer._claim_output_dir, parallel.setup, loop.MetricsLogger

    def recording_setup(*args, **kwargs):
        ctx = setup(*args, **kwargs)
        monkeypatch.setattr(ctx, "barrier", lambda: events.append("barrier"))
        return ctx

    monkeypatch.setattr(Trainer, "_claim_output_dir", lambda self, overwrite: (events.append("check"), claim(self, overwrite)))
    monkeypatch.setattr(parallel, "setup", recording_setup)
    monkeypatch.setattr(loop, "MetricsLogger", lambda *a, **k: (events.append("first write"), logger(*a, **k))[1])
    Trainer(tiny_run("ranks-meet")).release()
    assert events[:3] == ["check", "barrier", "first write"], events
