"""Medusa heads: vLLM key names, the per-head loss against a hand-written reference, the
proposer's indexing equal to training's, Medusa-2 (LoRA via peft) keeping the target intact and
exporting a reloadable adapter, the debug recipe training, and lossless greedy decoding."""
from __future__ import annotations

import functools

import pytest
import torch

from draftsmith import config
from draftsmith.core.sampling import SamplingParams, logits_to_probs
from draftsmith.data import features
from draftsmith.heads.medusa import MedusaDrafter
from draftsmith.targets.load import TargetOutput
from draftsmith.testing import tiny_target
from tests.conftest import REPO, STORIES, shared_path
from tests.helpers import batch_for as shared_batch_for


def make(seed=0, **options):
    target = tiny_target(num_layers=2, hidden=32, seed=seed)
    drafter = MedusaDrafter.from_target(MedusaDrafter.Config(**options), target)
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # move away from the zero init so every term is exercised
        for p in drafter.blocks.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter


batch_for = functools.partial(shared_batch_for, s=11, required={"last_hidden_state", "target_logits"}, layers=[])

def reference_loss(drafter, batch, mode, offset=2, hard_weight=0.5, greedy_only=False, weights=None):
    """Per row, head and position: head i at position j predicts token j+offset+i; its label is the
    target at position j+offset-1+i (argmax, distribution, mix) or the data token; with greedy_only
    the tokens j+1 .. j+offset-1+i must each be the target's argmax at the position before."""
    ids, logits = batch["input_ids"], batch["target_logits"].float()
    mask = batch["loss_mask"] * batch["attention_mask"]
    b, s = ids.shape
    total = 0.0
    for i in range(drafter.cfg.num_heads):
        block, head = drafter.blocks[i], drafter.lm_heads[i]
        weight = weights[i] if weights else 0.8**i
        for row in range(b):
            for j in range(s - offset - i):
                if not mask[row, j + offset + i]:
                    continue
                if greedy_only and any(int(ids[row, j + 1 + m]) != int(logits[row, j + m].argmax())
                                       for m in range(offset - 1 + i)):
                    continue
                x = batch["last_hidden_state"][row, j]
                for lin in block.layers:
                    x = x + torch.nn.functional.silu(lin.weight @ x + lin.bias)
                logq = torch.log_softmax(head.weight @ x, -1)
                p_logits = logits[row, j + offset - 1 + i]
                p = torch.softmax(p_logits, -1)
                kl = float((p * (p.log() - logq)).sum())
                label = ids[row, j + offset + i] if mode == "ce_data" else p_logits.argmax()
                ce = -float(logq[label])
                term = {"kl": kl, "mix": (1 - hard_weight) * kl + hard_weight * ce}.get(mode, ce)
                total += weight * term
    return total


def reference_chain_loss(target, drafter, batch, mode, offset=2):
    """greedy_chain_labels by brute force: for every row, head i and position j whose next token is a
    loss token, extend x_{<=j} greedily by offset-1+i target tokens, one plain forward per token,
    and label head i's prediction at j with the target's distribution after that extension."""
    ids = batch["input_ids"]
    mask = batch["loss_mask"] * batch["attention_mask"]
    b, s = ids.shape
    total = 0.0
    for i in range(drafter.cfg.num_heads):
        block, head = drafter.blocks[i], drafter.lm_heads[i]
        for row in range(b):
            for j in range(s - 1):
                if not mask[row, j + 1]:
                    continue
                prefix = ids[row, : j + 1]
                for _ in range(offset - 1 + i):
                    prefix = torch.cat([prefix, target.forward(prefix[None]).logits[0, -1].argmax().view(1)])
                p_logits = target.forward(prefix[None]).logits[0, -1].float()
                x = batch["last_hidden_state"][row, j]
                for lin in block.layers:
                    x = x + torch.nn.functional.silu(lin.weight @ x + lin.bias)
                logq = torch.log_softmax(head.weight @ x, -1)
                p = torch.softmax(p_logits, -1)
                kl = float((p * (p.log() - logq)).sum())
                ce = -float(logq[p_logits.argmax()])
                total += (0.8**i) * {"kl": kl, "mix": 0.5 * kl + 0.5 * ce}.get(mode, ce)
    return total


def greedy_batch(target, b=2, s=12, seed=0):
    """Rows that follow the target's greedy path at about half of the positions (random tokens elsewhere),
    so greedy_path_only keeps some positions and drops others."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, target.vocab_size, (b, s), generator=g)
    with torch.no_grad():
        for t in range(1, s):
            greedy = target.forward(ids[:, :t]).logits[:, -1].argmax(-1)  # [b]
            keep = torch.rand(b, generator=g) < 0.6
            ids[:, t] = torch.where(keep, greedy, ids[:, t])
    attention = torch.ones(b, s, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": attention, "loss_mask": attention.clone()}
    return features.complete(target, batch, {"last_hidden_state", "target_logits"}, [])


def test_state_dict_keys_are_vllm_medusa_format():
    _, drafter = make(num_heads=3, num_layers=2)
    keys = set(drafter.state_dict_for_export())
    want = {f"blocks.{i}.layers.{j}.{w}" for i in range(3) for j in range(2) for w in ("weight", "bias")}
    want |= {f"lm_heads.{i}.weight" for i in range(3)}
    assert keys == want == set(drafter.state_dict())
    ptrs = [drafter.state_dict()[k].data_ptr() for k in sorted(want)]
    assert len(set(ptrs)) == len(ptrs)  # distinct tensors: no shared-object repetition


def test_untrained_head_is_the_target_lm_head():
    target = tiny_target(num_layers=2, hidden=32)
    drafter = MedusaDrafter.from_target(MedusaDrafter.Config(num_heads=2), target)
    hidden = torch.randn(1, 5, 32)
    for logits in drafter.head_logits(hidden):
        torch.testing.assert_close(logits, target.lm_head(hidden))


@pytest.mark.parametrize("mode", ["ce", "kl", "mix", "ce_data"])
def test_loss_matches_hand_written_reference(mode):
    target, drafter = make(num_heads=3, num_layers=2, loss=mode, hard_label_weight=0.3, greedy_path_only=False)
    batch = batch_for(target, drafter)
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch, mode, hard_weight=0.3)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 2:].sum())
    assert set(got.metrics) >= {"acc_0", "acc_1", "acc_2"}


@pytest.mark.parametrize("mode", ["ce", "mix"])
def test_next_token_head_loss_matches_reference(mode):
    """Model Optimizer's convention: head i predicts x_{j+1+i}; head 0 is the target's own next token."""
    target, drafter = make(num_heads=3, num_layers=1, loss=mode, next_token_head=True, head_weights=[1.0, 0.5, 0.25],
                           greedy_path_only=False)
    batch = batch_for(target, drafter)
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch, mode, offset=1, weights=[1.0, 0.5, 0.25])
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 1:].sum())


@pytest.mark.parametrize("next_token_head", [False, True])
def test_greedy_path_only_loss_matches_reference(next_token_head):
    target, drafter = make(num_heads=3, num_layers=1, loss="kl", next_token_head=next_token_head)
    assert drafter.cfg.greedy_path_only  # the default
    batch = greedy_batch(target)
    offset = 1 if next_token_head else 2
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch, "kl", offset=offset, greedy_only=True)
        everything = reference_loss(drafter, batch, "kl", offset=offset)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert 0 < want < everything  # the batch has positions on and off the greedy path


@pytest.mark.parametrize("mode,next_token_head", [("kl", False), ("mix", True)])
def test_greedy_chain_labels_match_brute_force(mode, next_token_head):
    target, drafter = make(num_heads=3, num_layers=1, loss=mode, greedy_chain_labels=True, next_token_head=next_token_head)
    batch = batch_for(target, drafter, s=8)
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_chain_loss(target, drafter, batch, mode, offset=1 if next_token_head else 2)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 1:].sum())
    assert "teacher" not in str(list(drafter.state_dict())) and len(drafter.trainable_parameters()) == 3 * 3
    with pytest.raises(ValueError, match="greedy_chain_labels"):
        MedusaDrafter(MedusaDrafter.Config(greedy_chain_labels=True, loss="ce_data"), 32, 64)


def test_block_init_and_frozen_lm_head():
    target = tiny_target(num_layers=2, hidden=32)
    torch.manual_seed(0)
    drafter = MedusaDrafter.from_target(
        MedusaDrafter.Config(num_heads=2, block_init="normal", block_init_std=0.05, freeze_lm_head=True), target)
    weights = torch.cat([layer.weight.detach().flatten() for block in drafter.blocks for layer in block.layers])
    assert 0.04 < float(weights.std()) < 0.06
    assert all(float(layer.bias.abs().max()) == 0 for block in drafter.blocks for layer in block.layers)
    trainable = {id(p) for p in drafter.trainable_parameters()}
    assert trainable == {id(p) for p in drafter.blocks.parameters()}  # the projections stay the target's
    out = drafter.forward_loss(batch_for(target, drafter))
    out.loss.backward()
    assert all(head.weight.grad is None for head in drafter.lm_heads)
    for head in drafter.lm_heads:
        torch.testing.assert_close(head.weight, target.lm_head.weight)
    assert {f"lm_heads.{i}.weight" for i in range(2)} <= set(drafter.state_dict_for_export())
    with pytest.raises(ValueError, match="freeze_lm_head"):
        MedusaDrafter(MedusaDrafter.Config(freeze_lm_head=True, init_lm_head_from_target=False), 32, 64)


def test_proposer_indexing_equals_training():
    """Head i on the state whose next token is the newest committed token proposes token i+1
    after it: the same head/position pair training labels with x_{j+2+i}."""
    target, drafter = make(num_heads=3)
    ids = torch.randint(3, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    sampling = SamplingParams(temperature=0.7, top_k=20)
    out = target.forward(ids[:, :-1])
    proposer = drafter.make_proposer(target)
    proposer.begin(ids[0, :-1])
    proposer.commit(ids[0], ids.shape[1] - 1, TargetOutput(out.logits, out.hidden_states))
    draft = proposer.propose(ids[0], 3, sampling, torch.Generator().manual_seed(0))
    full = features.complete(target, {"input_ids": ids, "attention_mask": torch.ones_like(ids)},
                             {"last_hidden_state"}, [])
    train_logits = drafter.head_logits(full["last_hidden_state"])  # head i, position j -> x_{j+2+i}
    j = ids.shape[1] - 2  # the state whose next token is ids[-1]
    for i in range(3):
        torch.testing.assert_close(draft.probs[i], logits_to_probs(train_logits[i][0, j], sampling))
        assert draft.probs[i][draft.tokens[i]] > 0
    greedy = proposer.propose(ids[0], 2, SamplingParams(), None)
    assert greedy.tokens.tolist() == [int(train_logits[i][0, j].argmax()) for i in range(2)]
    with pytest.raises(ValueError, match="num_heads=3"):
        proposer.propose(ids[0], 4, SamplingParams(), None)


def test_next_token_head_proposer_skips_head_0():
    """With next_token_head, head 0 on the state whose next token is c predicts c itself; the proposer
    starts at head 1 (token 1 after c), the pair training labels with x_{j+2}."""
    target, drafter = make(num_heads=3, next_token_head=True)
    ids = torch.randint(3, target.vocab_size, (1, 9), generator=torch.Generator().manual_seed(4))
    out = target.forward(ids[:, :-1])
    proposer = drafter.make_proposer(target)
    proposer.begin(ids[0, :-1])
    proposer.commit(ids[0], ids.shape[1] - 1, TargetOutput(out.logits, out.hidden_states))
    draft = proposer.propose(ids[0], 2, SamplingParams(), None)
    logits = drafter.head_logits(out.hidden_states[-1][:, -1:])
    assert draft.tokens.tolist() == [int(logits[1][0, 0].argmax()), int(logits[2][0, 0].argmax())]
    with pytest.raises(ValueError, match="head 0 predicts the next token"):
        proposer.propose(ids[0], 3, SamplingParams(), None)


def _lora_steps(target, drafter, steps=3):
    opt = torch.optim.AdamW(drafter.trainable_parameters(), lr=1e-2)
    batch = batch_for(target, drafter)
    for _ in range(steps):
        out = drafter.forward_loss(batch)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    return batch


def test_medusa2_lora_trains_adapter_and_leaves_target_intact(tmp_path):
    from peft import PeftModel

    from draftsmith import checkpoint
    from draftsmith.heads.medusa import shared_weight_copy

    target, drafter = make(num_heads=2, lora=True, lora_r=4, lora_kl_weight=0.5, greedy_path_only=False)
    assert "last_hidden_state" not in drafter.required_features
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    lora_before = {k: v.clone() for k, v in drafter.lora.items()}
    ids = torch.randint(3, target.vocab_size, (1, 8))
    logits_before = target.forward(ids).logits
    at_init = drafter.forward_loss(batch_for(target, drafter))
    assert at_init.metrics["loss_lora_kl"] == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at zero
    batch = _lora_steps(target, drafter)
    assert any(not torch.equal(lora_before[k], v) for k, v in drafter.lora.items())
    after = drafter.forward_loss(batch)
    assert after.metrics["loss_lora_kl"] > 0  # the adapted model moved; the KL term sees it
    assert all(torch.equal(before[k], v) for k, v in target.model.state_dict().items())
    assert not any("lora" in name for name, _ in target.model.named_modules())
    torch.testing.assert_close(target.forward(ids).logits, logits_before, rtol=0, atol=0)
    assert all(p.grad is None for p in target.model.parameters())
    # the exported adapter is a standard peft adapter: reloaded on a fresh view it gives the same logits
    drafter.save_adapter(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(shared_weight_copy(target.model), str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        want = drafter.adapted[0](input_ids=ids).logits
        torch.testing.assert_close(reloaded(input_ids=ids).logits, want)
        assert not torch.allclose(want, logits_before, atol=1e-6)
    # a draftsmith checkpoint round-trips heads and adapter
    checkpoint.save(tmp_path / "ckpt", drafter, target, config.RecipeConfig(), step=3)
    fresh = MedusaDrafter.from_target(drafter.cfg, target)
    checkpoint.load_weights(tmp_path / "ckpt", fresh)
    with torch.no_grad():
        torch.testing.assert_close(fresh.adapted[0](input_ids=ids).logits, want)
    assert set(drafter.state_dict_for_export()) == {k for k in drafter.state_dict() if not k.startswith("lora.")}


def _stories_cfg(tmp_path, recipe, *extra):
    return config.load(recipe, [
        f"target.path={shared_path(STORIES)}", f"data.path=[{shared_path('data/alpaca/alpaca_en_demo.json')}]",
        f"regenerate.output={tmp_path / 'regen.jsonl'}", "regenerate.limit=16", "regenerate.max_new_tokens=32",
        "data.eval_samples=4", "train.max_steps=3", "train.batch_size=4", "train.eval_every=0",
        f"train.output_dir={tmp_path / 'run'}", "logging.progress_bar=false", *extra])


def test_debug_recipe_trains(tmp_path, stories_target):
    from draftsmith.train.loop import Trainer

    cfg = _stories_cfg(tmp_path, REPO / "recipes/debug/medusa-stories260k.yaml")
    before = {k: v.clone() for k, v in stories_target.model.state_dict().items()}
    trainer = Trainer(cfg, stories_target)
    init = {k: v.clone() for k, v in trainer.drafter.state_dict().items()}
    result = trainer.run()
    assert result.steps == 3 and all(torch.isfinite(torch.tensor(result.losses)))
    assert {"acc_0", "acc_3"} <= set(result.last_metrics)
    state = trainer.drafter.state_dict()
    assert all(not torch.equal(init[k], state[k]) for k in init)  # every head tensor trained
    assert all(torch.equal(before[k], v) for k, v in stories_target.model.state_dict().items())
    assert (result.final_checkpoint / "drafter.safetensors").exists()


