"""The jinja2 environment that behaves like llama.cpp's Jinja engine for chat templates.

Sandboxed and immutable (templates come from model files), with llama.cpp's globals and filters
(`raise_exception`, `strftime_now`, `namespace`, `tojson`, `items`, `trim`, `string`, `safe`), its
lexer options (`trim_blocks`, `lstrip_blocks`), its output rules for `{{ }}` and its attribute lookup
(`obj.key` finds the mapping key first: llama.cpp objects have no Python methods to shadow keys).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from jinja2 import Template, TemplateError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

from llamafleet_core.prefix.llama_json import PrecomputedJson, llama_str, llama_tojson

_C_WHITESPACE = " \t\n\v\f\r"  # what C isspace() strips; Python's str.strip() strips more
_PURE_STR_METHODS = frozenset((
    "startswith", "endswith", "split", "rsplit", "splitlines", "replace", "upper", "lower", "title",
    "capitalize", "find", "rfind", "count", "join", "isdigit", "isalpha", "isalnum", "isspace",
))
_JINJA_OWN = (LoopContext, Namespace)  # jinja2's own loop and namespace objects: safe by construction

class _LlamaEnvironment(ImmutableSandboxedEnvironment):
    """jinja2 with llama.cpp's lookup rules: `obj.key` prefers the mapping key over a dict method."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict or type(obj) is PrecomputedJson:
            if attribute in obj:
                return obj[attribute]
            if not hasattr(dict, attribute):  # fast path: a missing key, no sandbox check needed
                return self.undefined(obj=obj, name=attribute)
        if isinstance(obj, str):
            if attribute in ("strip", "lstrip", "rstrip"):
                method = getattr(obj, attribute)
                return lambda chars=None: method(_C_WHITESPACE if chars is None else chars)
            if attribute in _PURE_STR_METHODS:  # the sandbox's checks cost more than the render itself
                return getattr(obj, attribute)
        elif type(obj) in _JINJA_OWN and not attribute.startswith("_"):
            try:
                return getattr(obj, attribute)
            except AttributeError:
                return self.undefined(obj=obj, name=attribute)
        return super().getattr(obj, attribute)


def _raise_exception(message: Any) -> None:
    raise TemplateError(f"Jinja Exception: {message}")


def _strftime_now(fmt: str) -> str:
    return time.strftime(fmt, time.localtime())


def _items(value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, Mapping):
        return list(value.items())
    raise TypeError("items expects an object")


def _finalize(value: Any) -> Any:
    """What `gather_string_parts` prints for a `{{ }}` expression."""
    if value is None:
        return ""
    if isinstance(value, (bool, int, float, str)):
        return llama_str(value)
    if isinstance(value, (list, tuple)):
        return "".join(str(_finalize(v)) for v in value)
    if isinstance(value, Mapping):
        return ""
    return value


def make_environment() -> _LlamaEnvironment:
    # trim_blocks/lstrip_blocks: llama.cpp's lexer applies both to chat templates
    env = _LlamaEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False, finalize=_finalize)
    env.filters["tojson"] = llama_tojson
    env.filters["items"] = _items
    env.filters["trim"] = lambda s, chars=None: str(s).strip(_C_WHITESPACE if chars is None else chars)
    env.filters["safe"] = llama_str
    env.filters["string"] = llama_str
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env


def render_without_cycles(template: Template, context: dict[str, Any]) -> str:
    """`template.render(context)`, leaving no reference cycle behind.

    A template that defines a macro (Qwen3.5's does) leaves a cycle per render: the context holds the
    macro, whose function's closure holds the context, with the namespaces and loop state around them.
    Only the collector frees those, ~26 objects a request, and they were half of what filled the young
    generation: the collections that followed stopped the event loop for ~4.6 ms each, inside decisions
    (docs/design.md, "Gateway process"). Emptying the context's variables once the text is out breaks
    every such cycle, and reference counting frees the rest at once.
    """
    ctx = template.new_context(context)
    try:
        return template.environment.concat(template.root_render_func(ctx))  # type: ignore[attr-defined]
    except Exception:
        template.environment.handle_exception()  # jinja2's own: raises with the template's line
        raise  # not reached: handle_exception always raises
    finally:
        ctx.vars.clear()
        ctx.exported_vars.clear()
