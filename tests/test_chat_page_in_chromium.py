"""Spec: the chat page's conversations in Chromium on the session swarm: a reload and a restart of
the service between two turns keep the conversation, and a second browser sees none of it;
regenerate, edit, export and import on a phone-sized page; while an answer is written, hostile
Markdown stays inert in the DOM and in what is copied. The conversations themselves, without a
browser or a swarm: ``test_chat_conversations.py``.
"""

from __future__ import annotations

import pytest

from chat.conversations import ConversationLimits, ConversationStore


@pytest.fixture(scope="module")
def chat_service(swarm, tiny_model, tmp_path_factory):
    """``start()``: the dashboard with the chat over the session swarm and a store on disk, each call
    a new app, engine and ``ConversationStore`` (a restart of the service) over the same database."""
    from chat.engine import ChatEngine
    from chat.http import create_blueprint
    from monitor.harness.tiny_model import TINY_DHT_PREFIX
    from monitor.settings import ModelConfig, Settings
    from monitor.store import Store
    from monitor.web import create_app
    from support import serve

    data_dir = tmp_path_factory.mktemp("kept-conversations")
    running = []

    def start(admin_token: str):
        store = Store(f"sqlite:///{data_dir / 'monitor.db'}")
        store.migrate()
        engine = ChatEngine(swarm.dht, [ModelConfig(dht_prefix=TINY_DHT_PREFIX, path=tiny_model, name="Tiny Llama")])
        settings = Settings(data_dir=data_dir, chat_rate_limit="1000 per minute", admin_token=admin_token)
        app = create_app(settings, store, chat_blueprints=[create_blueprint(engine, conversations=ConversationStore(
            store, ConversationLimits.from_settings(settings)))])
        server = serve(app)
        url = server.__enter__()
        running.append((server, engine, store))
        return url

    def stop():
        server, engine, store = running.pop()
        server.__exit__(None, None, None)
        engine.close()
        store.close()

    yield start, stop, lambda: running[-1][1]
    while running:
        stop()


WIDER = """() => Array.from(document.querySelectorAll('.chat-panel, .chat-panel > *, .chat-form > *, .chat-conversation > *, .chat-assistant > *, .chat-meta > *'))
  .map(e => e.tagName + '.' + e.className + ' w=' + Math.round(e.getBoundingClientRect().width) + ' sw=' + e.scrollWidth
       + ' cols=' + getComputedStyle(e).gridTemplateColumns).slice(0, 40).join(' | ')"""


def ask(page, text: str, expect) -> None:
    answered = page.locator(".chat-assistant .chat-stats").count()
    page.fill("#message", text)
    page.locator("#message").press("Enter")
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(answered + 1, timeout=60_000)
    expect(page.locator(".chat-assistant .chat-stats").last).to_contain_text("token")


def test_a_conversation_outlives_a_reload_and_a_restart_and_no_other_visitor_sees_it(chat_service, browser,
                                                                                     artifacts_dir):
    from playwright.sync_api import expect

    start, stop, _ = chat_service
    url = start("a" * 32)
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(f"{url}/chat")
    expect(page.locator("#chat-list")).to_contain_text("No conversations yet")
    expect(page.locator(".chat-history")).to_contain_text("kept on this server for 30 days")
    page.locator("summary", has_text="System prompt").click()
    page.fill('input[name="max_new_tokens"]', "6")
    ask(page, "Where do the **blocks** live?", expect)
    expect(page.locator("#chat-list li")).to_have_count(1)
    expect(page.locator("#chat-list li > a")).to_have_text("Where do the **blocks** live?")
    assert "?c=" in page.url  # a reload reopens it
    conversation = page.url.split("?c=")[1]
    page.reload()
    expect(page.locator(".chat-user .chat-text")).to_have_text(["Where do the **blocks** live?"])
    expect(page.locator(".chat-assistant .chat-rendered")).to_have_count(1)

    stop()  # a restart of the service, with another operator token
    url = start("b" * 32)
    page.goto(f"{url}/chat?c={conversation}")
    expect(page.locator(".chat-user .chat-text")).to_have_count(1)
    page.locator("summary", has_text="System prompt").click()
    page.fill('input[name="max_new_tokens"]', "6")
    ask(page, "And the servers?", expect)
    expect(page.locator(".chat-user .chat-text")).to_have_text(["Where do the **blocks** live?", "And the servers?"])
    page.reload()
    expect(page.locator(".chat-user")).to_have_count(2)
    expect(page.locator(".chat-assistant")).to_have_count(2)
    expect(page.locator("#chat-list li")).to_have_count(1)  # the same conversation, continued
    page.screenshot(path=str(artifacts_dir / "chat-kept-conversation.png"), full_page=True)

    # search, rename (a hostile, huge title is refused and changes nothing), delete
    page.fill("#chat-search", "servers")
    expect(page.locator("#chat-list li")).to_have_count(1)
    page.fill("#chat-search", "nothing like it")
    expect(page.locator("#chat-list")).to_contain_text("No conversation of yours holds")
    page.fill("#chat-search", "")
    expect(page.locator("#chat-list li")).to_have_count(1)

    other = browser.new_context().new_page()  # another visitor
    other.goto(f"{url}/chat?c={conversation}")
    expect(other.locator("#chat-list")).to_contain_text("No conversations yet")
    expect(other.locator(".chat-user")).to_have_count(0)
    other.fill("#chat-search", "blocks")
    expect(other.locator("#chat-list")).to_contain_text("No conversation of yours holds")
    other.context.close()

    page.locator("#chat-list summary").first.click()
    page.locator('#chat-list input[name="title"]').fill("<script>alert(1)</script> Blocks")
    page.locator("#chat-list button", has_text="Rename").click()
    expect(page.locator("#chat-list li > a")).to_have_text("<script>alert(1)</script> Blocks")
    page.locator("#chat-list summary").first.click()
    page.locator('#chat-list input[name="title"]').evaluate("(input, v) => { input.removeAttribute('maxlength'); "
                                                             "input.value = v; }", "x" * 5000)
    page.locator("#chat-list button", has_text="Rename").click()
    expect(page.locator("#chat-list")).to_contain_text("at most 120")
    expect(page.locator("#chat-list li > a")).to_have_text("<script>alert(1)</script> Blocks")
    page.locator("#chat-list summary").first.click()
    page.locator("#chat-list button.chat-delete", has_text="Delete").first.click()
    expect(page.locator("#chat-list")).to_contain_text("No conversations yet")
    page.goto(f"{url}/chat?c={conversation}")
    expect(page.locator(".chat-user")).to_have_count(0)
    context.close()


def test_regenerate_edit_export_import_on_a_phone(chat_service, browser, artifacts_dir):
    """At 375 px: nothing wider than the screen; regenerate the last answer; edit the first question
    and resend (the turns after it replaced, in the page and in the store); export as JSON and import
    it to go on; a malformed import is refused with a message and changes nothing."""
    from playwright.sync_api import expect

    start, stop, _ = chat_service
    url = start("c" * 32)
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    page = context.new_page()
    page.goto(f"{url}/chat")
    wide = "() => document.documentElement.scrollWidth"
    assert page.evaluate(wide) <= 375
    page.locator("summary", has_text="System prompt").click()
    page.fill('input[name="max_new_tokens"]', "6")
    ask(page, "First question", expect)
    ask(page, "Second question", expect)
    assert page.evaluate(wide) <= 375, page.evaluate(WIDER)
    expect(page.locator(".chat-context").last).to_contain_text("of 512 tokens")  # the context used, as it grows
    page.screenshot(path=str(artifacts_dir / "chat-phone.png"), full_page=True)

    page.locator("button.chat-regenerate").click()  # the last answer again (temperature as set)
    expect(page.locator(".chat-user .chat-text")).to_have_text(["First question", "Second question"])
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(2, timeout=60_000)
    expect(page.locator("button.chat-regenerate")).to_have_count(1)

    page.locator(".chat-user button.chat-edit").first.click()
    expect(page.locator("#message")).to_have_value("First question")
    expect(page.locator("#chat-editing")).to_contain_text("Editing question 1")
    page.fill("#message", "The first question, edited")
    page.locator("#message").press("Enter")
    expect(page.locator(".chat-user .chat-text")).to_have_text(["The first question, edited"])
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(1, timeout=60_000)
    page.reload()
    expect(page.locator(".chat-user .chat-text")).to_have_text(["The first question, edited"])
    conversation = page.url.split("?c=")[1]

    exported = page.request.get(f"{url}/chat/conversations/{conversation}/export.json")
    assert exported.ok and exported.json()["messages"][0] == {"role": "user", "content": "The first question, edited"}
    assert exported.json()["parameters"]["max_new_tokens"] == 6  # with the parameters
    assert "petals" in exported.json()["messages"][1]  # the answer's route and speed
    markdown = page.request.get(f"{url}/chat/conversations/{conversation}/export.md").text()
    assert "## You\n\nThe first question, edited" in markdown

    page.set_input_files("#chat-import-file", files=[{"name": "bad.json", "mimeType": "application/json",
                                                      "buffer": b'{"messages": "nope"}'}])
    page.locator(".chat-import button").click()
    expect(page.locator("#chat-list")).to_contain_text("not imported: the file has no list of messages")
    expect(page.locator("#chat-list li")).to_have_count(1)
    page.set_input_files("#chat-import-file", files=[{"name": "c.json", "mimeType": "application/json",
                                                      "buffer": exported.body()}])
    page.locator(".chat-import button").click()
    page.wait_for_url(lambda u: "?c=" in u and conversation not in u)
    expect(page.locator(".chat-user .chat-text")).to_have_text(["The first question, edited"])
    ask(page, "Going on after the import", expect)
    expect(page.locator(".chat-user")).to_have_count(2)
    expect(page.locator("#chat-list li")).to_have_count(2)
    assert page.evaluate(wide) <= 375
    context.close()
    stop()


HOSTILE_ANSWER = """Here is **bold**, a [safe link](https://example.org/x), and some traps:
<script>window.pwned = 1</script> <img src=x onerror="window.pwned = 2"> [bad](javascript:window.pwned=3)
![pixel](https://tracker.example/p.png) <a href="javascript:window.pwned=4">raw</a>

| a | b |
|---|--:|
| 1 | 2 |

```python
print("<b>not bold</b>")
```
"""


def test_while_waiting_hostile_markdown_in_the_dom_and_copy(chat_service, browser):
    """The steps before the first token (the place in the queue while every slot is held, then
    finding servers); an answer's hostile Markdown/HTML (brought in by an import) rendered with
    nothing run or loaded and links only http(s); Copy puts a code block and an answer on the
    clipboard."""
    import json

    from playwright.sync_api import expect

    start, stop, engine_now = chat_service
    url = start("d" * 32)
    engine = engine_now()
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=url)
    page = context.new_page()
    page.goto(f"{url}/chat")
    held = [engine.slots.acquire(None) for _ in range(engine.capacity.slots)]  # every slot busy
    try:
        page.locator("summary", has_text="System prompt").click()
        page.fill('input[name="max_new_tokens"]', "6")
        page.fill("#message", "Are you there?")
        page.locator("#message").press("Enter")
        status = page.locator(".chat-assistant .chat-status")
        expect(status).to_contain_text("Waiting for a generation slot: 1st in line", timeout=30_000)
    finally:
        for slot in held:
            slot.release()
    expect(page.locator(".chat-assistant .chat-stats")).to_have_count(1, timeout=60_000)
    expect(page.locator(".chat-assistant .chat-status")).to_have_count(0)  # gone with the first token

    conversation = {"title": "Hostile", "model": "tiny-llama", "messages": [
        {"role": "user", "content": "Show me <script>window.pwned = 5</script>"},
        {"role": "assistant", "content": HOSTILE_ANSWER}]}
    page.set_input_files("#chat-import-file", files=[{"name": "h.json", "mimeType": "application/json",
                                                      "buffer": json.dumps(conversation).encode()}])
    page.locator(".chat-import button").click()
    page.wait_for_url(lambda u: "?c=" in u)
    answer = page.locator(".chat-assistant .chat-rendered")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("table td.align-right")).to_have_text("2")
    expect(answer.locator(".code-block .code-lang")).to_have_text("python")
    expect(answer.locator("pre code")).to_contain_text('print("<b>not bold</b>")')
    assert page.locator(".chat-conversation script, .chat-conversation img, .chat-conversation iframe").count() == 0
    assert page.evaluate("() => window.pwned") is None
    hrefs = answer.locator("a").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert hrefs and all(h.startswith("https://") for h in hrefs), hrefs
    expect(page.locator(".chat-user .chat-text")).to_have_text("Show me <script>window.pwned = 5</script>")

    answer.locator("button.code-copy").click()
    expect(answer.locator("button.code-copy")).to_have_text("Copied")
    assert page.evaluate("() => navigator.clipboard.readText()") == 'print("<b>not bold</b>")\n'
    page.locator(".chat-assistant button.chat-copy").click()
    assert page.evaluate("() => navigator.clipboard.readText()") == HOSTILE_ANSWER
    page.locator("#message").press("Control+Shift+O")  # a new conversation
    page.wait_for_url(lambda u: u.endswith("/chat"))
    expect(page.locator(".chat-turn")).to_have_count(0)
    expect(page.locator("#chat-list li")).to_have_count(2)  # the others are still in the list
    context.close()
    stop()
