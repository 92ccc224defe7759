"""Issue 11 (security, lose nothing, training): a received trainer state cannot run code, a
checkpoint cannot turn on trust_remote_code, a second run never writes over another run,
rotation and resume follow write order, interrupted writes are cleaned, metrics.jsonl holds each
step once, a changed lr on resume is applied, fp16 gets a gradient scaler, and logged metrics are
pooled by tokens."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from draftsmith import checkpoint as ckpt_io
from draftsmith.targets import load as target_mod
from draftsmith.train import checkpoint, parallel
from draftsmith.train.loop import Trainer, lr_lambda, train


def _metrics(out_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


class _Payload:
    """Unpickling this calls Path.write_text(marker, "pwned"): the planted code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "pwned"))


def test_planted_pickle_in_trainer_state_is_refused(tmp_path):
    ckpt = tmp_path / "received" / "step_0000010"
    ckpt.mkdir(parents=True)
    marker = tmp_path / "pwned.txt"
    torch.save({"step": 10, "optimizer": _Payload(marker)}, ckpt / "trainer_state.pt")
    with pytest.raises(ValueError, match="could run code.*refused"):
        checkpoint.load_trainer_state(ckpt)
    assert not marker.exists()


def test_trainer_state_round_trips_under_weights_only(tiny_run):
    cfg = tiny_run("ws", "train.max_steps=2")
    train(cfg)
    state = checkpoint.load_trainer_state(Path(cfg.train.output_dir) / "final")  # weights_only=True
    assert state["step"] == 2 and torch.is_tensor(state["rng"]["numpy"]["keys"])
    checkpoint.set_rng_state(state["rng"])  # tensors back into python / numpy / torch generators


def test_checkpoint_config_cannot_turn_on_trust_remote_code(tiny_run, monkeypatch):
    cfg = tiny_run("trc", "train.max_steps=1")
    final = train(cfg).final_checkpoint
    raw = yaml.safe_load((final / "config.yaml").read_text())
    raw["target"]["trust_remote_code"] = True  # a received checkpoint asks for it
    (final / "config.yaml").write_text(yaml.safe_dump(raw))
    seen = []
    real_load = target_mod.load

    def spy(path, dtype="float32", device="auto", revision=None, trust_remote_code=False, gguf_file=None):
        seen.append(trust_remote_code)
        return real_load(path, dtype, device, revision, False, gguf_file=gguf_file)

    monkeypatch.setattr(target_mod, "load", spy)
    ckpt_io.load_drafter(final)
    ckpt_io.load_drafter(final, trust_remote_code=True)  # only the caller's explicit flag enables it
    assert seen == [False, True]


def test_second_run_into_a_used_output_dir_is_refused_unless_overwrite(tiny_run):
    cfg = tiny_run("used", "train.max_steps=2")
    train(cfg)
    out = Path(cfg.train.output_dir)
    (out / "notes.txt").write_text("mine")
    before = (out / "final" / "drafter.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a run.*train.resume=true.*--overwrite"):
        Trainer(tiny_run("used", "train.max_steps=3"))
    assert (out / "final" / "drafter.safetensors").read_bytes() == before
    result = train(tiny_run("used", "train.max_steps=3", "train.seed=5"), overwrite=True)
    assert result.steps == 3 and (out / "notes.txt").read_text() == "mine"
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3]  # the old run's log is gone, not appended to


def test_rotation_and_resume_follow_write_order(tiny_run):
    old = tiny_run("branch", "train.save_every=2", "train.keep_last=2")
    train(old)  # step_2, step_4 (final at 6)
    out = Path(old.train.output_dir)
    assert [p.name for p in checkpoint.step_dirs(out)] == ["step_0000002", "step_0000004"]
    # continue from the earlier step_2 with another save interval: step_3 is newer than step_4
    again = tiny_run("branch", "train.save_every=1", "train.keep_last=2", f"train.resume={out / 'step_0000002'}")
    train(again, stop_after=3)
    assert checkpoint.latest(out).name == "step_0000003"
    assert [p.name for p in checkpoint.step_dirs(out)] == ["step_0000004", "step_0000003"]  # oldest written first


def test_resume_cleans_interrupted_writes_and_logs_each_step_once(tiny_run):
    cfg = tiny_run("kill", "train.save_every=2")
    train(cfg, stop_after=3)  # "killed" after step 3: metrics hold 1..3, the newest checkpoint is step 2
    out = Path(cfg.train.output_dir)
    torn = out / ".step_0000004.tmp-abc123"
    torn.mkdir()
    (torn / "drafter.safetensors").write_bytes(b"half")
    (out / "metrics.jsonl").open("a").write('{"step": 4, "loss": ')  # a torn last line
    train(tiny_run("kill", "train.save_every=2", "train.resume=true"))
    assert not torn.exists()
    assert [r["step"] for r in _metrics(out)] == [1, 2, 3, 4, 5, 6]


def test_changed_lr_on_resume_is_applied(tiny_run, capsys):
    cfg = tiny_run("lr", "train.save_every=2")
    train(cfg, stop_after=2)
    resumed = tiny_run("lr", "train.save_every=2", "train.resume=true", "train.lr=0.006")
    train(resumed)
    assert "train.lr changed from 0.003" in capsys.readouterr().out
    lrs = {r["step"]: r["lr"] for r in _metrics(resumed.train.output_dir)}
    factor = lr_lambda(resumed.train, 6)
    for step in (3, 4, 5, 6):  # the lr logged after step s is the schedule's value at s
        assert lrs[step] == pytest.approx(0.006 * factor(step), abs=1e-6), step  # logged to 6 decimals


def test_fp16_gets_a_gradient_scaler_that_recovers_underflowing_gradients(tiny_run):
    from draftsmith.train.loop import grad_scaler_for

    assert grad_scaler_for(tiny_run("a").train, torch.device("cpu")) is None  # fp32: none needed
    fp16 = tiny_run("fp16", "train.precision=fp16", "train.max_steps=2")
    trainer = Trainer(fp16)
    assert isinstance(trainer.scaler, torch.amp.GradScaler)
    trainer.run()
    state = checkpoint.load_trainer_state(trainer.output_dir / "final")
    assert state["grad_scaler"]["scale"] > 1
    # The mechanism: a gradient of 1e-8 flows through fp16 as 0 unless the loss is scaled.
    ctx = parallel.ParallelContext()
    updates = {}
    for name, scaler in (("plain", None), ("scaled", torch.amp.GradScaler("cpu", init_scale=4096.0))):
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 4)
        torch.nn.init.zeros_(layer.weight)  # so the update is exactly -grad (no rounding against the weight)
        opt = torch.optim.SGD(layer.parameters(), lr=1.0)
        before = layer.weight.detach().clone()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = (layer(torch.ones(1, 4)) * 1e-8).sum()
        ctx.backward(scaler.scale(loss) if scaler is not None else loss)
        ctx.optimizer_step(opt, list(layer.parameters()), global_tokens=1.0, max_grad_norm=1e9, scaler=scaler)
        updates[name] = (layer.weight.detach() - before).abs().max().item()
    assert updates["plain"] == 0.0 and updates["scaled"] == pytest.approx(1e-8, rel=0.01)


def test_fp16_with_a_sharded_backend_is_refused(tiny_run):
    from draftsmith.train.loop import grad_scaler_for

    cfg = tiny_run("x", "train.precision=fp16")
    cfg.train.backend = "fsdp2"
    with pytest.raises(ValueError, match="fp16 is not supported with train.backend=fsdp2.*bf16"):
        grad_scaler_for(cfg.train, torch.device("cpu"))


def test_logged_per_position_accuracy_is_weighted_by_tokens(tiny_run):
    cfg = tiny_run("pool", "train.batch_size=1", "train.grad_accum=4", "train.max_steps=1")
    trainer = Trainer(cfg)
    seen = []
    model = trainer.model

    def recording(batch):
        out = model(batch)
        m = (batch["loss_mask"] * batch["attention_mask"]).float()
        seen.append((out.metrics, [float(m[:, 2 + t:].sum()) for t in range(3)]))
        return out

    trainer.model = recording
    metrics = trainer._train_step()
    assert len(seen) == 4 and len({counts[0] for _, counts in seen}) > 1  # micro-batches of unequal size
    for key in ("acc", "loss"):
        for t in range(3):
            pooled = sum(m[f"{key}_{t}"] * c[t] for m, c in seen) / sum(c[t] for _, c in seen)
            assert metrics[f"{key}_{t}"] == pytest.approx(pooled, rel=1e-9), (key, t)
    plain = sum(m["loss_0"] for m, _ in seen) / len(seen)  # the old unweighted mean
    assert abs(metrics["loss_0"] - plain) > 1e-4 * plain  # this data tells the two apart


def test_deepspeed_engine_files_are_checked_before_deepspeed_unpickles_them(tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.runtime.zero.config import ZeroStageEnum

    state = tmp_path / "engine" / "state"
    state.mkdir(parents=True)
    torch.save({"zero_stage": ZeroStageEnum(2), "flat": [torch.zeros(3)]}, state / "zero_pp_rank_0_optim_states.pt")
    parallel.check_engine_files(tmp_path / "engine")  # what DeepSpeed writes passes
    marker = tmp_path / "pwned.txt"
    torch.save({"optimizer_state_dict": _Payload(marker)}, state / "mp_rank_00_model_states.pt")
    with pytest.raises(ValueError, match="mp_rank_00_model_states.pt holds objects other than.*refused"):
        parallel.check_engine_files(tmp_path / "engine")
    assert not marker.exists()


def test_a_resume_that_changes_the_step_count_runs_the_new_schedule_from_its_first_step(tiny_run, capsys):
    cfg = tiny_run("longer", "train.max_steps=4", "train.warmup_steps=1")
    train(cfg)  # a finished run: its cosine ended at step 4 (the lr there is lr * min_lr_ratio)
    out = Path(cfg.train.output_dir)
    assert torch.load(out / "final" / "trainer_state.pt", weights_only=True)["total_steps"] == 4
    longer = tiny_run("longer", "train.max_steps=8", "train.warmup_steps=1", f"train.resume={out / 'final'}")
    new, old = lr_lambda(longer.train, 8), lr_lambda(longer.train, 4)
    trainer = Trainer(longer)
    trainer.resume_from(trainer.resume_path)
    # step 5 runs at the 8-step schedule's lr, not at the finished schedule's floor the optimizer state held
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(longer.train.lr * new(4))
    assert longer.train.lr * new(4) > 2 * longer.train.lr * old(4)
    said = capsys.readouterr().out
    assert "resumed from" in said and "ends at step 4; this run's ends at step 8" in said
    assert "raises the lr again" in said
    trainer.release()

    same = tiny_run("same", "train.max_steps=4", "train.save_every=2")
    train(same, stop_after=2)
    capsys.readouterr()
    train(tiny_run("same", "train.max_steps=4", "train.save_every=2", "train.resume=true"))
    said = capsys.readouterr().out
    assert "resumed from" in said and "trained on a schedule" not in said  # same step count: nothing to say
