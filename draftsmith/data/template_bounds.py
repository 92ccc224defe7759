"""Chat templates come with a target (its tokenizer_config.json), so they are files from others:
rendering one is bounded in steps (RENDER_STEPS) and output (RENDER_CHARS), `*` and `**` may not
build huge values, and `{% include %}` / `{% import %}` find nothing. A template past a bound raises
TemplateBoundError, a jinja2 TemplateError, which draftsmith's callers already turn into one line (a
bad row in training data, an error naming the target in eval).

transformers compiles a chat template once (`_compile_jinja_template`, cached) in a sandboxed
jinja2 environment; `install()` puts a compiler with the same environment settings and these bounds
in its place. Templates render exactly as before within the bounds.

A step is one loop iteration, call, attribute or item lookup, `*` / `**`, or piece of output: a count,
not seconds, so the bound stops the same template at the same point on an idle machine and on a busy
one (issue 34). Every `{% for %}` iterates through `_BoundedEnvironment.bounded_iter` (the template's
syntax tree is rewritten before it is compiled), so even loops with an empty body are counted.
"""
from __future__ import annotations

import functools
import threading

import jinja2
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

RENDER_STEPS = 5_000_000  # per rendering of one conversation (a few CPU seconds; a real template takes thousands)
RENDER_CHARS = 8 * 1024 * 1024  # output characters per rendering
MAX_BUILT = 1024 * 1024  # items or characters one `*` may build; exponent bound for `**`

_STATE = threading.local()


class TemplateBoundError(jinja2.TemplateError):
    """A chat template ran past a bound (steps, output size, a huge value) or tried to include a file."""


def _step() -> None:
    """Count one step of the rendering in progress (none outside a rendering)."""
    left = getattr(_STATE, "steps_left", None)
    if left is None:
        return
    if left <= 0:
        raise TemplateBoundError(f"chat template rendering took more than {RENDER_STEPS:,} steps (a loop without end?)")
    _STATE.steps_left = left - 1


class _NoFiles(jinja2.BaseLoader):
    def get_source(self, environment, template):
        raise TemplateBoundError(f"chat template tries to include {template!r}; chat templates may not load other files")


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
        _step()
        return super().call(__context, __obj, *args, **kwargs)

    def getattr(self, obj, attribute):
        _step()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _step()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        _step()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_BUILT:
                    raise TemplateBoundError(f"chat template builds a value of {len(seq) * n:,} items with `*`")
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 1024:
            raise TemplateBoundError(f"chat template raises to the power {right!r:.20}")
        return super().call_binop(context, operator, left, right)

    def bounded_iter(self, iterable):
        """What every `{% for %}` iterates over: the same items, one step each."""
        for item in iterable:
            _step()
            yield item


class _BoundedTemplate(jinja2.Template):
    def render(self, *args, **kwargs):
        """Template.render through generate(), counting steps and size after every piece."""
        outer = getattr(_STATE, "steps_left", None)
        _STATE.steps_left = RENDER_STEPS if outer is None else outer
        try:
            pieces, size = [], 0
            for piece in self.generate(*args, **kwargs):
                size += len(piece)
                if size > RENDER_CHARS:
                    raise TemplateBoundError(f"chat template output is longer than {RENDER_CHARS:,} characters")
                _step()
                pieces.append(piece)
            return "".join(pieces)
        except RecursionError:
            raise TemplateBoundError("chat template recurses too deeply") from None
        except OverflowError as exc:  # the sandbox's range() past its 100,000 items, a float too large
            raise TemplateBoundError(f"chat template builds a value past a bound ({' '.join(str(exc).split())[:120]})") from None
        finally:
            if outer is None:  # a nested rendering's steps count against the outer one
                _STATE.steps_left = None


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
    tree = bounded.parse(source)
    for loop in tree.find_all(nodes.For):  # iterate through bounded_iter: each iteration is a step
        loop.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [loop.iter], [], None, None,
                               lineno=loop.iter.lineno)
    return _BoundedTemplate.from_code(bounded, bounded.compile(tree), bounded.make_globals(None), None)


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
