// The API page (/api/docs): Swagger UI, vendored, over this server's OpenAPI document. A file of its
// own because the CSP allows no inline script; nothing leaves this origin (no validator badge).
(function () {
  "use strict";
  var root = document.getElementById("swagger-ui");
  if (!root || typeof window.SwaggerUIBundle !== "function") {
    return;
  }
  window.SwaggerUIBundle({
    url: root.dataset.url,
    domNode: root,
    deepLinking: true,
    validatorUrl: null,
    defaultModelsExpandDepth: 0,
    docExpansion: "list",
  });
})();
