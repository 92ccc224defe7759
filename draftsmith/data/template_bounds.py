"""Chat templates come with a target (its tokenizer_config.json), so they are files from others:
rendering one is bounded in time (RENDER_SECONDS) and output (RENDER_CHARS), `*` and `**` may not
build huge values, and `{% include %}` / `{% import %}` find nothing. A template past a bound raises
TemplateBoundError, a jinja2 TemplateError, which draftsmith's callers already turn into one line (a
bad row in training data, an error naming the target in eval).

transformers compiles a chat template once (`_compile_jinja_template`, cached) in a sandboxed
jinja2 environment; `install()` puts a compiler with the same environment settings and these bounds
in its place. Templates render exactly as before within the bounds.
"""
from __future__ import annotations

import functools
import threading
import time

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_SECONDS = 10.0  # per rendering of one conversation
RENDER_CHARS = 8 * 1024 * 1024  # output characters per rendering
MAX_BUILT = 1024 * 1024  # items or characters one `*` may build; exponent bound for `**`

_STATE = threading.local()


class TemplateBoundError(jinja2.TemplateError):
    """A chat template ran past a bound (time, output size, a huge value) or tried to include a file."""


def _check_time() -> None:
    deadline = getattr(_STATE, "deadline", None)
    if deadline is not None and time.monotonic() > deadline:
        raise TemplateBoundError(f"chat template rendering took longer than {RENDER_SECONDS:g} s (a loop without end?)")


class _NoFiles(jinja2.BaseLoader):
    def get_source(self, environment, template):
        raise TemplateBoundError(f"chat template tries to include {template!r}; chat templates may not load other files")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
        _check_time()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        _check_time()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _check_time()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        _check_time()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_BUILT:
                    raise TemplateBoundError(f"chat template builds a value of {len(seq) * n:,} items with `*`")
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
            raise TemplateBoundError(f"chat template raises to the power {right!r:.20}")
        return super().call_binop(context, operator, left, right)


class _BoundedTemplate(jinja2.Template):
    def render(self, *args, **kwargs):
        """Template.render through generate(), checking time and size after every piece."""
        outer = getattr(_STATE, "deadline", None)
        _STATE.deadline = time.monotonic() + RENDER_SECONDS if outer is None else outer
        try:
            pieces, size = [], 0
            for piece in self.generate(*args, **kwargs):
                size += len(piece)
                if size > RENDER_CHARS:
                    raise TemplateBoundError(f"chat template output is longer than {RENDER_CHARS:,} characters")
                _check_time()
                pieces.append(piece)
            return "".join(pieces)
        except RecursionError:
            raise TemplateBoundError("chat template recurses too deeply") from None
        except OverflowError as exc:  # the sandbox's range() past its 100,000 items, a float too large
            raise TemplateBoundError(f"chat template builds a value past a bound ({' '.join(str(exc).split())[:120]})") from None
        finally:
            _STATE.deadline = outer


def _bounded_compile(settings: jinja2.Template, source: str) -> jinja2.Template:
    """`source` compiled in a bounded environment with the settings (extensions, filters, globals) of
    transformers' environment, taken from `settings` (an empty template it compiled: never compile the
    received template there, since jinja2 folds constants such as 7 ** 100000000 while compiling)."""
    env = settings.environment
    bounded = _BoundedEnvironment(trim_blocks=env.trim_blocks, lstrip_blocks=env.lstrip_blocks,
                                  extensions=[type(e) for e in env.extensions.values()], loader=_NoFiles())
    bounded.filters.update({k: v for k, v in env.filters.items() if k not in bounded.filters or k == "tojson"})
    bounded.globals.update({k: v for k, v in env.globals.items() if k != "range"})  # keep the sandbox's range
    bounded.template_class = _BoundedTemplate
    return bounded.from_string(source)


def install() -> None:
    """Put the bounded compiler in transformers' place (idempotent)."""
    from transformers.utils import chat_template_utils as ctu

    if getattr(ctu._compile_jinja_template, "draftsmith_bounded", False):
        return
    original = ctu._compile_jinja_template

    @functools.lru_cache
    def compile_bounded(chat_template):
        return _bounded_compile(original(""), chat_template)

    compile_bounded.draftsmith_bounded = True
    ctu._compile_jinja_template = compile_bounded
