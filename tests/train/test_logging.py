"""Experiment tracking: wandb offline writes its run directory with no network, tensorboard writes
event files, metrics.jsonl always, and non-zero ranks write nothing."""
from __future__ import annotations

import json

from draftsmith.config import LoggingConfig
from draftsmith.train.logging import MetricsLogger

METRICS = {"loss": 1.5, "acc_0": 0.5, "acc_1": 0.25, "lr": 1e-3, "grad_norm": 0.7, "tokens_per_s": 1000.0,
           "target_share": 0.4}


def test_wandb_offline_writes_run_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    log = MetricsLogger(LoggingConfig(report_to=["console", "wandb"], wandb_mode="offline", progress_bar=False),
                        tmp_path, {"train": {"lr": 1e-3}})
    log.log(1, METRICS)
    log.log(2, {**METRICS, "loss": 1.2})
    log.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), list((tmp_path / "wandb").iterdir())
    # The .wandb log's records are flushed by wandb's service process, sometimes after finish()
    # returns on a loaded machine, so only its header is checked here.
    assert next(runs[0].glob("*.wandb")).read_bytes().startswith(b":W&B")


def test_tensorboard_writes_event_files_with_scalars(tmp_path, capsys):
    log = MetricsLogger(LoggingConfig(report_to=["console", "tensorboard"], progress_bar=False), tmp_path, {"a": 1})
    log.log(3, METRICS)
    log.close()
    events = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"loss", "acc_0", "lr", "grad_norm", "tokens_per_s", "target_share"} <= set(acc.Tags()["scalars"])
    assert acc.Scalars("loss")[0].step == 3
    line = capsys.readouterr().out
    assert "loss 1.5000" in line and "acc/pos [0.50 0.25]" in line and "gnorm 0.700" in line
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert record["step"] == 3 and record["loss"] == 1.5


def test_non_zero_rank_logs_nothing(tmp_path, capsys):
    log = MetricsLogger(LoggingConfig(report_to=["console", "tensorboard", "wandb"]), tmp_path / "r1", {}, rank=1)
    log.start_progress(10)
    log.log(1, METRICS)
    log.advance(METRICS)
    log.info("hello")
    log.close()
    assert not (tmp_path / "r1").exists()
    assert capsys.readouterr().out == ""
