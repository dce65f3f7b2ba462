/* The chat page's one script: stream an answer's tokens into the page (Server-Sent Events), put
   the rendered answer in their place when it is done, copy buttons, keyboard shortcuts, and show
   the chat's 4xx/5xx error partials, which htmx would otherwise not swap.
   Tokens and errors arrive as plain text and are added as text nodes, never parsed as HTML; the
   rendered answer ("rendered") and the final "done" partial are HTML the server made: Markdown
   rendered with raw HTML off and sanitised to a fixed list of tags (chat/markdown.py), and a
   template with every value escaped. The streamed text stays in the page, hidden: "Copy" copies it. */
(function () {
  "use strict";

  // An answer that did not come (its servers failed, or the connection to the chat was lost: a chat
  // worker that died) offers its question again, asked where the conversation stands now: the
  // worker that took it dropped it, and one that died never stored it ("edit" one past the last
  // question asks anew: chat/http/page.py rewind). The page then replaces the failed turn.
  function offerAgain(article) {
    var asked = article.previousElementSibling;
    while (asked && !asked.classList.contains("chat-user")) asked = asked.previousElementSibling;
    var form = document.getElementById("chat-form");
    var meta = article.querySelector(".chat-meta");
    if (!asked || !form || !meta || meta.querySelector("button.chat-ask-again")) return;
    var button = document.createElement("button");
    button.type = "button";
    button.className = "chat-ask-again";
    button.textContent = "Regenerate";
    button.setAttribute("aria-label", "Regenerate: ask this question again");
    button.addEventListener("click", function () {
      document.getElementById("message").value = asked.querySelector(".chat-text").textContent;
      document.getElementById("chat-edit").value = asked.dataset.userIndex;
      if (form.requestSubmit) form.requestSubmit(); else form.querySelector("button[type=submit]").click();
    });
    meta.appendChild(button);
  }

  function stream(article) {
    if (article.dataset.chatStarted) return;
    article.dataset.chatStarted = "1";
    var text = article.querySelector(".chat-text");
    var meta = article.querySelector(".chat-meta");
    var finished = false;
    var failed = false;
    var source = new EventSource(article.dataset.chatStream);

    function follow() { article.scrollIntoView({ block: "end" }); }

    var status = document.createElement("p");
    status.className = "chat-status small muted";
    status.setAttribute("role", "status");
    text.parentNode.insertBefore(status, text);
    source.addEventListener("status", function (event) { status.textContent = event.data; });
    source.addEventListener("token", function (event) {
      if (status.parentNode) status.remove();  // the first token: the steps before it are done
      text.appendChild(document.createTextNode(event.data));
      follow();
    });
    source.addEventListener("rendered", function (event) {
      var rendered = document.createElement("div");
      rendered.className = "chat-rendered";
      rendered.innerHTML = event.data;  // sanitised by the server (chat/markdown.py)
      text.hidden = true;
      text.parentNode.insertBefore(rendered, text.nextSibling);
    });
    source.addEventListener("note", function (event) {
      var p = article.querySelector(".chat-note-live");
      if (!p) {
        p = document.createElement("p");
        p.className = "chat-note-live small muted";
        p.setAttribute("role", "status");
        article.insertBefore(p, meta);
      }
      p.textContent = event.data;
    });
    source.addEventListener("failed", function (event) {
      failed = true;
      if (status.parentNode) status.remove();
      var p = document.createElement("p");
      p.className = "chat-failed";
      p.textContent = event.data;
      if (article.dataset.modelPage) {  // why its servers could not answer: the model's page says
        var link = document.createElement("a");
        link.href = article.dataset.modelPage;
        link.textContent = "See the model's page";
        p.appendChild(document.createTextNode(" — "));
        p.appendChild(link);
      }
      article.insertBefore(p, meta);
    });
    source.addEventListener("done", function (event) {
      finished = true;
      source.close();
      meta.innerHTML = event.data;
      if (window.htmx) window.htmx.process(meta);
      if (failed) offerAgain(article);
      document.querySelectorAll("#conversation button.chat-regenerate").forEach(function (button) {
        if (!meta.contains(button)) button.remove();  // only the last answer is regenerated
      });
      follow();
      // a stored conversation: a reload reopens it where it is, and its list shows it
      var form = document.getElementById("chat-form");
      var id = document.getElementById("conversation-id");
      if (form && form.dataset.kept && id && id.value) {
        history.replaceState(null, "", form.dataset.page + "?c=" + encodeURIComponent(id.value));
        document.body.dispatchEvent(new CustomEvent("chat-saved"));
      }
    });
    source.onerror = function () {
      if (finished) return;
      source.close();
      var p = document.createElement("p");
      p.className = "chat-failed";
      if (status.parentNode) status.remove();
      p.textContent = "The connection to the chat was lost before the answer finished; your question is kept: " +
        "Regenerate asks it again.";
      article.insertBefore(p, meta);
      meta.textContent = "";
      offerAgain(article);
    };
  }

  function scan(root) {
    if (root.matches && root.matches("[data-chat-stream]")) stream(root);
    if (root.querySelectorAll) root.querySelectorAll("[data-chat-stream]").forEach(stream);
  }

  function copy(button, value) {
    function told(word) {
      var before = button.dataset.label || button.textContent;
      button.dataset.label = before;
      button.textContent = word;
      setTimeout(function () { button.textContent = before; }, 2000);
    }
    if (navigator.clipboard && navigator.clipboard.writeText) {
      navigator.clipboard.writeText(value).then(function () { told("Copied"); },
                                                function () { told("Copy failed"); });
    } else {
      told("Copy failed");
    }
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.code-copy, button.chat-copy");
    if (!button) return;
    if (button.classList.contains("code-copy")) {
      var code = button.closest(".code-block").querySelector("pre code");
      copy(button, code ? code.textContent : "");
    } else {
      var answer = button.closest(".chat-turn").querySelector(".chat-text");
      copy(button, answer ? answer.textContent : "");
    }
  });

  // Keyboard: Enter sends, Shift+Enter is a new line, Esc stops the answer being written,
  // Ctrl+Shift+O (⌘+Shift+O) starts a new conversation.
  document.addEventListener("keydown", function (event) {
    var form = document.getElementById("chat-form");
    if (!form) return;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.target.id === "message") {
      event.preventDefault();
      if (form.requestSubmit) form.requestSubmit(); else form.querySelector("button[type=submit]").click();
    } else if (event.key === "Escape") {
      var stops = document.querySelectorAll("button.chat-stop");
      if (stops.length) { event.preventDefault(); stops[stops.length - 1].click(); }
    } else if ((event.key === "o" || event.key === "O") && event.shiftKey && (event.ctrlKey || event.metaKey)) {
      var fresh = document.getElementById("chat-new");
      if (fresh) { event.preventDefault(); fresh.click(); }
    }
  });

  // Edit a question: its text into the message box; sending it replaces that turn and the ones after.
  function cancelEdit() {
    var edit = document.getElementById("chat-edit");
    var note = document.getElementById("chat-editing");
    if (edit) edit.value = "";
    if (note) note.textContent = "";
    document.querySelectorAll(".chat-user.editing").forEach(function (a) { a.classList.remove("editing"); });
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.chat-edit");
    if (!button) return;
    var article = button.closest(".chat-user");
    cancelEdit();
    article.classList.add("editing");
    document.getElementById("chat-edit").value = article.dataset.userIndex;
    document.getElementById("chat-editing").textContent =
      "Editing question " + (Number(article.dataset.userIndex) + 1) + ": sending replaces it and the turns after it. Esc cancels.";
    var box = document.getElementById("message");
    box.value = article.querySelector(".chat-text").textContent;
    box.focus();
  });
  document.addEventListener("keydown", function (event) {
    if (event.key === "Escape" && !document.querySelector("button.chat-stop") && document.getElementById("chat-edit") &&
        document.getElementById("chat-edit").value !== "") cancelEdit();
  });
  // A regenerated or edited turn replaces what it replaces in the page too, once the server took it.
  document.addEventListener("htmx:beforeSwap", function (event) {
    var config = event.detail.requestConfig;
    if (!config || !event.detail.xhr || event.detail.xhr.status >= 400 || !config.parameters) return;
    var from = null;
    if (config.parameters.regenerate) {
      var asked = document.querySelectorAll("#conversation .chat-user");
      from = asked.length ? asked[asked.length - 1] : null;
    } else if (config.parameters.edit !== undefined && config.parameters.edit !== "") {
      from = document.querySelector('#conversation .chat-user[data-user-index="' + config.parameters.edit + '"]');
    }
    if (!from) return;
    var turns = Array.prototype.slice.call(document.querySelectorAll("#conversation > *"));
    turns.slice(turns.indexOf(from)).forEach(function (node) { node.remove(); });
  });
  document.addEventListener("htmx:load", function (event) { scan(event.detail.elt); });
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && xhr.status >= 400 && xhr.getResponseHeader("X-Chat-Error")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
