"""The chat page (``/chat``): a conversation in the browser, one turn at a time.

A turn is two requests, so that htmx can show the question at once and the answer as it streams:
``POST /chat/turns`` checks the form and keeps the turn (the question and its generation
parameters), and ``GET /chat/turns/<id>/events`` streams that answer as server-sent events, once
(a second connection, e.g. EventSource reconnecting, gets 204). The POSTs get no origin check of
their own: the web app's CSRF protection covers every form/htmx POST, these included.

Conversations are kept in the store per visitor (``chat.conversations``: listed in a side panel,
searched, renamed, deleted, reopened where they were), and the ones being talked in are held in
memory too: the first turn gives the browser a random visitor id in a signed cookie of its own, and
a visitor can read, continue, stream or stop only their own conversations and turns (someone
else's ids answer as if unknown). In memory each visitor holds at most
``conversations_per_visitor`` conversations (the least recently used idle one is let go first: it
is still in the store) and the page at most ``max_visitors`` visitors; an answer being written is
never let go, so when all are busy a new one is refused with 429. Without a store (or with
``chat_keep_conversations`` off) conversations live in memory only, and the page says so.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterator, Optional

from flask import Blueprint, Response, g, render_template, request, session, stream_with_context
from markupsafe import Markup

from chat.engine import (
    Busy,
    ChatEngine,
    ChatError,
    Delta,
    Finished,
    FollowUp,
    GenerationParams,
    InvalidRequest,
    ModelNotServed,
    Rendered,
)
from chat import markdown
from chat.conversations import VISITOR_COOKIE, ConversationStore
from chat.errors import check_fits_context
from chat.http.api_models import GenerateBody, Sampling
from chat.http import conversation_views
from chat.http.limits import ChatLimits
from chat.http.params import Params, client_address
from chat.http.responses import INTERNAL_ERROR, error_status, sse
from chat.streams import started_waiting

logger = logging.getLogger(__name__)

VISITOR_KEY = "chat_visitor"  # the visitor's id in the session cookie
PENDING_TIMEOUT = 60.0  # a turn whose stream never connected stops counting as active after this
RETRY_AFTER = 30  # seconds, when every visitor's place holds an answer being written


@dataclass
class _Turn:
    id: str
    conversation: "_Conversation"
    model: str
    input_ids: list[int]
    params: GenerationParams
    stop_event: threading.Event = field(default_factory=threading.Event)
    limit: int = 0  # the longest session the route accepts (the context the conversation may use)
    rendered: Optional[Rendered] = None  # its prompt as text (its session may be kept: ``chat.kept``)
    follow: Optional[FollowUp] = None  # the conversation's kept session it may continue
    state: str = "pending"  # pending -> running -> done
    created: float = field(default_factory=time.monotonic)

    def active(self, now: float) -> bool:
        """Being written, or waiting (not too long) for its stream."""
        return self.state == "running" or (self.state == "pending" and now - self.created <= PENDING_TIMEOUT)


@dataclass
class _Conversation:
    id: str
    visitor: str
    messages: list[dict] = field(default_factory=list)  # {role, content} (and an answer's meta)
    turn: Optional[_Turn] = None  # the answer being written, if any
    model: str = ""
    system: str = ""
    stored: bool = False  # the store has it
    session: Optional[str] = None  # the handle of its last answer's kept session (``chat.kept``): never sent out

    def active(self, now: float) -> bool:
        return self.turn is not None and self.turn.active(now)

    def chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)


@dataclass
class _Visitor:
    id: str
    conversations: "OrderedDict[str, _Conversation]" = field(default_factory=OrderedDict)  # least recent first

    def active(self, now: float) -> bool:
        return any(c.active(now) for c in self.conversations.values())


class _Conversations:
    """The chat page's conversations, in memory, per visitor; bounded per visitor and in all."""

    def __init__(self, per_visitor: int, max_visitors: int, kept: Optional[ConversationStore] = None):
        self._visitors: OrderedDict[str, _Visitor] = OrderedDict()  # least recently active first
        self._turns: dict[str, _Turn] = {}
        self._per_visitor, self._max_visitors = per_visitor, max_visitors
        self.kept = kept if kept is not None and kept.limits.keep else None  # the store's, if any
        self._lock = threading.Lock()

    def get_or_create(self, visitor_id: str, conversation_id: Optional[str]) -> _Conversation:
        """The visitor's conversation ``conversation_id`` (from memory, else from the store), or a
        new one (for an id that is not theirs too). Raises Busy when no idle conversation or visitor
        can make room."""
        now = time.monotonic()
        with self._lock:
            visitor = self._visitors.get(visitor_id)
            found = visitor.conversations.get(conversation_id or "") if visitor is not None else None
        row = self.kept.get(visitor_id, conversation_id) if found is None and self.kept is not None else None
        with self._lock:
            visitor = self._visitors.get(visitor_id)
            if visitor is None:
                self._make_room_for_a_visitor(now)
                visitor = self._visitors[visitor_id] = _Visitor(visitor_id)
            self._visitors.move_to_end(visitor_id)
            conversation = visitor.conversations.get(conversation_id or "")
            if conversation is None:
                self._make_room_in(visitor, now)
                if row is not None:
                    conversation = _Conversation(row["id"], visitor_id, list(row["messages"] or []), model=row["model"],
                                                 system=row["system"], stored=True)
                else:
                    conversation = _Conversation(secrets.token_urlsafe(12), visitor_id)
                visitor.conversations[conversation.id] = conversation
            visitor.conversations.move_to_end(conversation.id)
            return conversation

    def forget(self, visitor_id: str, conversation_id: Optional[str] = None) -> None:
        """Let go of the visitor's conversation (None: all of them) in memory, after a delete."""
        with self._lock:
            visitor = self._visitors.get(visitor_id)
            for conversation in list(visitor.conversations.values()) if visitor is not None else ():
                if conversation_id is None or conversation.id == conversation_id:
                    self._drop_turn(conversation)
                    del visitor.conversations[conversation.id]

    def _make_room_for_a_visitor(self, now: float) -> None:
        if len(self._visitors) < self._max_visitors:
            return
        idle = next((v for v in self._visitors.values() if not v.active(now)), None)
        if idle is None:
            raise Busy(f"the chat page is writing answers for {len(self._visitors)} visitors, the most it serves at "
                       f"once; retry in {RETRY_AFTER} s", RETRY_AFTER)
        for conversation in idle.conversations.values():
            self._drop_turn(conversation)
        del self._visitors[idle.id]

    def _make_room_in(self, visitor: _Visitor, now: float) -> None:
        if len(visitor.conversations) < self._per_visitor:
            return
        idle = next((c for c in visitor.conversations.values() if not c.active(now)), None)
        if idle is None:
            raise Busy(f"you have {len(visitor.conversations)} conversations waiting for answers, the most one "
                       f"visitor may have; wait for an answer to finish (or stop one)", 10)
        self._drop_turn(idle)
        del visitor.conversations[idle.id]

    def _drop_turn(self, conversation: _Conversation) -> None:
        if conversation.turn is not None:
            self._turns.pop(conversation.turn.id, None)

    def start_turn(self, conversation: _Conversation, message: dict, turn: _Turn, *, keep: Optional[int] = None) -> None:
        """The turn starts: the conversation keeps its first ``keep`` messages (a regenerated or
        edited turn replaces the ones after), then the question."""
        with self._lock:
            busy = conversation.turn
            # (a turn whose stream never came — its page lost the connection — gives way to the next)
            if busy is not None and busy.state == "running":
                raise InvalidRequest("message", "the previous answer is still being written; wait for it or stop it")
            if busy is not None:
                self._turns.pop(busy.id, None)
            if keep is not None:
                del conversation.messages[keep:]
            conversation.messages.append(message)
            conversation.turn = turn
            self._turns[turn.id] = turn

    def _own(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        turn = self._turns.get(turn_id)
        if turn is None or visitor_id is None or turn.conversation.visitor != visitor_id:
            return None
        return turn

    def claim(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        """The visitor's turn, if it is waiting for its stream (a second connection gets None)."""
        with self._lock:
            turn = self._own(visitor_id, turn_id)
            if turn is None or turn.state != "pending":
                return None
            turn.state = "running"
            if visitor_id in self._visitors:
                self._visitors.move_to_end(visitor_id)
            return turn

    def turn(self, visitor_id: Optional[str], turn_id: str) -> Optional[_Turn]:
        with self._lock:
            return self._own(visitor_id, turn_id)

    def finish(self, turn: _Turn, answer: Optional[str], meta: Optional[dict] = None) -> None:
        """The turn is over: its answer joins the conversation (which the store then keeps), or,
        with no answer, its question leaves it (it may be asked again)."""
        with self._lock:
            turn.state = "done"
            self._turns.pop(turn.id, None)
            conversation = turn.conversation
            if conversation.turn is turn:
                conversation.turn = None
            if answer is not None:
                conversation.messages.append({"role": "assistant", "content": answer, **({"meta": meta} if meta else {})})
            elif conversation.messages and conversation.messages[-1]["role"] == "user":
                conversation.messages.pop()  # no answer: the question may be asked again
            messages = list(conversation.messages)
        if answer is not None and self.kept is not None:
            try:
                self.kept.save(conversation.visitor, conversation.id, model=conversation.model,
                               system=conversation.system, messages=messages)
                conversation.stored = True
            except Exception:  # noqa: BLE001 - the answer was shown; the store's trouble is logged
                logger.warning("saving a chat conversation failed", exc_info=True)


def _visitor_id(kept: Optional[ConversationStore], *, create: bool) -> Optional[str]:
    """This browser's visitor id, made on its first turn: from the chat's own signed cookie when
    conversations are stored (``ConversationStore``: new visitors per address bounded), else from
    the signed session cookie."""
    if kept is None:
        visitor = session.get(VISITOR_KEY)
        if not isinstance(visitor, str) and create:
            visitor = session[VISITOR_KEY] = secrets.token_urlsafe(18)
        return visitor if isinstance(visitor, str) else None
    visitor = getattr(g, "chat_visitor", None) or kept.visitor_of(request.cookies.get(VISITOR_COOKIE))
    if visitor is None and create:
        visitor, g.chat_visitor_cookie = kept.new_visitor(client_address())
    g.chat_visitor = visitor
    return visitor


def _generation_params(engine: ChatEngine, model: str, params: Params) -> GenerationParams:
    context = engine.models.context_length(model)
    defaults = engine.models.defaults(model)
    return GenerationParams(
        max_new_tokens=params.field(GenerateBody, "max_new_tokens", default=defaults["max_new_tokens"], hi=context),
        temperature=params.field(Sampling, "temperature", default=defaults["temperature"]),  # (OpenAI's bounds)
        **params.sampling(top_p=defaults["top_p"], top_k=defaults["top_k"],
                          repetition_penalty=defaults["repetition_penalty"]),
    )


def _error(error: ChatError) -> Response:
    """The error as a fragment htmx puts into the page's error box."""
    return error_fragment(str(error), *error_status(error))


def error_fragment(message: str, status: int, headers: Optional[dict] = None) -> Response:
    response = Response(render_template("chat/_error.html", message=message), status=status)
    response.headers.update(headers or {})
    response.headers["HX-Retarget"] = "#chat-error"
    response.headers["HX-Reswap"] = "innerHTML"
    response.headers["X-Chat-Error"] = "1"
    return response


def _start_turn(engine: ChatEngine, conversations: _Conversations, limits: ChatLimits) -> str:
    """Check the page's form and keep the turn; the fragment that shows the question."""
    params = Params(request.form.to_dict(), form=True)
    model = engine.models.resolve(params.field(Sampling, "model"))
    regenerate = params.boolean("regenerate")
    edit = params.integer("edit", lo=0, hi=100_000) if (request.form.get("edit") or "").strip() else None
    message = "" if regenerate else params.string("message", required=True, max_chars=None)
    system = params.string("system", max_chars=None) or ""
    limits.check_prompt_chars("message", len(message))  # before anything is tokenized
    limits.check_prompt_chars("system", len(system), what="the system prompt")
    if not message.strip() and not regenerate:
        raise InvalidRequest("message", "message is empty; write something to send")
    generation = _generation_params(engine, model, params)
    status = engine.admission.status(model)
    if not status.served:
        raise ModelNotServed(model, status.reason, status.missing_blocks)
    conversation = conversations.get_or_create(_visitor_id(conversations.kept, create=True),
                                               params.string("conversation_id", max_chars=100))
    keep, message = rewind(list(conversation.messages), message, regenerate=regenerate, edit=edit)
    history = conversation.messages[:keep]
    if conversations.kept is not None:
        conversations.kept.check_room(conversation.visitor, conversation.id,
                                      sum(len(m["content"]) for m in history) + len(message), new=not conversation.stored)
    conversation.model, conversation.system = model, system
    limit = engine.admission.session_limit(model)
    fitted = fit_context(engine, model, system, history, message, limits=limits, limit=limit,
                         answer_tokens=generation.max_new_tokens)
    generation = dataclasses.replace(generation, stop_sequences=fitted.stops,
                                     max_new_tokens=min(generation.max_new_tokens, limit - len(fitted.input_ids)))
    follow = None
    if conversation.session is not None and keep == len(conversation.messages):  # (regenerate, edit: never)
        follow = engine.models.chat_follow_up(model, fitted.messages, conversation.session) or FollowUp(conversation.session)
    turn = _Turn(secrets.token_urlsafe(12), conversation, model, fitted.input_ids, generation, limit=limit,
                 rendered=Rendered(fitted.text), follow=follow)
    asked = {"role": "user", "content": message, "params": {
        "max_new_tokens": generation.max_new_tokens, "temperature": generation.temperature, "top_p": generation.top_p,
        "top_k": generation.top_k, "repetition_penalty": generation.repetition_penalty}}
    conversations.start_turn(conversation, asked, turn, keep=keep)
    return render_template("chat/_turn.html", turn=turn, message=message, conversation_id=conversation.id,
                           title=engine.models.title(model), max_prompt_chars=limits.max_prompt_chars,
                           left_out=fitted.left_out, limit=limit,
                           user_index=sum(1 for m in history if m["role"] == "user"))


def rewind(messages: list[dict], message: str, *, regenerate: bool, edit: Optional[int]) -> tuple[int, str]:
    """(how many of the conversation's messages the turn keeps, its question): all and the new
    message; to ``regenerate`` the last answer, those before its question, and that question again;
    to ``edit`` the ``edit``-th question (0-based), those before it, and the new message (the turns
    after it are replaced; ``edit`` one past the last question asks anew: how the page asks again a
    question that got no answer, wherever the conversation was left — a live worker dropped it, a
    worker that died never stored it)."""
    asked = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if regenerate:
        if not asked or messages[-1]["role"] != "assistant":
            raise InvalidRequest("regenerate", "there is no answer to regenerate in this conversation yet")
        return asked[-1], messages[asked[-1]]["content"]
    if edit is not None:
        if edit == len(asked):
            return len(messages), message
        if edit > len(asked):
            raise InvalidRequest("edit", f"this conversation has {len(asked)} questions; there is no question "
                                         f"{edit + 1} to edit")
        return asked[edit], message
    return len(messages), message


@dataclass(frozen=True)
class Fitted:
    """What the model is sent of a conversation: its token ids and stop sequences, and how many of
    the oldest messages were left out to fit."""

    input_ids: list[int]
    stops: tuple
    left_out: int
    text: str = ""  # the same, as text (``chat.models.Models.render_chat``)
    messages: tuple = ()  # the messages sent


def fit_context(engine: ChatEngine, model: str, system: str, messages: list[dict], message: str, *,
                limits: ChatLimits, limit: int, answer_tokens: int) -> Fitted:
    """The system prompt (always), the newest messages that fit and the new message, leaving room
    for the answer (its ``max_new_tokens``, at most half of ``limit``: the longest session the
    model's route accepts, ``Admission.session_limit``); the oldest messages are left out first, a
    question with its answer together. Only a message that does not fit alone is refused."""
    head = [{"role": "system", "content": system}] if system.strip() else []
    new = {"role": "user", "content": message}
    reserve = max(1, min(answer_tokens, limit // 2))
    kept = list(messages)
    # characters first (cheap, before anything is tokenized), then tokens
    while kept and sum(len(m["content"]) for m in kept) + len(system) + len(message) > limits.max_prompt_chars:
        kept = kept[2:] if len(kept) > 1 and kept[0]["role"] == "user" else kept[1:]
    limits.check_prompt_chars("message", len(system) + len(message), what="the system prompt with this message")
    while True:
        sent = head + [{"role": m["role"], "content": m["content"]} for m in kept] + [new]
        text, stops, special = engine.models.render_chat(model, sent)
        input_ids = engine.encode(model, text, add_special_tokens=special)
        if len(input_ids) + reserve <= limit or not kept:
            break
        kept = kept[2:] if len(kept) > 1 and kept[0]["role"] == "user" else kept[1:]
    check_fits_context("message", len(input_ids), limit, what="this message" + (" with the system prompt" if head else ""),
                       hint="shorten it")
    return Fitted(input_ids, tuple(stops), len(messages) - len(kept), text, tuple(sent))


def _answer_events(engine: ChatEngine, conversations: _Conversations, turn: _Turn, client: str) -> Iterator[str]:
    """The turn's answer as server-sent events: "status" (the steps before the first token, for
    people: the place in the queue and the expected wait, then finding servers, with what real
    requests of late got), "token" (plain text), "note" (why a token took long: a server replaced
    after a failure), "failed", "rendered" (the whole answer's Markdown as sanitised HTML), then one
    "done"."""
    answer_text, meta = None, None
    try:
        waiting = started_waiting(
            lambda on_wait: engine.answer(turn.model, turn.input_ids, turn.params, client=client,
                                          stop_event=turn.stop_event, prompt_param="message", api="page",
                                          on_wait=on_wait, rendered=turn.rendered, follow=turn.follow,
                                          owner=f"page:{turn.conversation.visitor}:{turn.conversation.id}"),
            lambda answer: answer.close(), name="page-start")
        answer = None
        for item in waiting:
            if item[0] == "queued":
                yield sse(f"Waiting for a generation slot: {_ordinal(item[1])} in line, about {item[2]:.0f} s", "status")
            else:
                answer = item[1]
        yield sse(_finding_servers(engine, turn, answer.continued), "status")
        failovers = 0
        with answer:
            for event in answer:
                session = answer.session
                if session is not None and session.failovers > failovers:  # why the last token took long
                    failovers = session.failovers
                    yield sse(f"A server of the route failed while answering; the answer went on through another "
                              f"one, the text so far replayed to it ({failovers} replaced so far).", "note")
                if isinstance(event, Delta) and event.text:
                    yield sse(event.text, "token")  # plain text: the page adds it as a text node
                elif isinstance(event, Finished):
                    answer_text = event.text
                    stats = event.stats()
                    meta = {"route": [hop.to_dict() for hop in event.route], "tokens_per_second":
                            stats["tokens_per_second"], "time_to_first_token": stats["time_to_first_token"],
                            "continued": answer.continued}
                    turn.conversation.session = answer.handle  # (server-side only: the visitor's conversation)
                    # kept before the page hears it is done: a reload right after shows it
                    conversations.finish(turn, answer_text, meta)
                    # the answer as Markdown, sanitised here (chat.markdown): it replaces the streamed text
                    yield sse(markdown.render(event.text), "rendered")
                    slow = stats["tokens_per_second"] is not None and stats["tokens_per_second"] < SLOW_TOKENS_PER_S
                    yield sse(render_template("chat/_done.html", finished=event, stats=stats, continued=answer.continued,
                                              used=event.prompt_tokens + event.completion_tokens, limit=turn.limit,
                                              model=turn.model, repository=engine.models.repository(turn.model),
                                              help=engine.admission.recommendation(turn.model) if slow else None),
                              "done")
    except ChatError as e:
        yield sse(str(e), "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    except Exception:  # noqa: BLE001 - never a traceback to the user
        logger.warning("chat turn failed", exc_info=True)
        yield sse(INTERNAL_ERROR, "failed")
        yield sse(render_template("chat/_done.html", finished=None, stats=None), "done")
    finally:
        if turn.state != "done":
            conversations.finish(turn, answer_text, meta)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _finding_servers(engine: ChatEngine, turn: _Turn, continued: bool = False) -> str:
    """The step after the slot: the servers the route will take (as the router would choose now),
    said with what real requests of late got (the forecast), if anything; ``continued``: the turn
    continues the conversation's kept session (``chat.kept``), on the servers that hold it."""
    forecast, route = engine.admission.forecast_route(turn.model, prompt_tokens=len(turn.input_ids),
                                            max_tokens=turn.params.max_new_tokens, continued=continued)
    if continued:
        said = "Continuing this conversation's session on its servers: only the new message goes through the swarm"
        if forecast.time_to_first_token is not None and forecast.source == "requests":
            said += f" (lately the first token came after about {forecast.time_to_first_token:.1f} s)"
        return said + "…"
    said = "Finding servers for the model's blocks and computing the first token"
    if route:
        said = ("Computing the first token through " + " → ".join(
            f"…{peer[-8:]} (blocks {start}:{end})" for peer, start, end in route[:8])
            + (f" and {len(route) - 8} more" if len(route) > 8 else ""))
    if forecast.time_to_first_token is not None and forecast.source == "requests":
        said += f" (lately the first token came after about {forecast.time_to_first_token:.1f} s)"
    return said + "…"


FORECAST_TOKENS = 256  # the page's forecast when the form does not say how many tokens
SLOW_TOKENS_PER_S = 5.0  # an answer slower than this says what would help (a server of the recommended blocks)


def shown_messages(messages: list[dict]) -> list[dict]:
    """A stored conversation's messages as the page shows them: questions as text, answers rendered."""
    return [{**m, "html": Markup(markdown.render(m["content"])) if m["role"] == "assistant" else None}
            for m in messages if m.get("role") in ("user", "assistant")]


def register(bp: Blueprint, engine: ChatEngine, limits: ChatLimits, kept: Optional[ConversationStore] = None) -> None:
    """Add the chat page's routes to the chat blueprint (templates/chat/*.html name them);
    ``kept``: where conversations are stored (``chat.conversations``), if anywhere."""
    conversations = _Conversations(limits.conversations_per_visitor, limits.max_visitors, kept)
    kept = conversations.kept

    @bp.after_request
    def visitor_cookie(response: Response) -> Response:
        cookie = getattr(g, "chat_visitor_cookie", None)
        if cookie and kept is not None:
            response.set_cookie(VISITOR_COOKIE, cookie, max_age=int(kept.limits.retention_days * 86400),
                                httponly=True, samesite="Lax", secure=request.is_secure, path="/")
        return response

    @bp.get("/chat")
    def page():
        statuses = engine.admission.statuses()
        served = [s for s in statuses if s.served]
        # a stored conversation reopened (``?c=``), if it is this visitor's
        visitor = _visitor_id(kept, create=False) if kept is not None else None
        stored = kept.get(visitor, request.args.get("c")) if kept is not None else None
        wanted = request.args.get("model") or (stored["model"] if stored else None)
        selected = next((s.name for s in served if s.name == wanted), served[0].name if served else None)
        defaults = engine.models.defaults(selected) if selected else {}
        # no conversation yet: the first turn makes one (a page view keeps nothing in memory)
        return render_template("chat/page.html", statuses=statuses, selected=selected, defaults=defaults,
                               context=engine.models.context_length(selected) if selected else None,
                               conversation_id=stored["id"] if stored else "", max_prompt_chars=limits.max_prompt_chars,
                               stored=stored, messages=shown_messages(stored["messages"] or []) if stored else [],
                               kept=kept.limits if kept is not None else None, title=engine.models.title(selected) if selected else "")

    @bp.get("/chat/params")
    def params_partial():
        try:
            model = engine.models.resolve(request.args.get("model", ""))
            return render_template("chat/_params.html", defaults=engine.models.defaults(model),
                                   context=engine.models.context_length(model))
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/forecast")
    def forecast_partial():
        """What a turn would get if sent now (``Admission.forecast``), refreshed by the page."""
        try:
            model = engine.models.resolve(request.args.get("model", ""))
            tokens = request.args.get("max_new_tokens", "")
            max_tokens = int(tokens) if tokens.isdigit() and 0 < int(tokens) <= 1 << 16 else FORECAST_TOKENS
            return render_template("chat/_forecast.html", forecast=engine.admission.forecast(model, prompt_tokens=0,
                                                                                  max_tokens=max_tokens),
                                   max_tokens=max_tokens)
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/client-side")
    def client_side_partial():
        """The model's client side in the chat's process (``Models.client_side_info``): the model
        page and the chat page show whether the chat host or the swarm sets the speed."""
        try:
            model = engine.models.resolve(request.args.get("model", ""))
        except ChatError:
            return Response(status=204)  # a model this chat does not serve: nothing to show
        side = engine.models.client_side_info(model)
        status = engine.admission.status(model) if side is None else None
        return render_template("chat/_client_side.html", side=side, served=status is None or status.served,
                               reason=status.reason if status is not None else "")

    @bp.post("/chat/turns")
    def post_turn():
        try:
            return _start_turn(engine, conversations, limits)
        except ChatError as e:
            return _error(e)

    @bp.get("/chat/turns/<turn_id>/events")
    def turn_events(turn_id):
        turn = conversations.claim(_visitor_id(kept, create=False), turn_id)
        if turn is None:
            return Response(status=204)  # finished, unknown or not yours: tells EventSource not to reconnect
        return Response(stream_with_context(_answer_events(engine, conversations, turn, client_address())),
                        mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @bp.post("/chat/turns/<turn_id>/stop")
    def stop_turn(turn_id):
        turn = conversations.turn(_visitor_id(kept, create=False), turn_id)
        if turn is None:
            return Response("this answer is finished, or is not yours to stop", status=404, mimetype="text/plain")
        turn.stop_event.set()
        return '<span class="chat-stopping">stopping…</span>'

    if kept is not None:
        conversation_views.register(bp, kept, conversations.forget,
                                    lambda create=False: _visitor_id(kept, create=create))
