"""An answer's Markdown as safe HTML, for the chat page (pure).

Rendered by markdown-it-py (CommonMark, with tables and strikethrough) with raw HTML off, so any
HTML the model writes shows as text; links only to http(s) (any other link stays text); then
sanitised again by nh3 (ammonia) to a fixed list of tags and attributes, so nothing that could run
script or load anything but a followed link can reach the page, whatever the renderer let through.
Images become links to them (the page loads nothing the model names). Code blocks carry their
language (as the model named it, letters and digits only) and a copy button, which the
page's own script (``chat/static/chat.js``) runs; the Content-Security-Policy stays ``script-src
'self'``. Longer input than ``MAX_CHARS`` is shown as plain text, and nesting is bounded
(``MAX_NESTING``), so no answer costs more than linear work.
"""

from __future__ import annotations

import html
import re

import nh3
from markdown_it import MarkdownIt

MAX_CHARS = 100_000  # an answer longer than this is shown as text (no answer of a model's context is)
MAX_NESTING = 20  # lists and quotes inside each other, at most (deeper is shown flat)
MAX_LANGUAGE_CHARS = 32
TAGS = {"p", "br", "hr", "em", "strong", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li", "a",
        "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "div", "span", "button"}
ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}, "code": {"class"}, "div": {"class"}, "span": {"class"},
              "button": {"class", "type", "aria-label"}, "th": {"class"}, "td": {"class"}}
URL_SCHEMES = {"http", "https"}
ALIGN = {"text-align:left": "align-left", "text-align:center": "align-center", "text-align:right": "align-right"}


def _safe_link(url: str) -> bool:
    return url.strip().lower().startswith(("http://", "https://"))


def _fence(tokens, index, options, env) -> str:
    token = tokens[index]
    words = (token.info or "").split()
    language = re.sub(r"[^A-Za-z0-9+#._-]", "", words[0])[:MAX_LANGUAGE_CHARS] if words else ""
    code = html.escape(token.content)
    label = html.escape(language) if language else "text"
    cls = f' class="language-{html.escape(language)}"' if language else ""
    return (f'<div class="code-block"><div class="code-head"><span class="code-lang">{label}</span>'
            f'<button type="button" class="code-copy" aria-label="Copy the {label} code">Copy</button></div>'
            f'<pre><code{cls}>{code}</code></pre></div>\n')


def _table_cell(tokens, index, options, env) -> str:
    """A table cell with its alignment as a class (inline styles are not allowed through)."""
    token = tokens[index]
    align = ALIGN.get((token.attrGet("style") or "").replace(" ", ""))
    attribute = f' class="{align}"' if align else ""
    return f"<{token.tag}{attribute}>"


def _image(tokens, index, options, env) -> str:
    """An image as a link to it (the page loads nothing the model names)."""
    token = tokens[index]
    alt = html.escape("".join(child.content for child in token.children or ()) or "image")
    src = token.attrGet("src") or ""
    return f'<a href="{html.escape(src)}">{alt}</a>' if _safe_link(src) else alt


_md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False, "maxNesting": MAX_NESTING})
_md.enable(["table", "strikethrough"])
_md.validateLink = _safe_link
_md.renderer.rules["fence"] = _fence
_md.renderer.rules["code_block"] = _fence
_md.renderer.rules["th_open"] = _table_cell
_md.renderer.rules["td_open"] = _table_cell
_md.renderer.rules["image"] = _image


def render(text: str) -> str:
    """The answer's Markdown as sanitised HTML (a string safe to put into the page as HTML)."""
    if len(text) > MAX_CHARS:
        rendered = f"<p>{html.escape(text)}</p>"
    else:
        rendered = _md.render(text)
    return nh3.clean(rendered, tags=TAGS, attributes=ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="noopener noreferrer nofollow", strip_comments=True)
