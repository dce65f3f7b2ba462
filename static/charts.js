/* Renders the dashboard's plotly figures and keeps htmx refreshes gentle.
 *
 * Figures are built on the server (plain dicts in plotly.js's schema: monitor/web/charts.py) and
 * shipped as JSON in each .chart element's data-figure attribute (htmx drops script elements from
 * what it swaps in): no script is built from data.
 * After every htmx swap, new charts are drawn and <details> that were open stay open.
 */
(function () {
  "use strict";

  function cssVar(name, fallback) {
    var value = getComputedStyle(document.documentElement).getPropertyValue(name);
    return (value && value.trim()) || fallback;
  }

  function themed(layout) {
    var fg = cssVar("--fg", "#1c2128");
    var muted = cssVar("--muted", "#5f6b7a");
    var grid = cssVar("--grid", "#e9ecf0");
    layout = Object.assign({}, layout);
    layout.font = Object.assign({}, layout.font || {}, { color: fg });
    layout.hoverlabel = Object.assign({ bgcolor: cssVar("--panel", "#fff"), bordercolor: grid, font: { color: fg } },
      layout.hoverlabel || {});
    Object.keys(layout).forEach(function (key) {
      if (/^[xy]axis\d*$/.test(key)) {
        layout[key] = Object.assign({ gridcolor: grid, linecolor: grid, zerolinecolor: grid, tickcolor: muted },
          layout[key]);
      }
    });
    if (layout.legend) { layout.legend = Object.assign({ font: { color: muted } }, layout.legend); }
    return layout;
  }

  function draw(el) {
    if (!window.Plotly) { return; }
    var figure = el.__figure;
    if (!figure) {
      var text = el.getAttribute("data-figure");
      if (!text) { return; }
      try {
        figure = JSON.parse(text);
      } catch (err) {
        el.textContent = "chart data could not be read";
        return;
      }
      el.removeAttribute("data-figure");
      el.__figure = figure;
    }
    var layout = themed(figure.layout || {});
    if (layout.height) { el.style.minHeight = layout.height + "px"; }
    window.Plotly.react(el, figure.data || [], layout, { displayModeBar: false, responsive: true });
  }

  function drawAll(root) {
    var scope = root && root.querySelectorAll ? root : document;
    if (scope.matches && scope.matches(".chart")) { draw(scope); }
    scope.querySelectorAll(".chart").forEach(draw);
  }

  function purge(root) {
    if (!window.Plotly || !root || !root.querySelectorAll) { return; }
    root.querySelectorAll(".chart.js-plotly-plot").forEach(function (el) { window.Plotly.purge(el); });
  }

  // <details> open before a refresh stay open after it (matched by id).
  var openDetails = null;

  document.addEventListener("htmx:beforeSwap", function (event) {
    var target = event.detail.target;
    openDetails = [];
    if (target && target.querySelectorAll) {
      target.querySelectorAll("details[id][open]").forEach(function (d) { openDetails.push(d.id); });
      purge(target);
    }
  });

  document.addEventListener("htmx:afterSwap", function () {
    (openDetails || []).forEach(function (id) {
      var d = document.getElementById(id);
      if (d) { d.open = true; }
    });
    openDetails = null;
  });

  function start() {
    if (window.htmx) {
      window.htmx.onLoad(drawAll);
    } else {
      drawAll(document);
    }
    if (window.matchMedia) {
      var query = window.matchMedia("(prefers-color-scheme: dark)");
      var redraw = function () { document.querySelectorAll(".chart").forEach(draw); };
      if (query.addEventListener) { query.addEventListener("change", redraw); }
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
