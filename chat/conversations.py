"""The chat page's conversations kept in the store, per visitor — the one place the monitor keeps
text, and only for the visitor who wrote it (the request rows keep none).

A **visitor** is a browser: a random id in a cookie of its own (``chat_visitor``), signed with a
secret the store keeps for the chat page alone (``store.conversations.visitor_secret``), so that
rotating the operator's token orphans nobody. Every read and write names the visitor; another
visitor's conversation id answers as unknown. Bounds (``ConversationLimits``): conversations per
visitor, characters per conversation, conversations in all, new visitors per address and day (a
bot minting cookies cannot fill the store), a title's length; conversations not continued for ``retention_days`` are
deleted (checked at most once a minute, as conversations are saved). With ``keep`` off nothing is
stored and the page says so.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from itsdangerous import BadSignature, URLSafeSerializer

from monitor.core.common import DAY
from monitor.store import conversations as sql

from chat.errors import Busy, InvalidRequest

VISITOR_COOKIE = "chat_visitor"
MAX_TITLE_CHARS = 120
PRUNE_EVERY = 60.0  # seconds between retention checks
MAX_QUERY_CHARS = 200


@dataclass(frozen=True)
class ConversationLimits:
    keep: bool = True  # store conversations at all
    retention_days: float = 30.0  # after their last message
    per_visitor: int = 100  # conversations one visitor keeps
    max_chars: int = 200_000  # characters of one conversation's messages, all together
    new_visitors_per_address: int = 20  # per day, from one client address
    in_all: int = 100_000  # conversations kept, all visitors together

    @classmethod
    def from_settings(cls, settings: Any) -> "ConversationLimits":
        return cls(keep=settings.chat_keep_conversations, retention_days=settings.chat_conversation_retention_days,
                   per_visitor=settings.chat_conversations_kept, max_chars=settings.chat_conversation_max_chars,
                   new_visitors_per_address=settings.chat_new_visitors_per_address,
                   in_all=settings.chat_conversations_in_all)


def title_of(message: str) -> str:
    """A conversation's first title: its first question's first line, white space folded, cut."""
    line = next((line for line in message.splitlines() if line.strip()), "")
    title = re.sub(r"\s+", " ", line).strip()
    return (title[: MAX_TITLE_CHARS - 1] + "…") if len(title) > MAX_TITLE_CHARS else (title or "Conversation")


def clean_title(title: str) -> str:
    """A title a visitor gave: one line, white space folded; refused empty or too long."""
    cleaned = re.sub(r"\s+", " ", title or "").strip()
    if not cleaned:
        raise InvalidRequest("title", "the title is empty; give the conversation a name")
    if len(cleaned) > MAX_TITLE_CHARS:
        raise InvalidRequest("title", f"the title is {len(cleaned)} characters long; at most {MAX_TITLE_CHARS}")
    return cleaned


class ConversationStore:
    """Conversations and visitors in the store, bounded; ``clock`` injected for the specs."""

    def __init__(self, store: Any, limits: ConversationLimits = ConversationLimits(), *,
                 clock: Callable[[], float] = time.time):
        self.store, self.limits, self.clock = store, limits, clock
        self._secret: Optional[str] = None
        self._pruned = 0.0
        self._lock = threading.Lock()

    # -- visitors ---------------------------------------------------------------------------------
    def _signer(self) -> URLSafeSerializer:
        if self._secret is None:
            with self.store.db.write("reading the chat's visitor secret") as conn:
                self._secret = sql.visitor_secret(conn)
        return URLSafeSerializer(self._secret, salt="chat-visitor")

    def visitor_of(self, cookie: Optional[str]) -> Optional[str]:
        """The visitor id a cookie carries, if it is one this chat signed."""
        if not cookie or len(cookie) > 200:
            return None
        try:
            visitor = self._signer().loads(cookie)
        except BadSignature:
            return None
        return visitor if isinstance(visitor, str) and 0 < len(visitor) <= 64 else None

    def new_visitor(self, address: Optional[str]) -> tuple[str, str]:
        """(visitor id, its signed cookie) for a browser seen first, or Busy when its address made
        too many visitors today."""
        signer = self._signer()
        key = hmac.new(self._secret.encode(), (address or "?").encode(), hashlib.sha256).hexdigest()[:32]
        now = self.clock()
        visitor = secrets.token_urlsafe(18)
        with self.store.db.write("adding a chat visitor") as conn:
            if sql.new_visitors_from(conn, key, now - DAY) >= self.limits.new_visitors_per_address:
                raise Busy(f"too many new chat visitors from your address today (at most "
                           f"{self.limits.new_visitors_per_address}); keep your browser's cookies to go on with "
                           f"your conversations", 3600)
            sql.add_visitor(conn, visitor, key, now)
        return visitor, signer.dumps(visitor)

    # -- conversations ----------------------------------------------------------------------------
    def listed(self, visitor: str, query: str = "") -> list[dict]:
        with self.store.db.read("listing conversations") as conn:
            return sql.listed(conn, visitor, query=(query or "").strip()[:MAX_QUERY_CHARS],
                              limit=self.limits.per_visitor)

    def get(self, visitor: Optional[str], conversation: Optional[str]) -> Optional[dict]:
        if not visitor or not conversation or len(conversation) > 32:
            return None
        with self.store.db.read("reading a conversation") as conn:
            return sql.get(conn, visitor, conversation)

    def check_room(self, visitor: str, conversation: Optional[str], chars: int, *, new: bool) -> None:
        """Refuse a turn the store could not keep: a new conversation past the visitor's count, or a
        conversation past its characters."""
        if not self.limits.keep:
            return
        if chars > self.limits.max_chars:
            raise InvalidRequest("message", f"this conversation would be {chars:,} characters long; at most "
                                            f"{self.limits.max_chars:,} are kept per conversation: start a new one")
        if new:
            with self.store.db.read("counting conversations") as conn:
                kept, everyone = sql.count(conn, visitor), sql.count(conn)
            if kept >= self.limits.per_visitor:
                raise InvalidRequest("message", f"you keep {kept} conversations, the most kept per visitor; delete "
                                                f"some in the list to start another")
            if everyone >= self.limits.in_all:
                raise Busy(f"this chat keeps {everyone:,} conversations, the most it keeps for all its visitors; "
                           f"go on with one of yours, or try again when older ones have expired", 3600)

    def save(self, visitor: str, conversation: str, *, model: str, system: str, messages: list[dict],
             title: Optional[str] = None) -> None:
        if not self.limits.keep:
            return
        now = self.clock()
        text = "\n".join(m["content"] for m in messages)
        row = {"id": conversation, "visitor": visitor, "model": model[:256], "system": system, "messages": messages,
               "search_text": text.lower(), "chars": len(text), "created_at": now, "updated_at": now}
        with self.store.db.write("saving a conversation") as conn:
            existing = sql.get(conn, visitor, conversation)
            row["title"] = existing["title"] if existing else (title or title_of(
                next((m["content"] for m in messages if m["role"] == "user"), "")))
            sql.save(conn, row)
        self.prune()

    def rename(self, visitor: str, conversation: str, title: str) -> bool:
        title = clean_title(title)
        with self.store.db.write("renaming a conversation") as conn:
            return sql.rename(conn, visitor, conversation, title)

    def delete(self, visitor: str, conversation: Optional[str] = None) -> int:
        with self.store.db.write("deleting conversations") as conn:
            return sql.delete(conn, visitor, conversation)

    def prune(self, *, force: bool = False) -> int:
        now = self.clock()
        with self._lock:
            if not force and now - self._pruned < PRUNE_EVERY:
                return 0
            self._pruned = now
        with self.store.db.write("pruning conversations") as conn:
            return sql.prune(conn, now - self.limits.retention_days * DAY)


# ---- export and import ------------------------------------------------------------------------------

EXPORT_FORMAT = "swarm-monitor-conversation"
MAX_IMPORTED_MESSAGES = 1000
ROLES = ("system", "user", "assistant")


def exported(conversation: dict, kind: str) -> tuple[str, str]:
    """(body, mimetype) of a stored conversation as Markdown (``md``) or as JSON (``json``: OpenAI's
    ``messages``, the system prompt first, each answer's route and speed under ``petals``)."""
    messages = [m for m in conversation["messages"] or () if m.get("role") in ("user", "assistant")]
    if kind == "md":
        parts = [f"# {conversation['title']}", f"Model: {conversation['model']}"]
        if conversation["system"]:
            parts.append(f"**System:** {conversation['system']}")
        for m in messages:
            parts.append(f"## {'You' if m['role'] == 'user' else 'Assistant'}\n\n{m['content']}")
        return "\n\n".join(parts) + "\n", "text/markdown; charset=utf-8"
    asked = [m for m in messages if m["role"] == "user" and isinstance(m.get("params"), dict)]
    body = {"format": EXPORT_FORMAT, "version": 1, "title": conversation["title"], "model": conversation["model"],
            "parameters": asked[-1]["params"] if asked else {},
            "messages": ([{"role": "system", "content": conversation["system"]}] if conversation["system"] else [])
            + [{"role": m["role"], "content": m["content"], **({"petals": m["meta"]} if m.get("meta") else {})}
               for m in messages]}
    return json.dumps(body, ensure_ascii=False, indent=2), "application/json"


def imported(raw: bytes, limits: ConversationLimits) -> dict:
    """A conversation from exported JSON (or any OpenAI ``messages`` list), checked whole: a clear
    ``InvalidRequest`` for anything malformed or beyond the bounds, and nothing kept of it."""
    if not raw:
        raise InvalidRequest("file", "choose a conversation's JSON file to import")
    if len(raw) > limits.max_chars * 4:
        raise InvalidRequest("file", f"the file is over {limits.max_chars * 4:,} bytes; a conversation is at most "
                                     f"{limits.max_chars:,} characters")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise InvalidRequest("file", "the file is not JSON (export a conversation as JSON to import it)") from None
    listed = body.get("messages") if isinstance(body, dict) else body
    if not isinstance(listed, list) or not listed:
        raise InvalidRequest("file", "the file has no list of messages")
    if len(listed) > MAX_IMPORTED_MESSAGES:
        raise InvalidRequest("file", f"the file has {len(listed)} messages; at most {MAX_IMPORTED_MESSAGES}")
    system, messages = "", []
    for index, m in enumerate(listed):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise InvalidRequest("file", f"message {index + 1} is not {{role: system/user/assistant, content: text}}")
        if m["role"] == "system":
            system = m["content"] if not messages else system
            continue
        meta = m.get("petals") if isinstance(m.get("petals"), dict) and m["role"] == "assistant" else None
        messages.append({"role": m["role"], "content": m["content"], **({"meta": _clean_meta(meta)} if meta else {})})
    if not any(m["role"] == "user" for m in messages):
        raise InvalidRequest("file", "the file has no question (a user message)")
    chars = len(system) + sum(len(m["content"]) for m in messages)
    if chars > limits.max_chars:
        raise InvalidRequest("file", f"the conversation is {chars:,} characters long; at most {limits.max_chars:,}")
    title = body.get("title") if isinstance(body, dict) and isinstance(body.get("title"), str) else None
    model = body.get("model") if isinstance(body, dict) and isinstance(body.get("model"), str) else ""
    short = re.sub(r"\s+", " ", title[: 10 * MAX_TITLE_CHARS]).strip()[:MAX_TITLE_CHARS] if title else ""
    return {"system": system, "messages": messages, "model": model[:256],
            "title": short or title_of(next(m["content"] for m in messages if m["role"] == "user"))}


def _clean_meta(meta: dict) -> dict:
    """Of an imported answer's ``petals``: its speed figures, if numbers (a route is not taken on trust)."""
    return {key: float(meta[key]) for key in ("tokens_per_second", "time_to_first_token")
            if isinstance(meta.get(key), (int, float)) and not isinstance(meta.get(key), bool)
            and 0 <= float(meta[key]) < 1e9}
