/* The chat page's one script: stream an answer's tokens into the page (Server-Sent Events), and
   show the chat's 4xx/5xx error partials, which htmx would otherwise not swap.
   Tokens and errors arrive as plain text and are added as text nodes, never parsed as HTML; the
   final "done" event carries a partial the server rendered with every value escaped. */
(function () {
  "use strict";

  function stream(article) {
    if (article.dataset.chatStarted) return;
    article.dataset.chatStarted = "1";
    var text = article.querySelector(".chat-text");
    var meta = article.querySelector(".chat-meta");
    var finished = false;
    var source = new EventSource(article.dataset.chatStream);

    function follow() { article.scrollIntoView({ block: "end" }); }

    source.addEventListener("token", function (event) {
      text.appendChild(document.createTextNode(event.data));
      follow();
    });
    source.addEventListener("failed", function (event) {
      var p = document.createElement("p");
      p.className = "chat-failed";
      p.textContent = event.data;
      article.insertBefore(p, meta);
    });
    source.addEventListener("done", function (event) {
      finished = true;
      source.close();
      meta.innerHTML = event.data;
      if (window.htmx) window.htmx.process(meta);
      follow();
    });
    source.onerror = function () {
      if (finished) return;
      source.close();
      var p = document.createElement("p");
      p.className = "chat-failed";
      p.textContent = "The connection to the server was lost before the answer finished.";
      article.insertBefore(p, meta);
      meta.textContent = "";
    };
  }

  function scan(root) {
    if (root.matches && root.matches("[data-chat-stream]")) stream(root);
    if (root.querySelectorAll) root.querySelectorAll("[data-chat-stream]").forEach(stream);
  }

  document.addEventListener("htmx:load", function (event) { scan(event.detail.elt); });
  document.addEventListener("htmx:beforeSwap", function (event) {
    var xhr = event.detail.xhr;
    if (xhr && xhr.status >= 400 && xhr.getResponseHeader("X-Chat-Error")) {
      event.detail.shouldSwap = true;
      event.detail.isError = false;
    }
  });
})();
