"""Secret values out of log text (pure), wherever the text is cut.

A secret may reach a log split across stream chunks, wrapped onto the next line (engines that wrap long lines
put a newline, and indentation, inside the value), or cut by a read that starts mid-log (`docker logs --tail`
whose first line is the wrapped secret's second half). Each of these is replaced by ***; line breaks inside a
secret are kept so the log keeps its shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MASK = b"***"
_BREAK = rb"\r?\n[ \t]{0,32}"  # a wrapped line: a newline and some indentation
_BREAK_RE = re.compile(_BREAK)
# A read that starts inside a secret shows only its end; shorter fragments than this are left alone (too
# little to matter, too likely to be ordinary text).
MIN_FRAGMENT = 6


def _pattern(secrets: list[bytes]) -> re.Pattern[bytes] | None:
    """Each secret, longest first, with an optional line break between any two of its bytes."""
    optional_break = b"(?:" + _BREAK + b")?"
    alternatives = [optional_break.join(re.escape(bytes([c])) for c in s)
                    for s in sorted(set(secrets), key=len, reverse=True) if s]
    return re.compile(b"|".join(alternatives)) if alternatives else None


def _mask(match: re.Match[bytes]) -> bytes:
    return MASK + b"".join(_BREAK_RE.findall(match.group()))


def _leading_fragment(data: bytes, secrets: list[bytes]) -> int:
    """The length of a secret's end at the very start of data (the read began inside it), else 0."""
    for secret in sorted(secrets, key=len, reverse=True):
        for size in range(len(secret) - 1, MIN_FRAGMENT - 1, -1):
            if data.startswith(secret[-size:]):
                return size
    return 0


def redact(data: bytes, secrets: list[bytes], starts_mid_log: bool = True) -> bytes:
    """Every secret in data replaced by ***, also when wrapped across lines or cut off at the start."""
    pattern = _pattern(secrets)
    if pattern is None:
        return data
    cut = _leading_fragment(data, secrets) if starts_mid_log else 0
    head = MASK if cut else b""
    return head + pattern.sub(_mask, data[cut:])


def _could_begin(tail: bytes, secret: bytes) -> bool:
    """Whether tail is the start of secret, possibly wrapped (more bytes may still arrive)."""
    i = j = 0
    while i < len(tail):
        if j < len(secret) and tail[i] == secret[j]:
            i, j = i + 1, j + 1
            continue
        if not 0 < j < len(secret):
            return False
        wrap = _BREAK_RE.match(tail, i)
        if wrap is not None:
            i = wrap.end()
            if i < len(tail) and tail[i] != secret[j]:
                return False
            continue
        return tail[i:] == b"\r"  # half of a \r\n
    return j < len(secret)


def _safe_end(pending: bytes, secrets: list[bytes]) -> int:
    """Where the text that may be the start of a secret begins: everything before it can be written."""
    longest = max(len(s) * 35 for s in secrets)  # each byte, then a break of up to 34 bytes
    firsts = {s[0] for s in secrets}
    for start in range(max(0, len(pending) - longest), len(pending)):
        if pending[start] in firsts and any(_could_begin(pending[start:], s) for s in secrets):
            return start
    return len(pending)


def redacted_lines(chunks: Iterator[bytes], secrets: list[bytes], starts_mid_log: bool = False) -> Iterator[bytes]:
    """A log stream with every secret replaced, however the stream's chunks and lines cut it.

    Text that could be the beginning of a secret is held back until the next chunk shows whether it is; the
    rest is written at once (a quiet server's last line is not held).
    """
    secrets = [s for s in secrets if s]
    if not secrets:
        yield from chunks
        return
    pending = b""
    mid_log = starts_mid_log
    for chunk in chunks:
        if not chunk:
            continue
        pending = redact(pending + chunk, secrets, starts_mid_log=mid_log)
        mid_log = False
        cut = _safe_end(pending, secrets)
        if cut:
            yield pending[:cut]
            pending = pending[cut:]
    if pending:
        yield redact(pending, secrets, starts_mid_log=mid_log)
