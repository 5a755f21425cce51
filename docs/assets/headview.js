/* The head view of "What attention learns". Plain JavaScript on docs/assets/widgets.js alone.
 *
 * Like BertViz's head view: the sequence twice, queries on the left and keys
 * on the right, one line per (query, key) pair whose opacity is the weight.
 * The weights come from the trained model at build time
 * (docs/_gen/sitegen/heads.py writes them as JSON next to the widget); this
 * script draws them, lets the reader choose the layer and head, and reads one
 * query's row as a sentence when its token is hovered, tapped or focused.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var SVG = "http://www.w3.org/2000/svg";
  var ROW = 20, TOP = 30, LEFT = 70, RIGHT = 190, WIDTH = 260;

  function svgEl(tag, attrs, text) {
    var node = document.createElementNS(SVG, tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, function (_, k) { return values[k]; });
  }

  /* A row of buttons, one pressed at a time; returns the buttons. */
  function choices(label, count, word, onPick) {
    var group = el("div", { class: "pa-hv-choice", role: "group", "aria-label": label });
    var buttons = [];
    for (var i = 0; i < count; i++) {
      var b = el("button", { type: "button", class: "pa-hv-pick", "data-index": String(i) },
                 word + " " + (i + 1));
      b.addEventListener("click", onPick.bind(null, i));
      group.appendChild(b);
      buttons.push(b);
    }
    return { group: group, buttons: buttons };
  }

  function init(root) {
    var data = JSON.parse(root.querySelector(".pa-headview-data").textContent);
    var text = data.text, tokens = data.tokens, n = tokens.length;
    var layer = 0, head = 0, pinned = null, shown = null;
    var live = root.querySelector(".pa-hv-live");

    var layers = choices(text.layer, data.weights.length, text.layer, function (i) { layer = i; draw(); });
    var heads = choices(text.head_word, data.weights[0].length, text.head_word,
                        function (i) { head = i; draw(); });
    heads.buttons.forEach(function (b, i) {
      b.insertBefore(el("span", { class: "pa-hv-swatch", "aria-hidden": "true",
                                  style: "background:" + data.colours[i] }), b.firstChild);
    });
    var controls = el("div", { class: "pa-hv-controls" });
    controls.appendChild(layers.group);
    controls.appendChild(heads.group);

    var height = TOP + n * ROW + 4;
    var svg = svgEl("svg", { class: "pa-hv-svg", viewBox: "0 0 " + WIDTH + " " + height,
                             role: "group", "aria-label": text.queries + " → " + text.keys });
    svg.appendChild(svgEl("text", { x: LEFT, y: 14, "text-anchor": "end", class: "pa-hv-axis" }, text.queries));
    svg.appendChild(svgEl("text", { x: RIGHT, y: 14, class: "pa-hv-axis" }, text.keys));
    var y = function (i) { return TOP + i * ROW + ROW / 2; };
    var lines = svgEl("g", { class: "pa-hv-lines" });
    var line = [];
    for (var q = 0; q < n; q++) {
      line.push([]);
      for (var k = 0; k < n; k++) {
        var l = svgEl("line", { x1: LEFT + 6, y1: y(q), x2: RIGHT - 6, y2: y(k),
                                "data-q": String(q), "data-k": String(k) });
        lines.appendChild(l);
        line[q].push(l);
      }
    }
    svg.appendChild(lines);
    var queries = [], keys = [];
    tokens.forEach(function (t, i) {
      var g = svgEl("g", { class: "pa-hv-query", tabindex: "0", role: "button",
                           "aria-pressed": "false", "data-q": String(i) });
      g.appendChild(svgEl("rect", { x: 0, y: TOP + i * ROW + 1, width: LEFT + 4, height: ROW - 2, rx: 3 }));
      g.appendChild(svgEl("text", { x: LEFT, y: y(i) + 4, "text-anchor": "end" }, t));
      svg.appendChild(g);
      queries.push(g);
      var h = svgEl("g", { class: "pa-hv-key", "data-k": String(i) });
      h.appendChild(svgEl("rect", { x: RIGHT - 4, y: TOP + i * ROW + 1, width: 26, height: ROW - 2, rx: 3 }));
      h.appendChild(svgEl("text", { x: RIGHT, y: y(i) + 4 }, t));
      svg.appendChild(h);
      keys.push(h);
    });
    var said = el("p", { class: "pa-hv-sentence", "aria-live": "polite" });
    live.appendChild(controls);
    live.appendChild(svg);
    live.appendChild(said);

    function row(i) { return data.weights[layer][head][i]; }

    function sentence(i) {
      var order = row(i).map(function (w, j) { return [w, j]; })
        .filter(function (p) { return Math.round(100 * p[0]) >= 1; })
        .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 4);
      var parts = order.map(function (p) {
        return tokens[p[1]] + " (" + (p[1] + 1) + ") " + Math.round(100 * p[0]) + "%";
      });
      return fill(text.attends, { q: tokens[i], i: i + 1, parts: parts.join(", ") });
    }

    function draw() {
      var colour = data.colours[head];
      root.setAttribute("data-layer", String(layer));
      root.setAttribute("data-head", String(head));
      root.setAttribute("data-query", shown === null ? "" : String(shown));
      layers.buttons.forEach(function (b, i) { b.setAttribute("aria-pressed", String(i === layer)); });
      heads.buttons.forEach(function (b, i) { b.setAttribute("aria-pressed", String(i === head)); });
      for (var q = 0; q < n; q++) {
        for (var k = 0; k < n; k++) {
          var w = row(q)[k];
          var on = shown === null || shown === q;
          var l = line[q][k];
          l.setAttribute("stroke", colour);
          l.setAttribute("stroke-opacity", on ? String(w) : "0");
          l.setAttribute("data-w", on ? String(w) : "0");
        }
      }
      keys.forEach(function (g, k) {
        var w = shown === null ? 0 : row(shown)[k];
        g.querySelector("rect").setAttribute("fill", colour);
        g.querySelector("rect").setAttribute("fill-opacity", String(0.45 * w));
        g.setAttribute("data-w", String(w));
      });
      queries.forEach(function (g, q) { g.classList.toggle("pa-hv-active", q === shown); });
      said.textContent = "";
      said.appendChild(shown === null ? el("span", { class: "pa-hv-hint" }, text.hint)
                                      : el("span", { class: "pa-hv-said" }, sentence(shown)));
    }

    function show(i) { shown = i; draw(); }
    function pin(i) {
      pinned = i;
      queries.forEach(function (g, q) { g.setAttribute("aria-pressed", String(q === i)); });
      show(i);
    }

    queries.forEach(function (g, i) {
      g.addEventListener("mouseenter", function () { show(i); });
      g.addEventListener("click", function () { pin(i); });
      g.addEventListener("focus", function () { pin(i); });
      g.addEventListener("keydown", function (event) {
        var next = null;
        if (event.key === "ArrowDown") next = Math.min(n - 1, i + 1);
        else if (event.key === "ArrowUp") next = Math.max(0, i - 1);
        else if (event.key === "Enter" || event.key === " ") { event.preventDefault(); pin(i); }
        if (next !== null) { event.preventDefault(); queries[next].focus(); }
      });
    });
    svg.addEventListener("mouseleave", function () { show(pinned); });

    draw();
    root.classList.add("pa-headview-ready");
  }

  function boot() {
    document.querySelectorAll("[data-pa-headview]").forEach(init);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", boot);
  } else {
    boot();
  }
})();
