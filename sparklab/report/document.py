"""A small document model (sections of paragraphs, lists, tables, code, images) and its two renderings:
paste-ready Markdown and one self-contained HTML file (images inlined as data URIs). Pure.

Text may hold `code spans`; everything else is literal (escaped for HTML, table pipes escaped for Markdown).
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment

# C0 and C1 control characters but newline and tab: an ESC from a stored string could set the reader's clipboard
# (OSC 52) or clear the screen (ESC[2J) when a report is printed; a carriage return could overwrite a line.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """Text that may reach a terminal: every control character shown as \\xNN, never obeyed."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def json_visible(text: str) -> str:
    """JSON text with the control characters json.dumps leaves raw (DEL, C1) as \\u escapes: the same data."""
    return _CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", text)

@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...] = ()  # right-aligned columns

    def __post_init__(self) -> None:
        if any(len(row) != len(self.header) for row in self.rows):
            raise ValueError("every table row needs one cell per header column")


@dataclass(frozen=True)
class Code:
    text: str


@dataclass(frozen=True)
class Image:
    title: str
    path: Path  # the PNG file; Markdown links it relative to the report, HTML embeds it


Block = Para | Bullets | Table | Code | Image


@dataclass
class Section:
    title: str
    level: int = 2
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Document:
    title: str
    sections: list[Section]


# -- Markdown ------------------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> str:
    align = [("---:" if table.numeric and table.numeric[i] else "---") for i in range(len(table.header))]
    lines = ["| " + " | ".join(_md_cell(h) for h in table.header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    return "\n".join(lines)


def _md_block(block: Block, base: Path | None) -> str:
    if isinstance(block, Para):
        return block.text
    if isinstance(block, Bullets):
        return "\n".join(f"- {item}" for item in block.items)
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Code):
        return f"```\n{block.text}\n```"
    path = block.path.relative_to(base) if base and block.path.is_relative_to(base) else block.path
    return f"![{block.title}]({path.as_posix()})"


def markdown(doc: Document, base: Path | None = None) -> str:
    """base: the directory the Markdown file is written to (image links are made relative to it)."""
    parts = [f"# {doc.title}"]
    for section in doc.sections:
        parts.append(f"{'#' * section.level} {section.title}")
        parts += [_md_block(block, base) for block in section.blocks]
    return "\n\n".join(parts) + "\n"


# -- HTML ------------------------------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"`([^`]+)`")


def _inline(text: str) -> str:
    return _CODE_SPAN.sub(lambda m: f"<code>{m.group(1)}</code>", html.escape(text, quote=False))


def _html_block(block: Block) -> str:
    if isinstance(block, Para):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(item)}</li>" for item in block.items) + "</ul>"
    if isinstance(block, Table):
        def cls(i: int) -> str:
            return ' class="num"' if block.numeric and block.numeric[i] else ""
        head = "".join(f"<th{cls(i)}>{_inline(h)}</th>" for i, h in enumerate(block.header))
        body = "".join("<tr>" + "".join(f"<td{cls(i)}>{_inline(c)}</td>" for i, c in enumerate(row)) + "</tr>"
                       for row in block.rows)
        return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
    if isinstance(block, Code):
        return f"<pre><code>{html.escape(block.text, quote=False)}</code></pre>"
    data = base64.b64encode(block.path.read_bytes()).decode("ascii")
    return (f'<figure><img class="plot" alt="{html.escape(block.title)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{html.escape(block.title)}</figcaption></figure>")


_PAGE = ImmutableSandboxedEnvironment(autoescape=True).from_string("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 78rem; padding: 0 1rem; color: #222; }
h1 { font-size: 1.6rem; } h2 { font-size: 1.25rem; margin-top: 2rem; border-bottom: 1px solid #ddd; }
h3 { font-size: 1.05rem; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.5rem; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num, th.num { text-align: right; white-space: nowrap; }
code, pre { font: 13px ui-monospace, monospace; background: #f6f6f6; }
pre { padding: 0.6rem; overflow-x: auto; }
figure { margin: 1rem 0; } img.plot { max-width: 100%; border: 1px solid #eee; }
figcaption, #render-check { color: #666; font-size: 0.85rem; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
{% for section in sections %}<h{{ section.level }}>{{ section.title }}</h{{ section.level }}>
{% for block in section.blocks %}{{ block }}
{% endfor %}{% endfor %}
<footer id="render-check">figures: not checked (scripts off)</footer>
<script>
// Says in the page whether every embedded figure decoded, for readers and for the test that opens it.
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.querySelectorAll("img.plot"));
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length;
  document.getElementById("render-check").textContent = "figures: " + ok + " of " + imgs.length + " rendered";
});
</script>
</body>
</html>
""")


def to_html(doc: Document) -> str:
    from markupsafe import Markup

    sections = [{"title": s.title, "level": s.level, "blocks": [Markup(_html_block(b)) for b in s.blocks]}
                for s in doc.sections]
    return _PAGE.render(title=doc.title, sections=sections)
