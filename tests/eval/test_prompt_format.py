"""`--prompt-format auto` evaluates a checkpoint in the prompt format its drafter was trained with."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from draftsmith.eval.workloads import training_prompt_format

TEMPLATE = SimpleNamespace(chat_template="{{ messages }}")
NO_TEMPLATE = SimpleNamespace(chat_template=None)


@pytest.mark.parametrize("recipe, tokenizer, want", [
    ({"data": {"format": "auto", "chat_template": "auto"}}, NO_TEMPLATE, "plain"),  # base target: plain chat format
    ({"data": {"format": "auto", "chat_template": "auto"}}, TEMPLATE, "chat"),
    ({"data": {"format": "sharegpt", "chat_template": "plain"}}, TEMPLATE, "plain"),  # the recipe forced plain
    ({"data": {"format": "text"}}, TEMPLATE, "raw"),  # a drafter trained on plain text sees raw prompts
    (None, NO_TEMPLATE, "plain"),
])
def test_training_prompt_format(recipe, tokenizer, want):
    assert training_prompt_format(recipe, tokenizer) == want
