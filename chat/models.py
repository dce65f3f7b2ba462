"""The chat's models: what is configured, their client files (tokenizer, context length, the chat
page's defaults) and each one's client side in this process (``chat.client_side``: the petals model
and its head steps, in the configured precision and device), all loaded on first use; and how a
prompt or a conversation becomes token ids. ``Models`` holds them; nothing here admits, queues or
routes a request (``chat.admission``, ``chat.capacity``, ``chat.sequence``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from chat import client_side
from chat.client_side import ClientSide, ClientSideSettings
from chat.errors import InvalidRequest, ModelNotServed, UnknownModel
from chat.kept import FollowUp
from chat.remote_model import sequence_manager_of

logger = logging.getLogger(__name__)

DEFAULT_CONTEXT = 2048  # for configs that name no context length (e.g. BLOOM's ALiBi)


@dataclass
class Model:
    """A configured model; its client files and its client side load on first use."""

    name: str
    title: str
    path: Optional[Path]
    aliases: tuple[str, ...]
    lock: threading.Lock = field(default_factory=threading.Lock)
    tokenizer: Any = None
    context_length: int = DEFAULT_CONTEXT
    defaults: dict = field(default_factory=dict)
    client: Optional[ClientSide] = None  # the loaded client side: the petals model and its head steps

    @property
    def remote(self) -> Any:
        """The petals model, once loaded."""
        return self.client.remote if self.client is not None else None


_ANSWER_MARK = "\ue000answer\ue001"  # private-use characters: what a template renders where the answer goes


def _system_folded(messages: list[dict]) -> Optional[list[dict]]:
    """The conversation with its system messages' text put before the first user turn's, for chat
    templates that accept no system role; None if it has no system message or no user turn."""
    system = [m["content"] for m in messages if m["role"] == "system"]
    rest = [dict(m) for m in messages if m["role"] != "system"]
    first_user = next((m for m in rest if m["role"] == "user"), None)
    if not system or first_user is None:
        return None
    first_user["content"] = "\n\n".join(system + [first_user["content"]])
    return rest


def _context_length(config: Any) -> int:
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return DEFAULT_CONTEXT


def _defaults(path: Path, context: int) -> dict:
    """The chat page's starting parameters: the model's generation_config.json where it has one."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(str(path))
    except (OSError, ValueError):
        config = GenerationConfig()
    max_new = config.max_new_tokens or 128
    return {
        "temperature": float(config.temperature) if config.do_sample and config.temperature else 0.0,
        "top_p": float(config.top_p if config.top_p is not None else 1.0),
        "top_k": int(config.top_k or 0),
        "repetition_penalty": float(config.repetition_penalty or 1.0),
        "max_new_tokens": max(1, min(int(max_new), context // 2)),
    }


class Models:
    """The configured models (``monitor.settings.ModelConfig``-like: dht_prefix, path, name,
    repository), by name or alias. ``build(model, torch_dtype)`` makes a model's petals model
    (``chat.remote_model.load_remote_model`` on the process's DHT, with the chat's sequence
    manager); ``observe(name)`` is where its head steps' seconds and rows go. Thread-safe."""

    def __init__(self, configs: Sequence[Any], *, client_side_settings: ClientSideSettings,
                 build: Callable[[Model, Any], Any], observe: Callable[[str], Callable[[float, int], None]]):
        self.client_side_settings = client_side_settings
        self._build, self._observe = build, observe
        self._models: dict[str, Model] = {}
        for config in configs:
            name = config.dht_prefix
            aliases = tuple(a for a in (getattr(config, "repository", None), getattr(config, "name", None)) if a)
            path = getattr(config, "path", None)
            self._models[name] = Model(name=name, title=getattr(config, "name", None) or name,
                                       path=Path(path) if path else None, aliases=aliases)

    def __iter__(self):
        return iter(self._models.values())

    @property
    def names(self) -> list[str]:
        return list(self._models)

    def resolve(self, name: Optional[str]) -> str:
        """The dht_prefix of the model called ``name`` (dht_prefix, repository or human name)."""
        if name in self._models:
            return name
        for model in self._models.values():
            if name in model.aliases:
                return model.name
        raise UnknownModel(str(name), list(self._models))

    def get(self, name: str) -> Model:
        return self._models[self.resolve(name)]

    def loaded(self, name: str) -> Model:
        """The model called ``name`` with its client files (tokenizer, context length, defaults) loaded."""
        return self._client_files(self.get(name))

    def _client_files(self, model: Model) -> Model:
        if model.tokenizer is None:
            if model.path is None:
                raise ModelNotServed(model.name, "no local checkpoint is configured for it (set the model's path)")
            from transformers import AutoConfig

            from monitor import families

            families.install()
            with model.lock:
                if model.tokenizer is None:
                    config = AutoConfig.from_pretrained(str(model.path))
                    model.context_length = _context_length(config)
                    model.defaults = _defaults(model.path, model.context_length)
                    model.tokenizer = families.load_tokenizer(model.path)
        return model

    def tokenizer(self, name: str) -> Any:
        return self._client_files(self.get(name)).tokenizer

    def context_length(self, name: str) -> int:
        return self._client_files(self.get(name)).context_length

    def defaults(self, name: str) -> dict:
        return dict(self._client_files(self.get(name)).defaults)

    def title(self, name: str) -> str:
        return self.get(name).title

    def repository(self, name: str) -> str:
        """What petals' own tools call the model (its repository, e.g. ``org/model``), else its prefix."""
        model = self.get(name)
        found = next((alias for alias in model.aliases if "/" in alias), None)
        return found.removeprefix("https://huggingface.co/").strip("/") if found else model.name

    def remote(self, model: Model) -> Any:
        """The model's petals model (its client side loads on first use)."""
        return self.client_side(model).remote

    def client_side(self, model: Model) -> ClientSide:
        """The model's client side, loaded on first use in the configured precision and on the
        configured device (``chat.client_side``); ``ClientSideTooLarge`` when it does not fit the
        memory free now (the other models load as usual)."""
        self._client_files(model)
        if model.client is None:
            with model.lock:
                if model.client is None:
                    model.client = client_side.load(model.name, model.path, self.client_side_settings,
                                                    lambda dtype: self._build(model, dtype),
                                                    observe=self._observe(model.name))
        return model.client

    def client_side_info(self, name: str) -> Optional[dict]:
        """The model's client side as ``GET /v1/models`` shows it (precision, device, memory, the
        chat's own milliseconds per token), or None before it is loaded."""
        model = self.get(name)
        return model.client.info() if model.client is not None else None

    def sequence_manager(self, name: str) -> Any:
        """The model's sequence manager (loads the model): its view of the swarm and its routes."""
        return sequence_manager_of(self.remote(self.get(name)))

    # -- prompts ---------------------------------------------------------------------------------
    def encode(self, name: str, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer(name)(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_chat(self, name: str, messages: Sequence[Mapping[str, str]]) -> tuple[list[int], tuple[str, ...]]:
        """Token ids of a conversation, ready for the assistant's turn, and the stop sequences it
        needs (``render_chat``)."""
        text, stops, special = self.render_chat(name, messages)
        return self.encode(name, text, add_special_tokens=special), stops

    def render_chat(self, name: str, messages: Sequence[Mapping[str, str]]) -> tuple[str, tuple[str, ...], bool]:
        """A conversation as text, ready for the assistant's turn: (its text, the stop sequences it
        needs, whether its tokens begin with the tokenizer's special ones). The tokenizer's chat
        template when it has one (tokenised as transformers' ``apply_chat_template`` does), else a
        plain "Role: text" transcript that stops where the model starts to write the user's next turn."""
        tokenizer = self.tokenizer(name)
        messages = [{"role": m["role"], "content": m["content"]} for m in messages]
        if getattr(tokenizer, "chat_template", None):
            from jinja2 import TemplateError

            try:
                return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), (), False
            except TemplateError as e:  # the model's own template refuses (e.g. "roles must alternate")
                folded = _system_folded(messages)
                if folded is not None:  # (Mixtral's template knows no system role: as Mistral's newer ones do,
                    try:                # its text goes before the first user turn's)
                        return tokenizer.apply_chat_template(folded, add_generation_prompt=True, tokenize=False), (), False
                    except TemplateError:
                        pass
                raise InvalidRequest("messages", f"the model's chat template rejected the messages: "
                                                 f"{str(e)[:300]}") from None
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return text, ("\nUser:", "\nSystem:"), True

    def chat_follow_up(self, name: str, messages: Sequence[Mapping[str, str]], handle: str) -> Optional[FollowUp]:
        """A conversation as a follow-up of the answer ``handle`` names (``chat.kept``): its rendering
        cut around its last assistant message — the text before it, the message, the text after it —
        or None when it has no assistant message or the rendering does not hold it once, verbatim."""
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None:
            return None
        marked = [dict(m) for m in messages]
        marked[last]["content"] = _ANSWER_MARK
        try:
            text = self.render_chat(name, marked)[0]
        except InvalidRequest:
            return None
        if text.count(_ANSWER_MARK) != 1:
            return None
        before, after = text.split(_ANSWER_MARK)
        return FollowUp(handle, before=before, answer=messages[last]["content"], after=after)

    def decode_all(self, name: str, ids: Sequence[int]) -> str:
        """Token ids as text, special tokens and spaces as they are (what a session holds, as text)."""
        return self.tokenizer(name).decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def close(self) -> None:
        """Stop the loaded models' head steps and background routing threads."""
        for model in self._models.values():
            if model.client is not None:
                model.client.heads.close()
                try:
                    sequence_manager_of(model.remote).shutdown()
                except Exception as e:  # noqa: BLE001 - shutting down anyway
                    logger.debug("shutting down %s failed: %r", model.name, e)
