"""Distilled draft LM (DistillSpec): loss against a hand-written reference, identical draft -> TV 0
and acceptance 1, init paths and vocabulary checks, on-policy sampling, LoRA adapter and HF export
round trips, the debug recipe through the function API, and the proposer in the speculative loop."""
from __future__ import annotations

import functools

import pytest
import torch

try:  # tests/ as a package (tests/__init__.py) or as plain rootdir conftest: both layouts exist in this repo
    from tests.conftest import STORIES, shared_path
except ImportError:
    from conftest import STORIES, shared_path

from draftsmith import config
from draftsmith.heads.draft_lm import DraftLMDrafter
from draftsmith.testing import byte_tokenizer, tiny_target
from tests.helpers import batch_for as shared_batch_for

Config = DraftLMDrafter.Config


def make(target, seed=0, **options):
    torch.manual_seed(seed)
    return DraftLMDrafter.from_target(Config(**options), target)


def perturb(drafter, scale=0.05, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.trainable_parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


batch_for = functools.partial(shared_batch_for, required={"target_logits"}, layers=[], prompt_lengths=(4, 6))

def reference_loss(drafter, target, batch, temperature):
    """Row by row on the unpadded tokens: 0.5 TV + 0.5 KL(p || q), written out from the definitions."""
    total, accept, n = 0.0, 0.0, 0
    for row in range(batch["input_ids"].shape[0]):
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row : row + 1, :length]
        d_logits = drafter.lm(input_ids=ids).logits[0]
        t_logits = target.model(input_ids=ids).logits[0]
        for j in range(length - 1):
            if batch["loss_mask"][row, j + 1]:
                p = torch.softmax(t_logits[j].double() / temperature, -1)
                q = torch.softmax(d_logits[j].double() / temperature, -1)
                total += 0.5 * 0.5 * float((p - q).abs().sum()) + 0.5 * float((p * (p / q).log()).sum())
                accept += float(torch.minimum(p, q).sum())
                n += 1
    return total, accept / n, n


@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_loss_matches_hand_written_reference(temperature):
    target = tiny_target(num_layers=3, hidden=32)
    drafter = make(target, shrink_layers=2, divergence={"tv": 0.5, "fkl": 0.5}, temperature=temperature)
    perturb(drafter)
    batch = batch_for(target, drafter)
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want, want_accept, n = reference_loss(drafter, target, batch, temperature)
    assert got.num_tokens == n == int(batch["loss_mask"][:, 1:].sum())
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.metrics["accept_rate"] == pytest.approx(want_accept, rel=1e-4)
    assert 0.0 <= got.metrics["acc_0"] <= 1.0


def test_identical_draft_gives_zero_tv_and_full_acceptance():
    target = tiny_target(num_layers=2, hidden=32)
    drafter = make(target, shrink_layers=2, divergence="tv")  # a full copy of the target
    with torch.no_grad():
        out = drafter.forward_loss(batch_for(target, drafter))
    assert out.num_tokens > 0
    assert out.loss.item() == pytest.approx(0.0, abs=1e-6)
    assert out.metrics["accept_rate"] == pytest.approx(1.0, abs=1e-6)
    assert out.metrics["acc_0"] == 1.0


def test_training_changes_draft_and_leaves_target_bit_identical():
    target = tiny_target(num_layers=3, hidden=32)
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    drafter = make(target, shrink_layers=1, divergence="jsd")
    start = {k: v.clone() for k, v in drafter.state_dict().items()}
    opt = torch.optim.AdamW(drafter.trainable_parameters(), lr=1e-2)
    out = drafter(batch_for(target, drafter))
    out.loss.backward()
    opt.step()
    assert all(p.grad is None for p in target.model.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.model.state_dict().items())
    assert any(not torch.equal(start[k], v) for k, v in drafter.state_dict().items())
    assert not any(k.startswith("target") for k in drafter.state_dict())  # the target is hidden


def test_pretrained_and_config_init_and_vocabulary_checks(tmp_path):
    target = tiny_target(num_layers=2, hidden=32)
    target.model.save_pretrained(tmp_path / "same")
    target.tokenizer.save_pretrained(tmp_path / "same")
    same = make(target, init="pretrained", path=str(tmp_path / "same"), divergence="rkl")
    with torch.no_grad():
        out = same.forward_loss(batch_for(target, same))
    assert out.loss.item() == pytest.approx(0.0, abs=1e-6) and out.metrics["accept_rate"] == pytest.approx(1.0)

    other = byte_tokenizer()
    other.add_tokens(["<extra>"])  # one more token: not the target's tokenizer
    target.model.save_pretrained(tmp_path / "other")
    other.save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="tokenizer differs"):
        make(target, init="pretrained", path=str(tmp_path / "other"))

    small = make(target, init="config", model_config={"hidden_size": 16, "intermediate_size": 32,
                                                       "num_hidden_layers": 1, "num_attention_heads": 2})
    assert small.lm.config.vocab_size == target.vocab_size and small.lm.config.num_hidden_layers == 1
    with pytest.raises(ValueError, match="vocabulary"):
        make(target, init="config", model_config={"vocab_size": 100, "hidden_size": 16, "num_hidden_layers": 1,
                                                   "num_attention_heads": 2, "intermediate_size": 32})


def test_recipe_errors_are_reported_by_key():
    raw = {"drafter": {"kind": "draft_lm", "divergence": {"tv": 1.0, "klx": 1.0}, "init": "pretrained"}}
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(raw)
    assert "klx" in str(err.value) and "unknown" in str(err.value)
    with pytest.raises(config.ConfigError, match="drafter.path"):
        config.from_dict({"drafter": {"kind": "draft_lm", "init": "pretrained"}})


def test_on_policy_greedy_samples_are_the_drafts_own_continuations():
    """A full-copy draft sampling greedily reproduces the target's greedy continuation of each
    row's prompt, despite left padding; the target then scores exactly those sequences."""
    target = tiny_target(num_layers=2, hidden=32)
    drafter = make(target, shrink_layers=2, on_policy_temperature=0.0, on_policy_max_new_tokens=6)
    batch = batch_for(target, drafter)
    new = drafter.sample_on_policy({k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")})
    for row, prompt_len in enumerate([4, 6]):
        prompt = batch["input_ids"][row : row + 1, :prompt_len]
        ref = target.model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6,
                                    do_sample=False, eos_token_id=target.eos_ids, pad_token_id=0)[0]
        length = int(new["attention_mask"][row].sum())
        assert new["input_ids"][row, :length].tolist() == ref.tolist()
        assert new["loss_mask"][row].tolist() == [0] * prompt_len + [1] * (length - prompt_len) + [0] * (
            new["input_ids"].shape[1] - length)
        scored = target.forward(new["input_ids"][row : row + 1, :length]).logits[0]
        torch.testing.assert_close(new["target_logits"][row, :length], scored, rtol=1e-4, atol=1e-5)


def test_on_policy_training_step_runs_and_eval_stays_off_policy():
    target = tiny_target(num_layers=2, hidden=32)
    drafter = make(target, shrink_layers=1, on_policy_fraction=1.0, on_policy_max_new_tokens=5, divergence="tv")
    batch = batch_for(target, drafter)
    out = drafter({k: batch[k] for k in ("input_ids", "attention_mask", "loss_mask")})  # no target_logits needed
    assert out.metrics["on_policy"] == 1.0 and 0 < out.num_tokens <= 2 * 5
    out.loss.backward()
    assert any(float(p.grad.abs().sum()) > 0 for p in drafter.trainable_parameters() if p.grad is not None)
    drafter.eval()
    with torch.no_grad():
        held = drafter(batch)  # evaluation scores the rows as given
    assert held.metrics["on_policy"] == 0.0 and held.num_tokens == int(batch["loss_mask"][:, 1:].sum())


def test_lora_adapter_and_hf_export_round_trip(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, GenerationConfig

    target = tiny_target(num_layers=3, hidden=32)
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["q_proj", "v_proj", "down_proj"]}
    drafter = make(target, shrink_layers=2, lora=lora)
    trainable = drafter.trainable_parameters()
    assert trainable and all("lora_" in n for n, p in drafter.named_parameters() if p.requires_grad)
    opt = torch.optim.AdamW(trainable, lr=5e-2)
    for _ in range(2):
        drafter(batch_for(target, drafter)).loss.backward()
        opt.step()
        opt.zero_grad()
    drafter.eval()
    ids = torch.randint(3, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = drafter.lm(input_ids=ids).logits
        base = make(target, shrink_layers=2).lm(input_ids=ids).logits
    assert not torch.allclose(want, base, atol=1e-4)  # the adapter changed the model

    out = drafter.save_hf(tmp_path / "export", target.tokenizer)
    for name in ("config.json", "model.safetensors", "tokenizer_config.json", "generation_config.json",
                 "adapter/adapter_config.json", "adapter/adapter_model.safetensors"):
        assert (out / name).exists(), name
    merged = AutoModelForCausalLM.from_pretrained(out)
    assert GenerationConfig.from_pretrained(out).eos_token_id == target.model.generation_config.eos_token_id
    reloaded = PeftModel.from_pretrained(make(target, shrink_layers=2).lm, out / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(reloaded(input_ids=ids).logits, want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- stories260K
def test_debug_recipe_trains_through_the_function_api(tmp_path, stories_target):
    from draftsmith import checkpoint as ckpt_io
    from draftsmith.train.loop import train

    before = {k: v.clone() for k, v in stories_target.model.state_dict().items()}
    cfg = config.load("recipes/debug/draft_lm-stories260k.yaml", [
        f"target.path={shared_path(STORIES)}", f"data.path={shared_path('data/alpaca/alpaca_en_demo.json')}",
        f"regenerate.output={tmp_path / 'regenerated.jsonl'}", "regenerate.limit=16", "regenerate.max_new_tokens=32",
        "data.eval_samples=4", "train.max_steps=3", "train.eval_every=3", "train.warmup_steps=1",
        f"train.output_dir={tmp_path / 'run'}", "drafter.on_policy_max_new_tokens=8", "logging.progress_bar=false"])
    result = train(cfg, target=stories_target)
    assert len(result.losses) == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    assert 0.0 < result.last_metrics["eval_accept_rate"] <= 1.0 and "eval_acc_0" in result.last_metrics
    assert all(torch.equal(before[k], v) for k, v in stories_target.model.state_dict().items())
    loaded = ckpt_io.load_drafter(result.final_checkpoint, target=stories_target).drafter  # tied weights reload
    fresh = DraftLMDrafter.from_target(cfg.drafter.options, stories_target)
    changed = [k for k, v in fresh.state_dict().items() if not torch.equal(v, loaded.state_dict()[k])]
    assert changed, "training did not change the draft model"
    lm = loaded.lm
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()  # still tied after loading

    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(loaded.save_hf(tmp_path / "hf", stories_target.tokenizer))
    assert exported.config.num_hidden_layers == 2 and exported.config.tie_word_embeddings
    ids = torch.tensor([[1, 200, 300, 400]])
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, lm(input_ids=ids).logits)


@pytest.mark.parametrize("lora", [None, {"r": 4, "alpha": 8}])
def test_proposer_in_the_speculative_loop_is_lossless(stories_target, lora):
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.eval.proposers import from_drafter

    drafter = make(stories_target, shrink_layers=2, lora=lora)
    proposer = from_drafter(drafter, stories_target)
    accepted = 0
    for text in ["Once upon a time", "The little dog was sad because"]:
        ids = stories_target.tokenizer(text, return_tensors="pt").input_ids[0]
        base = generate(stories_target, None, ids, LoopConfig(k=0, max_new_tokens=24))
        spec = generate(stories_target, proposer, ids, LoopConfig(k=3, max_new_tokens=24))
        assert spec.tokens == base.tokens
        accepted += sum(r.accepted for r in spec.rounds)
    assert accepted > 0  # the 2-layer copy of stories260K agrees with it on some tokens
