"""Every registered drafter kind, untrained, in the one speculative loop on the real stories260K model: greedy
speculative output equals target-only output token for token, and the kind did propose (so the check saw
rejections, not an idle proposer). One parametrised test over the kind registry replaces a copy per kind file;
a new kind is covered by registering it. Kind-specific loop facts (a block's length, DSpark's verify lengths)
stay in the kind's own test file."""
from __future__ import annotations

import pytest
import torch

from draftsmith import config as config_mod
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.proposers import from_drafter
from draftsmith.heads import DRAFTERS

PROMPTS = ["Once upon a time", "The little dog was sad because"]


@pytest.mark.parametrize("kind", DRAFTERS.names())
def test_greedy_speculative_output_equals_the_target_alone(stories_target, kind):
    cls = DRAFTERS.get(kind)
    typed, problems, _ = config_mod.typed_drafter_options(kind, dict(cls.tiny_options))
    assert not problems, problems
    torch.manual_seed(0)
    drafter = cls.from_target(typed, stories_target).eval()
    proposer = from_drafter(drafter, stories_target)
    k = min(3, drafter.max_draft_tokens() or 3)  # heads / stages bound a round (the kind says how many)
    proposed = 0
    for text in PROMPTS:
        ids = stories_target.tokenizer(text, return_tensors="pt").input_ids[0]
        alone = generate(stories_target, None, ids, LoopConfig(k=0, max_new_tokens=24)).tokens
        spec = generate(stories_target, proposer, ids, LoopConfig(k=k, max_new_tokens=24))
        assert spec.tokens == alone, f"{kind}: speculative greedy output differs from the target alone on {text!r}"
        proposed += sum(r.proposed for r in spec.rounds)
    assert proposed > 0, f"{kind}: the proposer drafted nothing, so the check saw no rejection"
