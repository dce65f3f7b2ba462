"""Spec: an answer's Markdown rendered for the chat page (``chat/markdown.py``) — paragraphs, lists,
emphasis, tables and code blocks with their language and a copy button — and nothing a model or a
user writes can run script, load anything or link anywhere but http(s)."""

from __future__ import annotations

import re
import time
from html.parser import HTMLParser

import pytest

from chat.markdown import ATTRIBUTES, MAX_CHARS, TAGS, render


class Elements(HTMLParser):
    """Every element and attribute of a fragment, as a browser's parser would see them."""

    def __init__(self, fragment: str):
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.feed(fragment)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.found.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def test_markdown_is_rendered_as_people_expect_of_a_chat_app():
    html = render("# Title\n\nSome *emphasis*, **strong**, ~~gone~~ and `code`.\n\n- one\n- two\n\n1. first\n2. second\n\n"
                  "| name | n |\n|------|--:|\n| a | 1 |\n\n> quoted\n\n```python\ndef f(x):\n    return x < 1\n```\n\n"
                  "[a link](https://example.org/page)")
    tags = [tag for tag, _ in Elements(html).found]
    for tag in ("h1", "em", "strong", "s", "code", "ul", "ol", "li", "table", "th", "td", "blockquote", "pre", "a"):
        assert tag in tags, (tag, html)
    assert '<td class="align-right">1</td>' in html  # alignment as a class: no inline style gets through
    block = re.search(r'<div class="code-block">.*?</div></div>|<div class="code-block">.*?</pre></div>', html, re.S).group(0)
    assert '<span class="code-lang">python</span>' in block and 'class="code-copy"' in block
    assert "return x &lt; 1" in block and 'class="language-python"' in block
    assert '<a href="https://example.org/page" rel="noopener noreferrer nofollow">a link</a>' in html


HOSTILE = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<svg onload=alert(1)><circle r=1></svg>",
    '<a href="javascript:alert(1)">click</a>',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "[click](vbscript:msgbox(1))",
    "[click](//evil.example/x)",
    "![x](javascript:alert(1))",
    "![x](https://tracker.example/pixel.png)",
    '<iframe src="https://evil.example"></iframe>',
    "<style>body{display:none}</style>",
    '<div style="background:url(https://evil.example)">x</div>',
    "<form action=https://evil.example><input name=a></form>",
    "```\"><script>alert(1)</script>\nx\n```",
    "```js onmouseover=alert(1)\nx\n```",
    "<details open ontoggle=alert(1)>",
    "[a](https://ok.example \"\\\" onmouseover=\\\"alert(1)\")",
    "<!-- <script>alert(1)</script> -->",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
]


@pytest.mark.parametrize("text", HOSTILE)
def test_nothing_from_the_model_can_run_load_or_link_but_http(text):
    html = render(text)
    parsed = Elements(html)
    for tag, attrs in parsed.found:
        assert tag in TAGS, (tag, html)
        allowed = ATTRIBUTES.get(tag, set()) | ({"rel"} if tag == "a" else set())
        assert set(attrs) <= allowed, (tag, attrs, html)
        assert not any(name.startswith("on") for name in attrs), html
        if tag == "a":
            assert re.match(r"https?://", attrs["href"]), html
            assert attrs.get("rel") == "noopener noreferrer nofollow"
    assert not {tag for tag, _ in parsed.found} & {"script", "img", "iframe", "svg", "style", "form", "input", "details"}


def test_bombs_cost_little_and_a_huge_answer_is_shown_as_text():
    for bomb in (">" * 50_000 + "x", "- " * 30_000 + "x", "[" * 50_000 + "x", "*a **b " * 10_000, "`" * 60_000):
        started = time.perf_counter()
        html = render(bomb)
        assert time.perf_counter() - started < 2.0, bomb[:20]
        assert len(html) < 10 * len(bomb) + 1000
    huge = "<script>x</script>" * (MAX_CHARS // 10)
    html = render(huge)
    assert html.startswith("<p>&lt;script&gt;") and "<script>" not in html
