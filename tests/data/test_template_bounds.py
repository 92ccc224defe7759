"""Issue 22 (trust, round 3), finding 13: a target's chat template is bounded in steps and output,
builds no huge value, includes no file, and a template the sandbox blocks is one line in eval."""
from __future__ import annotations

import pytest

from draftsmith.data import chat, template_bounds
from draftsmith.data.formats import RowError
from draftsmith.eval import workloads
from draftsmith.testing import TINY_CHAT_TEMPLATE, byte_tokenizer

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]


def test_a_template_within_the_bounds_renders_as_before():
    tok = byte_tokenizer(TINY_CHAT_TEMPLATE)
    assert chat.prompt_text(tok, MESSAGES[:1], "auto") == "<s>user: hi</s><s>assistant: "
    text, spans = chat.render_template(tok, MESSAGES)
    assert text == "<s>user: hi</s><s>assistant: hello</s>" and text[spans[0][0]:spans[0][1]] == "hello</s>"
    # transformers' own features still work through the bounded environment
    tok = byte_tokenizer("{% for m in messages %}{{ m['content'] | tojson }}{% endfor %}{{ raise_exception('no') if "
                         "messages | length > 5 }}{% set ns = namespace(n=0) %}{{ ns.n }}")
    assert chat.prompt_text(tok, MESSAGES, "auto") == '"hi""hello"0'


@pytest.mark.parametrize("template", [
    "{% for a in range(3000) %}{% for b in range(3000) %}{% endfor %}{% endfor %}x",
    # a range built once: the loops call nothing and print nothing, only the iterations are counted
    "{% set r = range(3000) %}{% for a in r %}{% for b in r %}{% endfor %}{% endfor %}x",
    "{% set l = [0] * 3000 %}{% for a in l if a == 0 %}{% for b in l %}{% endfor %}{% endfor %}x",
])
def test_nested_loops_stop_at_the_step_bound(monkeypatch, template):
    """Issue 34: the bound is a count of steps (loop iterations, calls, lookups, output pieces), not
    seconds, so it stops the same template at the same point on an idle and on a busy machine. Each
    template here takes 9 million iterations: it would render (no error) without the bound."""
    monkeypatch.setattr(template_bounds, "RENDER_STEPS", 100_000)
    tok = byte_tokenizer(template)
    with pytest.raises(RowError, match=r"chat template error: chat template rendering took more than 100,000 steps"):
        chat.prompt_text(tok, MESSAGES, "auto")


def test_the_step_bound_is_a_count(monkeypatch):
    """The same template needs the same number of steps every time: it renders within that many and
    is refused with one fewer (a wall-clock bound would move with the machine's load)."""
    assert template_bounds.RENDER_STEPS >= 1_000_000  # the real bound: far above what a conversation needs
    tok = byte_tokenizer("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    want = "user: hi\nassistant: hello\n"

    def renders(steps: int) -> bool:
        monkeypatch.setattr(template_bounds, "RENDER_STEPS", steps)
        try:
            return chat.prompt_text(tok, MESSAGES, "auto") == want
        except RowError:
            return False

    need = next(n for n in range(1, 200) if renders(n))
    assert 6 <= need < 50 and not renders(need - 1) and renders(need) and renders(need)


def test_output_and_built_values_are_bounded(monkeypatch):
    monkeypatch.setattr(template_bounds, "RENDER_CHARS", 10_000)
    tok = byte_tokenizer("{% for a in range(1000) %}{{ 'x' * 100 }}{% endfor %}")
    with pytest.raises(RowError, match="output is longer than 10,000 characters"):
        chat.prompt_text(tok, MESSAGES, "auto")
    tok = byte_tokenizer("{{ 'x' * 10000000 }}")
    with pytest.raises(RowError, match="builds a value of 10,000,000 items"):
        chat.prompt_text(tok, MESSAGES, "auto")
    tok = byte_tokenizer("{{ 7 ** 100000000 }}")
    with pytest.raises(RowError, match="raises to the power"):
        chat.prompt_text(tok, MESSAGES, "auto")


@pytest.mark.parametrize("template, reason", [
    ("{% include 'system.j2' %}", "may not load other files"),
    ("{% import 'macros.j2' as m %}{{ m.x() }}", "may not load other files"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recurses too deeply"),
])
def test_a_blocked_or_including_template_is_one_line_in_eval(template, reason):
    tok = byte_tokenizer(template)
    with pytest.raises(RowError, match=reason):
        chat.prompt_text(tok, MESSAGES, "auto")
    with pytest.raises(ValueError, match=rf"the target's chat template cannot render a prompt \(.*{reason}.*--prompt-format plain"
                       ) as info:
        workloads.encode({"prompt": "hi"}, tok, "auto")
    assert "\n" not in str(info.value) and len(str(info.value)) < 500
