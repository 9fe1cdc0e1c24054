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
- time: at most MAX_SECONDS, checked at every call, operator, attribute, loop iteration and write.

Every hook raises TemplateBudgetError (a SecurityError); render_template turns it, and every other failure of a
template, into a one-paragraph RecipeError naming the file and the key. The only importer of jinja2 for recipes.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import time
from collections.abc import Iterable, Iterator
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter, SecurityError

from sparklab.errors import RecipeError

MAX_SOURCE_CHARS = 65_536
MAX_WRITTEN_BYTES = 131_072  # Linux's limit on one argument of a command line (MAX_ARG_STRLEN)
MAX_VALUE = 1_000_000
MAX_INT_BITS = 100_000
MAX_ITERATIONS = 100_000
MAX_DEPTH = 32
MAX_SECONDS = 2.0


class TemplateBudgetError(SecurityError):
    """A template went past one of its bounds."""


class _Budget:
    """One render's account: bytes written, loop iterations, call depth, and the deadline."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.written = 0
        self.iterations = 0
        self.depth = 0

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateBudgetError(f"it ran longer than {self.seconds:g} s")


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("sparklab_template_budget", default=None)


def _budget() -> _Budget:
    budget = _BUDGET.get()
    if budget is None:  # a template rendered outside render_template (never in sparklab): a fresh account
        budget = _Budget(MAX_SECONDS)
        _BUDGET.set(budget)
    budget.tick()
    return budget


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict | set | frozenset) else 0


def _check_size(size: int, what: str) -> None:
    if size > MAX_VALUE:
        raise TemplateBudgetError(f"{what} would be {size:,} characters or items long (at most {MAX_VALUE:,})")


def _check_int(value: int, what: str) -> None:
    if abs(value) > MAX_VALUE:
        raise TemplateBudgetError(f"{what} {value:,} is larger than {MAX_VALUE:,}")


# A printf conversion: flags, width (digits or *), precision (digits or *), type.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")


def _check_printf(fmt: str) -> None:
    """`'%999999999d' % 1` would allocate 1 GB: widths and precisions are bounded, `*` (from the values) refused."""
    for width, precision in _PRINTF.findall(fmt):
        for number in (width, precision):
            if number == "*":
                raise TemplateBudgetError("a `*` width or precision in a % format is not allowed")
            if number:
                _check_int(int(number), "a % format width or precision of")


def _check_format_spec(spec: str) -> None:
    for number in re.findall(r"\d+", spec):
        _check_int(int(number), "a format width or precision of")


class _Formatter(SandboxedFormatter):
    """str.format in a template: Jinja's sandboxed attribute lookup, and bounded widths and precisions."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        _budget()
        _check_format_spec(format_spec)
        return super().format_field(value, format_spec)


def _replaced_size(s: str, old: str, new: str, count: Any = -1) -> int:
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(new) - len(old))


def _joined_size(items: list[Any], separator: str) -> int:
    return sum(len(str(item)) for item in items) + len(separator) * max(len(items) - 1, 0)


def _check_str_method(obj: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Bound what a string method returns before it runs (`'a'.center(999999999)`)."""
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int):
            _check_int(width, f"{name}'s width")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _check_size(len(obj) * max(size, 1), "expandtabs' result")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        _check_size(_replaced_size(obj, args[0], args[1], args[2] if len(args) > 2 else -1), "replace's result")
    elif name == "join" and args:
        items = list(args[0])
        _check_size(len(items), "join's input")
        _check_size(_joined_size(items, obj), "join's result")
    elif name in ("translate", "maketrans"):
        raise TemplateBudgetError(f"str.{name} is not available in templates")


def _items(value: Any) -> list[Any]:
    items = list(value)
    _check_size(len(items), "the filter's input")
    return items


def _check_center(a: dict[str, Any]) -> None:
    _check_int(a["width"], "center's width")


def _check_indent(a: dict[str, Any]) -> None:
    width = a["width"]
    step = len(width) if isinstance(width, str) else width
    _check_int(step, "indent's width")
    _check_size(len(str(a["s"])) + (str(a["s"]).count("\n") + 1) * max(step, 0), "indent's result")


def _check_truncate(a: dict[str, Any]) -> None:
    if not isinstance(a["length"], int) or len(str(a["end"])) > a["length"]:
        raise TemplateBudgetError(f"truncate's end ({len(str(a['end'])):,} characters) is longer than its length "
                                  f"({a['length']!r})")
    if a["leeway"] is not None and a["leeway"] < 0:
        raise TemplateBudgetError("truncate's leeway is negative")


def _check_wordwrap(a: dict[str, Any]) -> None:
    text, width = str(a["s"]), a["width"]
    if not isinstance(width, int) or width < 1:
        raise TemplateBudgetError(f"wordwrap's width must be a whole number above 0, got {width!r}")
    wrap = a["wrapstring"] if a["wrapstring"] is not None else "\n"
    _check_size(len(text) + (len(text) // width + 1) * len(str(wrap)), "wordwrap's result")


def _check_format(a: dict[str, Any]) -> None:
    _check_printf(str(a["value"]))


def _check_replace(a: dict[str, Any]) -> None:
    _check_size(_replaced_size(str(a["s"]), str(a["old"]), str(a["new"]), a["count"] if a["count"] is not None
                               else -1), "replace's result")


def _check_join(a: dict[str, Any]) -> None:
    items = _items(a["value"])
    a["value"] = items  # a generator is read once: join gets the list
    _check_size(_joined_size(items, str(a["d"])), "join's result")


def _check_slice(a: dict[str, Any]) -> None:
    _check_int(a["slices"], "slice's count")
    if a["slices"] > MAX_ITERATIONS:
        raise TemplateBudgetError(f"slice's count {a['slices']:,} is larger than {MAX_ITERATIONS:,}")


def _check_batch(a: dict[str, Any]) -> None:
    _check_int(a["linecount"], "batch's size")


def _check_sum(a: dict[str, Any]) -> None:
    items = _items(a["iterable"])
    a["iterable"] = items
    if _size(a["start"]) or any(_size(item) for item in items):
        _check_size(_size(a["start"]) + sum(_size(item) for item in items), "sum's result")


def _check_tojson(a: dict[str, Any]) -> None:
    if a["indent"] is not None:
        raise TemplateBudgetError("tojson's indent is not available in templates (an argument is one line)")


def _guarded(original: Any, check: Any) -> Any:
    """A filter that runs `check` over its bound arguments first (keeping Jinja's pass_* marker); a check that
    reads a generator puts the list it read back into the arguments, for the filter."""

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _budget()
        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        check(bound.arguments)
        return original(*bound.args, **bound.kwargs)  # positionally: Jinja's async_variant reads args[0]

    return guarded


_CHECKED_FILTERS = {"center": _check_center, "indent": _check_indent, "truncate": _check_truncate,
                    "wordwrap": _check_wordwrap, "format": _check_format, "replace": _check_replace,
                    "slice": _check_slice, "batch": _check_batch, "tojson": _check_tojson, "join": _check_join,
                    "sum": _check_sum}
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
        for name, check in _CHECKED_FILTERS.items():
            self.filters[name] = _guarded(self.filters[name], check)

    # -- hooks the compiled template calls ----------------------------------------------------------------------

    def sparklab_write(self, piece: str) -> str:
        budget = _budget()
        budget.written += len(piece.encode("utf-8", "surrogatepass"))
        if budget.written > MAX_WRITTEN_BYTES:
            raise TemplateBudgetError(f"it writes more than {MAX_WRITTEN_BYTES:,} bytes")
        return piece

    def sparklab_concat(self, pieces: tuple[Any, ...]) -> str:
        _budget()
        texts = [str(p) for p in pieces]
        _check_size(sum(map(len, texts)), "a ~ concatenation")
        return "".join(texts)

    def sparklab_loop(self, iterable: Any) -> Iterator[Any]:
        budget = _budget()
        for item in iterable:
            budget.iterations += 1
            if budget.iterations > MAX_ITERATIONS:
                raise TemplateBudgetError(f"its loops ran more than {MAX_ITERATIONS:,} iterations")
            budget.tick()
            yield item

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        _budget()
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
            _check_size(len(left) + len(right), "a + concatenation")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: jinja2.runtime.Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str):
            _check_str_method(owner, getattr(__obj, "__name__", ""), args, kwargs)
        budget.depth += 1
        try:
            if budget.depth > MAX_DEPTH:
                raise TemplateBudgetError(f"its calls nest deeper than {MAX_DEPTH} (a macro calling itself?)")
            return super().call(__context, __obj, *args, **kwargs)
        finally:
            budget.depth -= 1

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget()
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
    token = _BUDGET.set(_Budget(seconds))
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
        _BUDGET.reset(token)
