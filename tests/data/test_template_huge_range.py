"""Issue 34 (trust, round 4): a chat template over range(1000000) is a bounded-template error (jinja's
OverflowError traceback before)."""
from __future__ import annotations

import pytest

from draftsmith.data import chat
from draftsmith.data.formats import RowError
from draftsmith.testing import byte_tokenizer


@pytest.mark.parametrize("source", ["{% for i in range(1000000) %}x{% endfor %}", "{{ range(10 ** 7) | length }}"])
def test_a_template_over_a_huge_range_is_one_line(source):
    tok = byte_tokenizer(source)
    with pytest.raises(RowError, match="chat template builds a value past a bound"):
        chat.prompt_text(tok, [{"role": "user", "content": "hi"}], "auto")
