"""Server-sent events as a browser's EventSource reads them, for the specs and the benchmarks that
read the chat's streams: lines end at CR LF, LF or CR only (an answer may hold form feeds and the
like, at which ``str.splitlines`` and requests' ``iter_lines`` would split too)."""

from __future__ import annotations

from typing import Iterable, Iterator, Union


def events(chunks: Iterable[Union[str, bytes]]) -> Iterator[tuple[str, str]]:
    """(event, data) of every event in a stream given in chunks of any size."""
    event, data, pending = "message", [], ""
    for chunk in chunks:
        pending += (chunk.decode(errors="replace") if isinstance(chunk, bytes) else chunk)
        pending = pending.replace("\r\n", "\n").replace("\r", "\n")
        *lines, pending = pending.split("\n")
        for line in lines:
            if line == "":
                if data:
                    yield event, "\n".join(data)
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[6:] if line[5:].startswith(" ") else line[5:])
