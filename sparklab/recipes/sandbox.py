"""The Jinja sandbox recipe templates render in, and what one template may cost (pure).

A recipe, sweep file or `--set` value may come from someone else. Jinja's ImmutableSandboxedEnvironment keeps
Python's internals out of reach (no `_` attributes, no mutation); this module also bounds what a template can
cost the machine, so a hostile template is an error in milliseconds, never a hung `--dry-run` or a 1 GB
allocation (issue 27 item 7). Per template:

- its text: at most MAX_SOURCE_CHARS characters;
- what it writes, in all (its output, and what its macros, `set` blocks and filter blocks build): at most
  MAX_WRITTEN_BYTES bytes of UTF-8;
- any value built on the way (`*`, `+`, `~`, `%`, a padding filter or method, `replace`, `join`, ...): at
  most MAX_VALUE characters or items, checked before the value is built; integers at most MAX_INT_BITS bits;
- loop iterations, all loops together: at most MAX_ITERATIONS; recursive loops are refused;
- calls nested (macros calling macros, `caller()`, `super()`): at most MAX_DEPTH deep;
- time: at most MAX_SECONDS of the render thread's CPU time, checked at every call, operator, attribute, loop
  iteration and write.

Every hook raises TemplateBudgetError (a SecurityError); render_template turns it, and every other failure of a
template, into a one-paragraph RecipeError naming the file and the key. The bounds and the checks that hold them
live in sparklab.recipes.template_bounds; this module and that one are the only importers of jinja2 for recipes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter, SecurityError

from sparklab.errors import RecipeError
from sparklab.recipes.template_bounds import (
    BUDGET,
    CHECKED_FILTERS,
    MAX_DEPTH,
    MAX_INT_BITS,
    MAX_ITERATIONS,
    MAX_SECONDS,
    MAX_SOURCE_CHARS,
    MAX_VALUE,
    MAX_WRITTEN_BYTES,
    Budget,
    TemplateBudgetError,
    check_format_spec,
    check_printf,
    check_size,
    check_str_method,
    current_budget,
    guarded_filter,
)


class _Formatter(SandboxedFormatter):
    """str.format in a template: Jinja's sandboxed attribute lookup, and bounded widths and precisions."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        current_budget()
        check_format_spec(format_spec)
        return super().format_field(value, format_spec)


_UNAVAILABLE = ("urlize", "pprint")  # HTML and debugging aids: their output has no bound a command line needs
_OUT = "sparklab_write"


class _BoundedCode(CodeGenerator):
    """Templates compiled so that every write, concatenation and loop iteration passes the budget."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        if node.recursive:
            self.fail("recursive loops are not allowed in recipe templates", node.lineno)
        counted = nodes.For(node.target, nodes.Call(nodes.EnvironmentAttribute("sparklab_loop"), [node.iter], [],
                                                    None, None, lineno=node.lineno),
                            node.body, node.else_, node.test, node.recursive, lineno=node.lineno)
        super().visit_For(counted, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.sparklab_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def _output_const_repr(self, group: Iterable[Any]) -> str:
        return f"environment.{_OUT}({super()._output_const_repr(group)})"

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        self.write(f"environment.{_OUT}(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")


class Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with StrictUndefined and the bounds above."""

    code_generator_class = _BoundedCode
    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def __init__(self) -> None:
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, keep_trailing_newline=False)
        self.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: nothing a command line needs
        for name in _UNAVAILABLE:
            self.filters.pop(name, None)
        for name, check in CHECKED_FILTERS.items():
            self.filters[name] = guarded_filter(self.filters[name], check)

    # -- hooks the compiled template calls ----------------------------------------------------------------------

    def sparklab_write(self, piece: str) -> str:
        budget = current_budget()
        budget.written += len(piece.encode("utf-8", "surrogatepass"))
        if budget.written > MAX_WRITTEN_BYTES:
            raise TemplateBudgetError(f"it writes more than {MAX_WRITTEN_BYTES:,} bytes")
        return piece

    def sparklab_concat(self, pieces: tuple[Any, ...]) -> str:
        current_budget()
        texts = [str(p) for p in pieces]
        check_size(sum(map(len, texts)), "a ~ concatenation")
        return "".join(texts)

    def sparklab_loop(self, iterable: Any) -> Iterator[Any]:
        budget = current_budget()
        for item in iterable:
            budget.iterations += 1
            if budget.iterations > MAX_ITERATIONS:
                raise TemplateBudgetError(f"its loops ran more than {MAX_ITERATIONS:,} iterations")
            budget.tick()
            yield item

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        current_budget()
        if operator == "*" and isinstance(left, int) and isinstance(right, str | list | tuple):
            left, right = right, left
        if operator == "*" and isinstance(left, str | list | tuple) and isinstance(right, int):
            if len(left) * right > MAX_VALUE:
                raise TemplateBudgetError(f"repeating a value {right} times is too large")
        elif operator in ("*", "**") and isinstance(left, int) and isinstance(right, int):
            if operator == "**" and abs(right) > 64:
                raise TemplateBudgetError(f"an exponent of {right} is too large")
            bits = (abs(left).bit_length() * abs(right) if operator == "**"
                    else left.bit_length() + right.bit_length())
            if bits > MAX_INT_BITS:
                raise TemplateBudgetError(f"the number would have about {bits:,} bits (at most {MAX_INT_BITS:,})")
        elif operator == "**" and isinstance(right, int | float) and abs(right) > 64:
            raise TemplateBudgetError(f"an exponent of {right} is too large")
        elif operator == "+" and isinstance(left, str | list | tuple) and isinstance(right, str | list | tuple):
            check_size(len(left) + len(right), "a + concatenation")
        elif operator == "%" and isinstance(left, str):
            check_printf(left)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            check_str_method(owner, getattr(__obj, "__name__", ""), args, kwargs)
        budget.depth += 1
        try:
            if budget.depth > MAX_DEPTH:
                raise TemplateBudgetError(f"its calls nest deeper than {MAX_DEPTH} (a macro calling itself?)")
            return super().call(__context, __obj, *args, **kwargs)
        finally:
            budget.depth -= 1

    def getattr(self, obj: Any, attribute: str) -> Any:
        current_budget()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        current_budget()
        return super().getitem(obj, argument)

    def wrap_str_format(self, value: Any) -> Any:
        """str.format and format_map through the bounded formatter (Jinja's own keeps the attribute checks)."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None or type(value.__self__) is not str:
            return wrapped
        formatter = _Formatter(self)
        text, is_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one argument")
                return str(formatter.vformat(text, (), args[0]))
            return str(formatter.vformat(text, args, kwargs))

        return functools.update_wrapper(bounded, value)


_SANDBOX = Sandbox()
_BOUNDS_HINT = (f"A template may write {MAX_WRITTEN_BYTES:,} bytes, build values of {MAX_VALUE:,} characters or "
                f"items, loop {MAX_ITERATIONS:,} times, nest calls {MAX_DEPTH} deep and run {MAX_SECONDS:g} s; give "
                "the value itself, without a template, if it needs more.")


def _excerpt(text: str, limit: int = 120) -> str:
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text):,} characters)"


def render_template(text: str, context: dict[str, Any], where: str, seconds: float = MAX_SECONDS) -> str:
    """Render one template within the bounds; any failure is a one-paragraph RecipeError naming `where` (the file
    and the key)."""
    shown = _excerpt(text)
    token = BUDGET.set(Budget(seconds))
    try:
        if len(text) > MAX_SOURCE_CHARS:
            raise TemplateBudgetError(f"its text is {len(text):,} characters long (at most {MAX_SOURCE_CHARS:,})")
        return "".join(_SANDBOX.from_string(text).generate(context))
    except TemplateBudgetError as exc:
        raise RecipeError(f"{where}: template {shown} is refused: {exc}", _BOUNDS_HINT) from None
    except SecurityError as exc:
        raise RecipeError(f"{where}: template {shown} is refused by the sandbox: {exc}",
                          "Templates may use variables, filters and plain expressions, not Python internals.") from None
    except jinja2.UndefinedError as exc:
        raise RecipeError(f"{where}: template {shown} uses something undefined: {exc.message}",
                          "Define it under vars (or model.drafts), or give it with --set NAME=VALUE.") from None
    except jinja2.TemplateError as exc:
        raise RecipeError(f"{where}: template {shown} is not valid Jinja: {exc}") from None
    except (RecursionError, MemoryError) as exc:  # nesting too deep for the parser, or memory the bounds missed
        raise RecipeError(f"{where}: template {shown} is refused: {type(exc).__name__} while rendering it",
                          _BOUNDS_HINT) from None
    except (ArithmeticError, LookupError, TypeError, ValueError, AssertionError) as exc:  # `1/0`, `x[99]`
        raise RecipeError(f"{where}: template {shown} failed: {exc}",
                          "Fix the expression (or give the value itself, without a template).") from None
    finally:
        BUDGET.reset(token)
