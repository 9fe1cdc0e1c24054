"""Secret values out of log text (pure): replaced by *** in whole lines, so a split secret is still caught."""

from __future__ import annotations

from collections.abc import Iterator


def redact(data: bytes, secrets: list[bytes]) -> bytes:
    for secret in secrets:
        data = data.replace(secret, b"***")
    return data


def redacted_lines(chunks: Iterator[bytes], secrets: list[bytes]) -> Iterator[bytes]:
    """Re-chunk a log stream into whole lines so a secret split across chunks is still caught."""
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield redact(line + b"\n", secrets)
    if pending:
        yield redact(pending, secrets)
