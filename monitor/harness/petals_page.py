"""chat.petals.dev's chat page (its ``chat.js``, CHATBOT regime): what it sends and how it reacts
to an error, written once for whoever replays it — the spec that drives a conversation past 512
tokens (``tests/test_chat_petals_page_flow.py``) and the benchmark that runs 32 of its users
(``scripts/bench_chat_use.py``). The page's words and its rule for errors are these:

- a session is opened with ``max_length`` 512 (``FIRST_SESSION_LENGTH``);
- a turn sends only the replicas the session has not seen yet, a human's ended by the model's
  separator, an earlier answer by its stop token, with ``max_new_tokens`` 1 (the server streams
  chunks until the stop sequence) and the page's sampling;
- on an error while its user waits, the page resets its session and retries by itself on
  ``Session … expired`` (and a closed connection), grows the session fourfold on
  ``Maximum length exceeded`` up to the model's longest, and otherwise shows the error; while
  its user reads, a message or a closed socket only resets its session.

``ChatPage`` is the page itself on one WebSocket, driven synchronously (its user's Enter, its
handlers as their messages come); the spec and the benchmark subclass it for what they record.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from simple_websocket import Client, ConnectionClosed

FIRST_SESSION_LENGTH = 512
GROWTH = 4  # the page's session grows fourfold on "Maximum length exceeded"
PAGE_PARAMS = {"do_sample": 1, "temperature": 0.9, "top_p": 0.6}  # the page's sampling
_EXPIRED = re.compile(r"Session .+ expired")


@dataclass(frozen=True)
class PageModel:
    """A model as the page's ``models`` table describes it."""

    max_session_length: int = 8192
    sep_token: str = "\n"
    stop_token: str = "\n"
    extra_stop_sequences: Optional[list] = None


def open_message(model: str, max_length: int) -> dict:
    return {"type": "open_inference_session", "model": model, "max_length": max_length}


def generate_message(replicas: Sequence[Sequence[str]], position: int, page: PageModel) -> tuple[dict, int]:
    """The ``generate`` message for the replicas from ``position`` on (``[kind, text]``, kind
    "human" or "ai"), and the position after them."""
    phrases = []
    for i in range(position, len(replicas)):
        kind, phrase = replicas[i]
        if kind == "human":
            phrase += page.sep_token
        elif i < len(replicas) - 1:
            phrase += page.stop_token
        phrases.append(phrase)
    return ({"type": "generate", "inputs": "".join(phrases), "max_new_tokens": 1, "stop_sequence": page.stop_token,
             "extra_stop_sequences": page.extra_stop_sequences, **PAGE_PARAMS}, len(replicas))


def answer_so_far(text: str, outputs: str, page: PageModel) -> str:
    """The answer shown once ``outputs`` came (the stop token is not shown)."""
    return (text + outputs).replace(page.stop_token, "", 1)


def after_failure(message: str, session_length: int, page: PageModel, *, auto_retry: bool = False) -> tuple[bool, int]:
    """(does the page retry by itself, its session length from now on) after ``message``, for a
    user waiting for an answer."""
    if _EXPIRED.search(message):
        auto_retry = True
    if "Maximum length exceeded" in message and session_length < page.max_session_length:
        return True, min(session_length * GROWTH, page.max_session_length)
    return auto_retry, session_length


class NoReply(Exception):
    """The server sent nothing for the page's ``reply_timeout`` while its user waited."""


class ChatPage:
    """chat.petals.dev's chat page on one tab: ``ask`` is its user typing and pressing Enter, the
    page's event handlers run as their messages come. It keeps what it sent (``("open",
    max_length)`` / ``("generate",)``), every ``{"ok": false}`` it got, what its error box showed,
    and the outputs of every reply to its latest ``generate``. Hooks for whoever records more:
    ``on_ask`` (Enter, just before the page sends) and ``on_reply`` (each reply that streams)."""

    def __init__(self, ws_url: str, address: str, model: str, page: PageModel = PageModel(), *,
                 reply_timeout: float = 60):
        self.ws_url, self.headers, self.model, self.page = ws_url, {"X-Forwarded-For": address}, model, page
        self.reply_timeout = reply_timeout
        self.replicas: list[list[str]] = []  # [kind, text]: "human" / "ai"
        self.ws: Optional[Client] = None
        self.position = 0
        self.session_length = FIRST_SESSION_LENGTH
        self.waiting_for_inputs = True
        self.sent: list[tuple] = []
        self.received_errors: list[str] = []
        self.shown: list[str] = []
        self.streamed: list[str] = []
        self._on_message = self._on_reply

    @property
    def opens(self) -> int:
        """Sessions the page opened."""
        return sum(1 for sent in self.sent if sent[0] == "open")

    @property
    def answer(self) -> str:
        """The latest answer as the page shows it."""
        return self.replicas[-1][1]

    # -- the user ---------------------------------------------------------------------------------
    def ask(self, text: str, timeout: Optional[float] = None) -> Optional[str]:
        """Type ``text`` and press Enter; once the answer is whole (or stopped), None, else the error
        the page showed. ``timeout``: the whole turn's (``TimeoutError``); ``NoReply`` when the
        server sends nothing for ``reply_timeout``."""
        self.events_while_reading()
        self.replicas += [["human", "Human: " + text], ["ai", "Assistant:"]]
        self.waiting_for_inputs = False
        shown = len(self.shown)
        deadline = None if timeout is None else time.monotonic() + timeout
        self.on_ask()
        self._send_replica()
        while not self.waiting_for_inputs and len(self.shown) == shown:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("no answer in time")
            self._receive()
        return self.shown[-1] if len(self.shown) > shown else None

    def events_while_reading(self) -> None:
        """What the page's handlers did while its user read: a message or a close resets the session."""
        if self.ws is None:
            return
        try:
            while True:
                raw = self.ws.receive(timeout=0)
                if raw is None:
                    return
                response = json.loads(raw)
                if not response["ok"]:
                    self.received_errors.append(response["traceback"])
                    self._reset_session()
                    return
        except ConnectionClosed:  # ws.onclose
            self._reset_session()

    def stop_generation(self) -> None:
        """The page's "stop generation": it resets its session, the answer stays as it is."""
        self._reset_session()
        self.waiting_for_inputs = True

    def close(self) -> None:
        self._reset_session()

    # -- hooks ------------------------------------------------------------------------------------
    def on_ask(self) -> None:
        """Its user pressed Enter (the page sends next)."""

    def on_reply(self, response: dict) -> bool:
        """A reply streamed (``ok``); whether its user clicks "stop generation" unless it is the last."""
        return False

    # -- chat.js ----------------------------------------------------------------------------------
    def _open_session(self) -> None:
        self.ws = Client.connect(self.ws_url, headers=self.headers)
        self.ws.send(json.dumps(open_message(self.model, self.session_length)))
        self.sent.append(("open", self.session_length))
        self._on_message = self._on_open

    def _on_open(self, response: dict) -> None:
        if not response["ok"]:
            self._handle_failure(response["traceback"])
            return
        self._send_replica()

    def _send_replica(self) -> None:
        if self.ws is None:
            self._open_session()
            return
        message, self.position = generate_message(self.replicas, self.position, self.page)
        self.ws.send(json.dumps(message))
        self.sent.append(("generate",))
        self.streamed = []
        self._on_message = self._on_reply

    def _on_reply(self, response: dict) -> None:
        if not response["ok"]:
            self._handle_failure(response["traceback"])
            return
        stop = self.on_reply(response)
        self.streamed.append(response["outputs"])
        self.replicas[-1][1] = answer_so_far(self.replicas[-1][1], response["outputs"], self.page)
        if response["stop"]:
            self.waiting_for_inputs = True  # appendTextArea()
        elif stop:
            self.stop_generation()

    def _handle_failure(self, message: str, auto_retry: bool = False) -> None:
        self._reset_session()
        if self.waiting_for_inputs:
            return  # the error and the retry button only for a user waiting for an answer
        auto_retry, self.session_length = after_failure(message, self.session_length, self.page,
                                                        auto_retry=auto_retry)
        if auto_retry:
            self._send_replica()  # retry()
        else:
            self.shown.append(message)

    def _reset_session(self) -> None:
        if self.ws is not None:
            try:
                self.ws.close()
            except Exception:  # noqa: BLE001 - the server may have closed it already
                pass
        self.ws = None
        self.position = 0

    # -- the socket -------------------------------------------------------------------------------
    def _receive(self) -> None:
        try:
            raw = self.ws.receive(timeout=self.reply_timeout)
        except ConnectionClosed:  # ws.onclose: "Connection was closed", with autoRetry
            self._handle_failure("Connection was closed", auto_retry=True)
            return
        if raw is None:
            raise NoReply(f"no reply for {self.reply_timeout:g} s")
        response = json.loads(raw)
        if not response["ok"]:
            self.received_errors.append(response["traceback"])
        self._on_message(response)
