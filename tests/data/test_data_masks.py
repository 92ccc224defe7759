"""Loss masks cover exactly the assistant tokens (answer + end-of-turn), checked by decoding,
for the tokenizer's chat template and for draftsmith's plain format."""
from __future__ import annotations

import pytest
import torch

from draftsmith.data import chat
from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer
from tests.conftest import STORIES, shared_path

CONV = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say hi, héllo!"},
    {"role": "assistant", "content": "Hi there."},
    {"role": "user", "content": "Again?"},
    {"role": "assistant", "content": "Once more: hi."},
]


def _masked_runs(tok, ids, mask):
    """Decode each maximal run of loss_mask == 1 separately."""
    runs, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tok.decode(r) for r in runs]


def test_chat_template_mask_is_exactly_the_assistant_turns():
    tok = byte_tokenizer(TINY_CHAT_TEMPLATE)
    ids, mask, truncated = chat.encode_chat(tok, CONV, "auto", max_length=512)
    assert not truncated
    assert _masked_runs(tok, ids, mask) == ["Hi there.</s>", "Once more: hi.</s>"]
    # the unmasked tokens decode to the rest of the rendered conversation
    rest = tok.decode([t for t, m in zip(ids, mask) if not m])
    assert rest == "<s>system: You are terse.</s><s>user: Say hi, héllo!</s><s>assistant: <s>user: Again?</s><s>assistant: "


def test_plain_format_mask_and_exact_text():
    tok = byte_tokenizer()  # no chat template -> plain format
    ids, mask, _ = chat.encode_chat(tok, CONV, "auto", max_length=512)
    assert tok.decode(ids) == ("<s>System: You are terse.\nUser: Say hi, héllo!\nAssistant: Hi there.</s>\n"
                               "User: Again?\nAssistant: Once more: hi.</s>")
    assert _masked_runs(tok, ids, mask) == [" Hi there.</s>", " Once more: hi.</s>"]


def test_plain_is_forced_even_with_a_template():
    tok = byte_tokenizer(TINY_CHAT_TEMPLATE)
    ids, mask, _ = chat.encode_chat(tok, CONV[1:3], "plain", max_length=512)
    assert tok.decode(ids).startswith("<s>User: ")
    assert chat.renderer_name(tok, "plain") == "draftsmith plain format"


def test_prompt_is_the_prefix_of_the_training_sequence():
    """What regeneration/eval feed the target is exactly the unmasked prefix of the training row."""
    for template in (TINY_CHAT_TEMPLATE, None):
        tok = byte_tokenizer(template)
        ids, mask, _ = chat.encode_chat(tok, CONV[:3], "auto", max_length=512)
        prompt = chat.encode_prompt(tok, CONV[:2], "auto")
        first = mask.index(1)
        assert ids[:first] == prompt, template


def test_truncation_keeps_a_partial_answer_and_mask_starts_at_zero():
    tok = byte_tokenizer()
    ids, mask, truncated = chat.encode_chat(tok, CONV[1:3], "auto", max_length=40)
    assert truncated and len(ids) == len(mask) == 40 and mask[0] == 0 and sum(mask) > 0


def test_stories_tokenizer_plain_mask_decodes_to_the_answers():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(shared_path(STORIES)))
    assert not chat.uses_template(tok, "auto")
    conv = [{"role": "user", "content": "Tell me a story."},
            {"role": "assistant", "content": "Once upon a time there was a cat."},
            {"role": "user", "content": "More."},
            {"role": "assistant", "content": "The cat was happy."}]
    ids, mask, _ = chat.encode_chat(tok, conv, "auto", max_length=512)
    assert _masked_runs(tok, ids, mask) == ["Once upon a time there was a cat.</s>", "The cat was happy.</s>"]
    first = mask.index(1)
    assert ids[:first] == chat.encode_prompt(tok, conv[:1], "auto")
    assert torch.tensor(ids)[torch.tensor(mask).bool()].tolist()[-1] == tok.eos_token_id


def test_template_that_rewrites_history_is_reported():
    # a template that drops earlier assistant turns is not prefix-stable
    template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}<s>{{ m['role'] }}: "
                "{{ m['content'] }}</s>{% endif %}{% endfor %}{% if add_generation_prompt %}<s>assistant: {% endif %}")
    tok = byte_tokenizer(template)
    with pytest.raises(chat.RowError, match="prefix-stable"):
        chat.encode_chat(tok, CONV, "auto", max_length=512)
