"""Incident notes: what an operator tells visitors beside the state, as plain data and its rules.

"server-7 is being upgraded, back at 14:00": a note is attached to a model (its DHT prefix), a
peer (its id) or the whole swarm, and is open until an operator resolves it. Every change is kept
(``NoteUpdate``: posted, updated, resolved, with the text then and who), so the note's history and
the status page's Atom feed can say what was said when.

The text is written by a person with the operator token, but it is shown to everyone, so its rules
are strict all the same (``check_text``): 1 to ``MAX_TEXT`` characters, no control characters but
line breaks and tabs, no bidirectional overrides (which make text read other than it is). The
templates escape it; it is never markup.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Optional

SWARM, MODEL, PEER = "swarm", "model", "peer"
SCOPES = (SWARM, MODEL, PEER)
POSTED, UPDATED, RESOLVED = "posted", "updated", "resolved"
MAX_TEXT = 1000
MAX_AUTHOR = 80
DEFAULT_AUTHOR = "operator"
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f")


@dataclass(frozen=True)
class NoteUpdate:
    at: float
    action: str  # posted | updated | resolved
    text: str
    author: str
    via: str = ""  # api token | browser session


@dataclass(frozen=True)
class Note:
    id: int
    scope: str  # swarm | model | peer
    target: Optional[str]  # DHT prefix or peer id; None: the whole swarm
    text: str
    author: str
    created_at: float
    updated_at: float
    resolved_at: Optional[float] = None
    updates: tuple[NoteUpdate, ...] = ()  # oldest first (when read with its history)

    @property
    def open(self) -> bool:
        return self.resolved_at is None

    def about(self, *, model: Optional[str] = None, peers: tuple[str, ...] = ()) -> bool:
        """Is it shown beside this model (the swarm's notes are shown everywhere) or these peers?"""
        if self.scope == SWARM:
            return True
        if self.scope == MODEL:
            return model is not None and self.target == model
        return self.target in peers

    def what(self) -> str:
        return "the whole swarm" if self.scope == SWARM else f"{self.scope} {self.target}"

    def to_dict(self) -> dict:
        return {"id": self.id, "scope": self.scope, "target": self.target, "text": self.text, "author": self.author,
                "created_at": self.created_at, "updated_at": self.updated_at, "resolved_at": self.resolved_at,
                "open": self.open, "updates": [{"at": u.at, "action": u.action, "text": u.text, "author": u.author}
                                               for u in self.updates]}


def _bad_character(text: str, *, newlines: bool) -> Optional[str]:
    for ch in text:
        if ch in _BIDI:
            return f"U+{ord(ch):04X} (a bidirectional override)"
        if unicodedata.category(ch) in ("Cc", "Cs", "Co", "Cn") and not (newlines and ch in "\n\t"):
            return f"U+{ord(ch):04X} (a control character)"
    return None


def check_text(text: object) -> str:
    """The note's text, stripped (CRLF as LF); ValueError saying what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError("the note's text must be a string")
    text = text.replace("\r\n", "\n").strip()
    if not text:
        raise ValueError("the note's text is empty: say what is happening, e.g. 'server-7 is being upgraded, "
                         "back at 14:00 UTC'")
    if len(text) > MAX_TEXT:
        raise ValueError(f"the note's text has {len(text)} characters; at most {MAX_TEXT} are kept")
    bad = _bad_character(text, newlines=True)
    if bad:
        raise ValueError(f"the note's text contains {bad}; only printable text, line breaks and tabs")
    return text


def check_author(author: object) -> str:
    """Who the operator says they are (optional: ``DEFAULT_AUTHOR``); ValueError if unusable."""
    if author is None or (isinstance(author, str) and not author.strip()):
        return DEFAULT_AUTHOR
    if not isinstance(author, str):
        raise ValueError("author must be a string")
    author = author.strip()
    if len(author) > MAX_AUTHOR:
        raise ValueError(f"author has {len(author)} characters; at most {MAX_AUTHOR}")
    bad = _bad_character(author, newlines=False)
    if bad:
        raise ValueError(f"author contains {bad}")
    return author


def check_scope(scope: object, target: object) -> tuple[str, Optional[str]]:
    """(scope, target) with the target None for the swarm; ValueError otherwise. Whether a target
    is a well-formed DHT prefix or peer id is the web's check (``monitor.web.security``)."""
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {str(scope)[:40]!r}")
    if scope == SWARM:
        if target not in (None, ""):
            raise ValueError("a note on the whole swarm takes no target")
        return SWARM, None
    if not isinstance(target, str) or not target:
        raise ValueError(f"a note on a {scope} needs its target: the {'DHT prefix' if scope == MODEL else 'peer id'}")
    return scope, target
