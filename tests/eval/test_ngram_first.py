"""NgramFirstProposer (`draftsmith eval CKPT --ngram-first`): prompt lookup drafts where it matches, the
trained drafter where it does not, and the drafter's deferred commits change nothing it drafts.

- every round the drafter drafts, its draft equals that of a twin proposer of the same drafter that
  was committed after every round (one merged commit over the deferred rounds = the rounds one by one);
- the output is target-only greedy output; batched rows get their own inner proposers;
- at T = 1 the hybrid reproduces the target's law (both sides drafting, each with its own q);
- the eval command records the split of rounds, and refuses the flag without a checkpoint or with a tree.
"""
from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from eval_toys import fixed_logit_target
from test_generate_chi2 import RUNS, V, _laws, _tables
from test_verification import chi_square_pvalue

from draftsmith.cli import main as cli_main
from draftsmith.core.sampling import SamplingParams
from draftsmith.eval.loop import LoopConfig, generate, generate_batch
from draftsmith.eval.options import NgramOptions
from draftsmith.eval.proposers import NgramFirstProposer, NgramProposer
from draftsmith.heads import DRAFTERS
from draftsmith.heads.draft_lm import DraftModelProposer
from draftsmith.testing import tiny_target
from tests.export.conftest import make_checkpoint


class EagerTwin:
    """Drives a hybrid and, beside it, a second proposer of the same drafter committed after EVERY round;
    each round the hybrid's drafter drafts, the twin drafts the same context and the two are compared."""

    def __init__(self, hybrid: NgramFirstProposer, twin):
        self.hybrid, self.twin, self.name, self.compared = hybrid, twin, "eager-twin", 0
        self.sides: list[str] = []  # who drafted each round, in order

    def begin(self, prompt_ids):
        self.hybrid.begin(prompt_ids)
        self.twin.begin(prompt_ids)

    def commit(self, context, num_new, target_out):
        self.hybrid.commit(context, num_new, target_out)
        self.twin.commit(context, num_new, target_out)

    def propose(self, context, k, sampling, generator=None):
        before = self.hybrid.rounds["drafter"]
        draft = self.hybrid.propose(context, k, sampling, generator)
        self.sides.append("drafter" if self.hybrid.rounds["drafter"] > before else "ngram")
        if self.sides[-1] == "drafter":
            eager = self.twin.propose(context, k, sampling, generator)
            assert draft.tokens.tolist() == eager.tokens.tolist(), context.shape[0]
            torch.testing.assert_close(draft.probs, eager.probs, atol=1e-5, rtol=1e-4)
            self.compared += 1
        return draft


class Capped:
    """A proposer drafting at most `cap` tokens a round (the eager twin of a drafter behind --drafter-k)."""

    def __init__(self, inner, cap: int):
        self.inner, self.cap, self.name = inner, cap, "capped"

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def commit(self, context, num_new, target_out):
        self.inner.commit(context, num_new, target_out)

    def propose(self, context, k, sampling, generator=None):
        return self.inner.propose(context, min(k, self.cap), sampling, generator)


def _drafter(kind: str, target, options: dict):
    torch.manual_seed(3)
    d = DRAFTERS.get(kind).from_target(DRAFTERS.get(kind).Config(**options), target, None)
    with torch.no_grad():
        for p in d.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return d.eval()


@pytest.mark.parametrize("kind, options", [
    ("eagle3", {"ttt_steps": 2}),  # its own KV cache, rolled back in commit (FeatureChainProposer)
    ("dflash", {"block_size": 4, "num_layers": 1}),  # context K/V appended per commit (block drafter)
    ("medusa", {"num_heads": 3}),  # the last committed state only (LastStateProposer)
    ("eagle1", {}),
    ("peagle", {"num_depths": 3}),
    ("dspark", {"block_size": 4}),
    ("mlp_speculator", {"n_predict": 3}),
], ids=["eagle3", "dflash", "medusa", "eagle1", "peagle", "dspark", "mlp_speculator"])
@pytest.mark.parametrize("max_pending", [16, 2], ids=["pending16", "flush-every-2"])
def test_deferred_commits_draft_what_eager_commits_draft(kind, options, max_pending):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    d = _drafter(kind, target, options)
    prompt = torch.tensor([5, 6, 7, 8, 5, 6, 9, 10, 11, 5, 6, 7])  # repeats: the lookup matches some rounds
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=48))
    hybrid = NgramFirstProposer(NgramProposer(max_ngram=3, min_ngram=2), d.make_proposer(target),
                                max_pending=max_pending)
    twin = EagerTwin(hybrid, d.make_proposer(target))
    gen = generate(target, twin, prompt, LoopConfig(k=3, max_new_tokens=48))
    assert gen.tokens == base.tokens  # lossless
    assert hybrid.rounds["ngram"] >= 1 and hybrid.rounds["drafter"] >= 2, hybrid.rounds
    assert twin.compared == hybrid.rounds["drafter"]
    # some drafter round came right after a lookup round, i.e. after a merged commit of deferred rounds
    assert ("ngram", "drafter") in zip(twin.sides, twin.sides[1:]), twin.sides


def test_batched_rows_get_their_own_inner_proposers_and_share_the_count():
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    d = _drafter("eagle3", target, {"ttt_steps": 2})
    hybrid = NgramFirstProposer(NgramProposer(max_ngram=3, min_ngram=2), d.make_proposer(target), drafter_k=2)
    rows = [copy.copy(hybrid) for _ in range(3)]
    assert len({id(r.drafter) for r in rows}) == 3 and all(r.rounds is hybrid.rounds for r in rows)
    assert all(r.drafter_k == 2 for r in rows)
    prompts = [torch.tensor([5, 6, 7, 5, 6]), torch.tensor([20, 21, 22]), torch.tensor([9, 9, 9, 9])]
    cfg = LoopConfig(k=3, max_new_tokens=24)
    gens = generate_batch(target, rows, prompts, cfg)
    for p, g in zip(prompts, gens):
        assert g.tokens == generate(target, None, p, LoopConfig(k=0, max_new_tokens=24)).tokens
    # every round that drafted was drafted by one side (a row's last round, with one token left, drafts nothing)
    assert sum(hybrid.rounds.values()) == sum(1 for g in gens for r in g.rounds if r.proposed)


def test_drafter_k_caps_the_drafters_rounds_not_the_lookups():
    """--drafter-k: the lookup drafts up to the loop's k, the drafter at most drafter_k; output unchanged."""
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    d = _drafter("eagle3", target, {"ttt_steps": 2})
    prompt = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9, 10])  # a long repeat: lookup drafts of 6
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=40))
    hybrid = NgramFirstProposer(NgramProposer(max_ngram=3, min_ngram=2), d.make_proposer(target), drafter_k=2)
    twin = EagerTwin(hybrid, Capped(d.make_proposer(target), 2))  # the same drafter, committed every round
    gen = generate(target, twin, prompt, LoopConfig(k=6, max_new_tokens=40))
    assert gen.tokens == base.tokens
    lengths = {side: [r.proposed for s_, r in zip(twin.sides, gen.rounds) if s_ == side and r.proposed]
               for side in ("ngram", "drafter")}
    assert lengths["drafter"] and max(lengths["drafter"]) <= 2, lengths
    assert lengths["ngram"] and max(lengths["ngram"]) > 2, lengths  # the lookup is not capped
    with pytest.raises(ValueError, match="drafter_k"):
        NgramFirstProposer(NgramProposer(), d.make_proposer(target), drafter_k=0)


def test_ngram_first_reproduces_the_target_law_at_t1():
    """Each round's draft comes whole from one side with that side's q (one-hot for the lookup): the
    loop's output law is the target's (the chi-square protocol of test_generate_chi2.py)."""
    p_logits, q_logits = _tables()
    target = fixed_logit_target(p_logits)
    hybrid = NgramFirstProposer(NgramProposer(max_ngram=2, min_ngram=1),
                                DraftModelProposer(fixed_logit_target(q_logits).model, V))
    cfg = LoopConfig(k=3, max_new_tokens=4, sampling=SamplingParams(temperature=1.0), eos_ids=[])
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([0, 3, 0])  # "0" recurs: the lookup has a match in the first round
    counts23, counts4 = torch.zeros(V, V), torch.zeros(V)
    for _ in range(RUNS):
        g = generate(target, hybrid, prompt, cfg, gen)
        counts23[g.tokens[1], g.tokens[2]] += 1
        counts4[g.tokens[3]] += 1
    assert hybrid.rounds["ngram"] > 100 and hybrid.rounds["drafter"] > 100, hybrid.rounds
    first = torch.softmax(p_logits[0].double(), -1)
    joint23, t4 = _laws(p_logits, first)
    assert chi_square_pvalue(counts23.flatten(), joint23.flatten()) > 1e-3
    assert chi_square_pvalue(counts4, t4) > 1e-3


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("ngram-first"), "eagle3", {"ttt_steps": 2})


def test_eval_records_the_split_and_names_the_hybrid(ckpt, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hello hello hello"}\n{"id": "b", "prompt": "abc abd abc"}\n')
    out = tmp_path / "r.json"
    rc = cli_main(["eval", str(ckpt), "--ngram-first", "--ngram-min", "2", "--workloads", f"jsonl:{prompts}",
                   "--k", "3", "--drafter-k", "2", "--max-new-tokens", "24", "--warmup", "0", "--device", "cpu",
                   "--check-lossless", "--out", str(out)])
    res = json.loads(out.read_text())
    assert rc == 0 and res["lossless"]["passed"] is True
    assert res["drafter"]["kind"] == "eagle3"
    assert res["drafter"]["name"].endswith("+ngram-first(max=3,min=2,first,drafter_k=2)")
    assert res["drafter"]["ngram_first"] == {"max_ngram": 3, "min_ngram": 2, "match": "first", "drafter_k": 2}
    split = next(iter(res["workloads"].values()))["ngram_first_rounds"]
    assert split["ngram"] + split["drafter"] > 0
    from draftsmith.eval import evaluate as eval_cli  # the flag reaches the proposer the loop drives
    args = eval_cli.EvalOptions(path=str(ckpt), ngram=NgramOptions(first=True, drafter_k=2), k=3, device="cpu")
    _, proposer, _ = eval_cli._load(args)
    assert isinstance(proposer, NgramFirstProposer) and proposer.drafter_k == 2
    args.ngram = dataclasses.replace(args.ngram, drafter_k=3)  # = --k: the same run as no flag, named and recorded as such
    _, proposer, identity = eval_cli._load(args)
    assert proposer.drafter_k is None and identity["ngram_first"]["drafter_k"] is None
    assert identity["name"].endswith("+ngram-first(max=3,min=1,first)")


@pytest.mark.parametrize("extra, needle", [
    (["--proposer", "ngram", "--target", "builtin:pycode-tiny"], "give the checkpoint PATH"),
    (["CKPT", "--tree", "dynamic"], "drop --tree"),
    (["CKPT", "--engine", "llama.cpp"], "drop --engine"),
    (["CKPT", "--k", "4", "--drafter-k", "5"], "must lie in 1..--k (4)"),
])
def test_ngram_first_refusals_are_one_line(ckpt, tmp_path, capsys, extra, needle):
    argv = ["eval", *[str(ckpt) if a == "CKPT" else a for a in extra], "--ngram-first", "--workloads", "pycode",
            "--out", str(tmp_path / "r.json")]
    assert cli_main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0] and "--ngram-first" in err[0], err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("extra, needle", [([], "add --ngram-first"), (["--engine", "llama.cpp"], "drop --engine")])
def test_drafter_k_without_ngram_first_is_refused(ckpt, tmp_path, capsys, extra, needle):
    argv = ["eval", str(ckpt), "--drafter-k", "2", *extra, "--workloads", "pycode", "--out", str(tmp_path / "r.json")]
    assert cli_main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and needle in err[0] and "--drafter-k" in err[0], err
