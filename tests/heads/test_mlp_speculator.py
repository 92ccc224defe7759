"""MLP speculator: vLLM's tensor names (tied and untied), the per-stage loss against a
hand-written reference of vLLM's math, teacher-forced stages equal to the proposer's chain, the
debug recipe training, and lossless greedy decoding."""
from __future__ import annotations

import functools
import math

import pytest
import torch

from draftsmith import config
from draftsmith.core.sampling import SamplingParams, logits_to_probs
from draftsmith.data import features
from draftsmith.heads.mlp_speculator import MLPSpeculatorDrafter
from draftsmith.targets.load import TargetOutput
from draftsmith.testing import tiny_target
from tests.conftest import REPO, STORIES, shared_path
from tests.helpers import batch_for as shared_batch_for


def make(seed=0, **options):
    target = tiny_target(num_layers=2, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    drafter = MLPSpeculatorDrafter.from_target(MLPSpeculatorDrafter.Config(**options), target)
    with torch.no_grad():  # non-trivial norm weights and biases
        for ln in drafter.ln:
            ln.weight.add_(0.1 * torch.randn_like(ln.weight))
            ln.bias.add_(0.1 * torch.randn_like(ln.bias))
    return target, drafter


batch_for = functools.partial(shared_batch_for, drafter=None, s=10, required={"last_hidden_state", "target_logits"})

def reference_loss(d, batch):
    """vLLM's stage math written out per row and position; stage i at j predicts x_{j+2+i}."""
    n, dim = d.cfg.n_predict, d.inner_dim
    sw = 0.5 ** (0.5 / n)
    ew = math.sqrt((1 - sw**2) * dim / 2)
    ids, mask = batch["input_ids"], batch["loss_mask"] * batch["attention_mask"]
    greedy = batch["target_logits"].argmax(-1)
    tied = d.cfg.tie_weights

    def rms(x, eps=1e-6):
        return x / torch.sqrt((x * x).mean() + eps)

    total = 0.0
    b, s = ids.shape
    for row in range(b):
        for j in range(s - 2):
            state = batch["last_hidden_state"][row, j]
            if d.cfg.scale_input:
                state = rms(state) / math.sqrt(2)
            for i in range(n):
                if j + 2 + i >= s:
                    break
                e, p = (0, min(i, 1)) if tied else (i, i)
                x = d.proj[p].weight @ state + d.emb[e].weight[ids[row, j + 1 + i]] * (ew / sw)
                state = torch.nn.functional.gelu(rms(x) * d.ln[e].weight + d.ln[e].bias)
                logq = torch.log_softmax(d.head[e].weight @ state, -1)
                label = greedy[row, j + 1 + i] if d.cfg.labels == "target_greedy" else ids[row, j + 2 + i]
                if mask[row, j + 2 + i]:
                    total += -float(logq[label])
    return total


def test_tensor_names_match_vllm():
    _, d = make(n_predict=3)
    want = {f"{m}.{i}.weight" for m in ("emb", "proj", "ln", "head") for i in range(3)} | {f"ln.{i}.bias" for i in range(3)}
    assert set(d.state_dict()) == want
    _, tied = make(n_predict=3, tie_weights=True, scale_input=True)
    assert set(tied.state_dict()) == {"emb.0.weight", "proj.0.weight", "proj.1.weight", "ln.0.weight", "ln.0.bias",
                                      "head.0.weight"}
    assert tied.proj[0].weight.shape == (32, 32) and d.head[2].weight.shape == (259, 32)
    _, wide = make(n_predict=2, inner_dim=48)
    assert wide.proj[0].weight.shape == (48, 32) and wide.proj[1].weight.shape == (48, 48)
    with pytest.raises(ValueError, match="tie_weights"):
        make(n_predict=1, tie_weights=True)


@pytest.mark.parametrize("options", [{}, {"labels": "data"}, {"tie_weights": True, "scale_input": True, "inner_dim": 40}])
def test_loss_matches_hand_written_reference(options):
    target, d = make(n_predict=3, **options)
    batch = batch_for(target)
    with torch.no_grad():
        got = d.forward_loss(batch)
        want = reference_loss(d, batch)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 2:].sum())
    assert set(got.metrics) >= {"acc_0", "acc_1", "acc_2"}


def test_loss_is_differentiable_and_target_untouched():
    target, d = make(n_predict=2)
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    d.forward_loss(batch_for(target)).loss.backward()
    assert all(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in d.trainable_parameters())
    assert all(p.grad is None for p in target.model.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.model.state_dict().items())


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9)])
def test_proposer_chain_equals_teacher_forced_stages(sampling):
    """Stage i of the proposer reads (state, draft token i); training reads (state, x_{j+1+i}):
    with the drafts written into the sequence, both give the same distributions."""
    target, d = make(n_predict=3, scale_input=True)
    ctx = torch.randint(3, target.vocab_size, (8,), generator=torch.Generator().manual_seed(2))
    out = target.forward(ctx[None, :-1])
    proposer = d.make_proposer(target)
    proposer.begin(ctx[:-1])
    proposer.commit(ctx, ctx.shape[0] - 1, TargetOutput(out.logits, out.hidden_states))
    draft = proposer.propose(ctx, 3, sampling, torch.Generator().manual_seed(0))
    seq = torch.cat([ctx, draft.tokens])[None]  # context + d1..d3
    hidden = features.complete(target, {"input_ids": seq, "attention_mask": torch.ones_like(seq)},
                               {"last_hidden_state"}, [])["last_hidden_state"]
    with torch.no_grad():
        stages = d.stage_logits(hidden, seq)
    j = ctx.shape[0] - 2  # the state whose next token is ctx[-1]
    for i in range(3):
        torch.testing.assert_close(draft.probs[i], logits_to_probs(stages[i][0, j], sampling), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="3 stages"):
        proposer.propose(ctx, 4, sampling, None)


def test_debug_recipe_trains(tmp_path, stories_target):
    from draftsmith.train.loop import Trainer

    cfg = config.load(REPO / "recipes/debug/mlp_speculator-stories260k.yaml", [
        f"target.path={shared_path(STORIES)}", f"data.path=[{shared_path('data/alpaca/alpaca_en_demo.json')}]",
        f"regenerate.output={tmp_path / 'regen.jsonl'}", "regenerate.limit=16", "regenerate.max_new_tokens=32",
        "data.eval_samples=4", "train.max_steps=3", "train.batch_size=4", "train.eval_every=0",
        f"train.output_dir={tmp_path / 'run'}", "logging.progress_bar=false"])
    before = {k: v.clone() for k, v in stories_target.model.state_dict().items()}
    trainer = Trainer(cfg, stories_target)
    init = {k: v.clone() for k, v in trainer.drafter.state_dict().items()}
    result = trainer.run()
    assert result.steps == 3 and all(math.isfinite(x) for x in result.losses)
    assert {"acc_0", "acc_1", "acc_2"} <= set(result.last_metrics)
    state = trainer.drafter.state_dict()
    assert all(not torch.equal(init[k], state[k]) for k in init)
    assert all(torch.equal(before[k], v) for k, v in stories_target.model.state_dict().items())
    assert (result.final_checkpoint / "drafter.safetensors").exists()


