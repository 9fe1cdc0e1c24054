"""What one recipe template may cost, and the checks that hold it there: the bounds (MAX_*), one render's
account of bytes written, loop iterations, call depth and deadline (Budget, kept in BUDGET for the render under way),
and the checks run before a value is built: sizes, integers, printf and format widths, str methods, and the Jinja
filters that pad, repeat or join (CHECKED_FILTERS, wrapped by guarded_filter). Each raises TemplateBudgetError;
the sandbox that calls them, and turns that into a RecipeError, is sparklab.recipes.sandbox.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import re
import time
from typing import Any

from jinja2.sandbox import SecurityError

MAX_SOURCE_CHARS = 65_536
MAX_WRITTEN_BYTES = 131_072  # Linux's limit on one argument of a command line (MAX_ARG_STRLEN)
MAX_VALUE = 1_000_000
MAX_INT_BITS = 100_000
MAX_ITERATIONS = 100_000
MAX_DEPTH = 32
MAX_SECONDS = 2.0


class TemplateBudgetError(SecurityError):
    """A template went past one of its bounds."""


class Budget:
    """One render's account: bytes written, loop iterations, call depth, and the deadline. The deadline is in the
    render thread's CPU time (time.thread_time): what the template itself costs. A wall-clock deadline refused
    `{{ nodes }}` after 2 s on a host whose cores a CPU engine kept busy: the render had waited, not worked."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.thread_time() + seconds
        self.seconds = seconds
        self.written = 0
        self.iterations = 0
        self.depth = 0

    def tick(self) -> None:
        if time.thread_time() > self.deadline:
            raise TemplateBudgetError(f"it ran longer than {self.seconds:g} s")


BUDGET: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("sparklab_template_budget", default=None)


def current_budget() -> Budget:
    budget = BUDGET.get()
    if budget is None:  # a template rendered outside render_template (never in sparklab): a fresh account
        budget = Budget(MAX_SECONDS)
        BUDGET.set(budget)
    budget.tick()
    return budget


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str | bytes | list | tuple | dict | set | frozenset) else 0


def check_size(size: int, what: str) -> None:
    if size > MAX_VALUE:
        raise TemplateBudgetError(f"{what} would be {size:,} characters or items long (at most {MAX_VALUE:,})")


def _check_int(value: int, what: str) -> None:
    if abs(value) > MAX_VALUE:
        raise TemplateBudgetError(f"{what} {value:,} is larger than {MAX_VALUE:,}")


# A printf conversion: flags, width (digits or *), precision (digits or *), type.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d*)(?:\.(\*|\d*))?[hlL]?[a-zA-Z%]")


def check_printf(fmt: str) -> None:
    """`'%999999999d' % 1` would allocate 1 GB: widths and precisions are bounded, `*` (from the values) refused."""
    for width, precision in _PRINTF.findall(fmt):
        for number in (width, precision):
            if number == "*":
                raise TemplateBudgetError("a `*` width or precision in a % format is not allowed")
            if number:
                _check_int(int(number), "a % format width or precision of")


def check_format_spec(spec: str) -> None:
    for number in re.findall(r"\d+", spec):
        _check_int(int(number), "a format width or precision of")


def _replaced_size(s: str, old: str, new: str, count: Any = -1) -> int:
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(new) - len(old))


def _joined_size(items: list[Any], separator: str) -> int:
    return sum(len(str(item)) for item in items) + len(separator) * max(len(items) - 1, 0)


def check_str_method(obj: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Bound what a string method returns before it runs (`'a'.center(999999999)`)."""
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int):
            _check_int(width, f"{name}'s width")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            check_size(len(obj) * max(size, 1), "expandtabs' result")
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        check_size(_replaced_size(obj, args[0], args[1], args[2] if len(args) > 2 else -1), "replace's result")
    elif name == "join" and args:
        items = list(args[0])
        check_size(len(items), "join's input")
        check_size(_joined_size(items, obj), "join's result")
    elif name in ("translate", "maketrans"):
        raise TemplateBudgetError(f"str.{name} is not available in templates")


def _items(value: Any) -> list[Any]:
    items = list(value)
    check_size(len(items), "the filter's input")
    return items


def _check_center(a: dict[str, Any]) -> None:
    _check_int(a["width"], "center's width")


def _check_indent(a: dict[str, Any]) -> None:
    width = a["width"]
    step = len(width) if isinstance(width, str) else width
    _check_int(step, "indent's width")
    check_size(len(str(a["s"])) + (str(a["s"]).count("\n") + 1) * max(step, 0), "indent's result")


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
    check_size(len(text) + (len(text) // width + 1) * len(str(wrap)), "wordwrap's result")


def _check_format(a: dict[str, Any]) -> None:
    check_printf(str(a["value"]))


def _check_replace(a: dict[str, Any]) -> None:
    check_size(_replaced_size(str(a["s"]), str(a["old"]), str(a["new"]), a["count"] if a["count"] is not None
                               else -1), "replace's result")


def _check_join(a: dict[str, Any]) -> None:
    items = _items(a["value"])
    a["value"] = items  # a generator is read once: join gets the list
    check_size(_joined_size(items, str(a["d"])), "join's result")


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
        check_size(_size(a["start"]) + sum(_size(item) for item in items), "sum's result")


def _check_tojson(a: dict[str, Any]) -> None:
    if a["indent"] is not None:
        raise TemplateBudgetError("tojson's indent is not available in templates (an argument is one line)")


def guarded_filter(original: Any, check: Any) -> Any:
    """A filter that runs `check` over its bound arguments first (keeping Jinja's pass_* marker); a check that
    reads a generator puts the list it read back into the arguments, for the filter."""

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        current_budget()
        bound = inspect.signature(original).bind(*args, **kwargs)
        bound.apply_defaults()
        check(bound.arguments)
        return original(*bound.args, **bound.kwargs)  # positionally: Jinja's async_variant reads args[0]

    return guarded


CHECKED_FILTERS = {"center": _check_center, "indent": _check_indent, "truncate": _check_truncate,
                    "wordwrap": _check_wordwrap, "format": _check_format, "replace": _check_replace,
                    "slice": _check_slice, "batch": _check_batch, "tojson": _check_tojson, "join": _check_join,
                    "sum": _check_sum}
