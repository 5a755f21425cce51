/* The head view of "What attention learns". Plain JavaScript on docs/assets/widgets.js alone.
 *
 * Like BertViz's head view: the sequence twice, queries on the left and keys
 * on the right, one line per (query, key) pair whose opacity is the weight.
 * The weights come from the trained model at build time
 * (docs/_gen/sitegen/heads.py writes them as JSON next to the widget); this
 * script draws them, lets the reader choose the layer and tick the heads to
 * draw together (each head in its own colour, as BertViz overlays them), and
 * reads one query's row as a sentence when its token is hovered, tapped or
 * focused. The grid of every layer and head beside it (BertViz's model view)
 * is drawn at build time; a click on a thumbnail draws that head alone.
 * When the reader types their own sequence, docs/assets/learnedlive.js runs
 * the model in the page and calls the root's portattnHeadView.update with the
 * new tokens and weights: the lines are built again and the thumbnails
 * repainted.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var fill = window.portattnWidgets.fill;
  var svgEl = window.portattnWidgets.svg;
  var ROW = 20, TOP = 30, LEFT = 70, RIGHT = 190, WIDTH = 260;

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

  /* One checkbox per head, all ticked at first: their lines are drawn together. */
  function headBoxes(text, count, colours, onChange) {
    var group = el("div", { class: "pa-hv-choice", role: "group", "aria-label": text.heads_label });
    var boxes = [];
    for (var i = 0; i < count; i++) {
      var label = el("label", { class: "pa-hv-pick pa-hv-check" });
      var box = el("input", { type: "checkbox", class: "pa-hv-box", "data-index": String(i) });
      box.checked = true;
      box.addEventListener("change", onChange);
      label.appendChild(box);
      label.appendChild(el("span", { class: "pa-hv-swatch", "aria-hidden": "true",
                                     style: "background:" + colours[i] }));
      label.appendChild(document.createTextNode(text.head_word + " " + (i + 1)));
      group.appendChild(label);
      boxes.push(box);
    }
    return { group: group, boxes: boxes };
  }

  /* A thumbnail's heatmap drawn again, as docs/_gen/sitegen/heads.py draws it at
     build time: one cell per (query, key), rows queries and columns keys, the
     colormap's nearest stop, one path per colour, and the cells the causal
     mask hides filled with the thumbnail's own hatch pattern, kept from the
     build (its group's id is what the browser tests look for). */
  function paintThumb(svg, w, causal, map) {
    var n = w.length, cells = {}, masked = [];
    var hatch = svg.querySelector("defs"), group = svg.querySelector("[id*=pa-attn-masked]");
    var fillId = hatch && hatch.querySelector("pattern").id;
    for (var q = 0; q < n; q++) {
      for (var k = 0; k < n; k++) {
        var d = "M" + k + " " + q + "h1v1h-1z";
        if (causal && k > q) { masked.push(d); continue; }
        var c = map[Math.round(w[q][k] * (map.length - 1))];
        (cells[c] = cells[c] || []).push(d);
      }
    }
    svg.textContent = "";
    svg.setAttribute("viewBox", "0 0 " + n + " " + n);
    if (hatch) {
      svg.appendChild(hatch);
      group.textContent = "";
      group.appendChild(svgEl("path", { fill: "url(#" + fillId + ")", d: masked.join("") }));
      svg.appendChild(group);
    }
    var g = svgEl("g");
    Object.keys(cells).sort().forEach(function (c) { g.appendChild(svgEl("path", { fill: c, d: cells[c].join("") })); });
    svg.appendChild(g);
  }

  function init(root) {
    var data = JSON.parse(root.querySelector(".pa-headview-data").textContent);
    var text = data.text, tokens = data.tokens, n = tokens.length;
    var nHeads = data.weights[0].length;
    var layer = 0, pinned = null, shown = null;
    var live = root.querySelector(".pa-hv-live");

    var layers = choices(text.layer, data.weights.length, text.layer, function (i) { layer = i; draw(); });
    var heads = headBoxes(text, nHeads, data.colours, function () { draw(); });
    var controls = el("div", { class: "pa-hv-controls" });
    controls.appendChild(layers.group);
    controls.appendChild(heads.group);

    function selected() {
      return heads.boxes.filter(function (b) { return b.checked; })
        .map(function (b) { return +b.getAttribute("data-index"); });
    }

    var svg = null, line = [], queries = [], keys = [];
    var y = function (i) { return TOP + i * ROW + ROW / 2; };

    /* The two columns of tokens and one line per (head, query, key), for the
       current tokens; built again when the reader's sequence changes. */
    function build() {
      var height = TOP + n * ROW + 4;
      var fresh = svgEl("svg", { class: "pa-hv-svg", viewBox: "0 0 " + WIDTH + " " + height,
                                 role: "group", "aria-label": text.queries + " → " + text.keys });
      fresh.appendChild(svgEl("text", { x: LEFT, y: 14, "text-anchor": "end", class: "pa-hv-axis" }, text.queries));
      fresh.appendChild(svgEl("text", { x: RIGHT, y: 14, class: "pa-hv-axis" }, text.keys));
      /* line[h][q][k]: each head its own group of lines, in its own colour. */
      line = [];
      for (var h = 0; h < nHeads; h++) {
        var group = svgEl("g", { class: "pa-hv-lines", "data-h": String(h), stroke: data.colours[h] });
        line.push([]);
        for (var q = 0; q < n; q++) {
          line[h].push([]);
          for (var k = 0; k < n; k++) {
            var l = svgEl("line", { x1: LEFT + 6, y1: y(q), x2: RIGHT - 6, y2: y(k),
                                    "data-h": String(h), "data-q": String(q), "data-k": String(k) });
            group.appendChild(l);
            line[h][q].push(l);
          }
        }
        fresh.appendChild(group);
      }
      queries = [];
      keys = [];
      tokens.forEach(function (t, i) {
        var g = svgEl("g", { class: "pa-hv-query", tabindex: "0", role: "button",
                             "aria-pressed": "false", "data-q": String(i) });
        g.appendChild(svgEl("rect", { x: 0, y: TOP + i * ROW + 1, width: LEFT + 4, height: ROW - 2, rx: 3 }));
        g.appendChild(svgEl("text", { x: LEFT, y: y(i) + 4, "text-anchor": "end" }, t));
        fresh.appendChild(g);
        queries.push(g);
        var kg = svgEl("g", { class: "pa-hv-key", "data-k": String(i) });
        kg.appendChild(svgEl("rect", { x: RIGHT - 4, y: TOP + i * ROW + 1, width: 26, height: ROW - 2, rx: 3 }));
        kg.appendChild(svgEl("text", { x: RIGHT, y: y(i) + 4 }, t));
        fresh.appendChild(kg);
        keys.push(kg);
      });
      if (svg) view.replaceChild(fresh, svg);
      else view.insertBefore(fresh, said);
      svg = fresh;
      listen();
    }
    var said = el("p", { class: "pa-hv-sentence", "aria-live": "polite" });
    /* The lines and their sentence on one side, the grid of every head on the
       other (below it on phones). */
    var view = el("div", { class: "pa-hv-view" });
    view.appendChild(said);
    build();
    var body = el("div", { class: "pa-hv-body" });
    body.appendChild(view);
    var model = root.querySelector(".pa-hv-model");
    var thumbs = Array.prototype.slice.call(root.querySelectorAll(".pa-hv-thumb"));
    if (model) body.appendChild(model);
    live.appendChild(controls);
    live.appendChild(body);

    thumbs.forEach(function (b) {
      b.addEventListener("click", function () {
        layer = +b.getAttribute("data-layer");
        var pick = +b.getAttribute("data-head");
        heads.boxes.forEach(function (box, i) { box.checked = i === pick; });
        draw();
        svg.scrollIntoView({ block: "nearest" });
      });
    });

    function row(h, i) { return data.weights[layer][h][i]; }

    function parts(h, i) {
      return row(h, i).map(function (w, j) { return [w, j]; })
        .filter(function (p) { return Math.round(100 * p[0]) >= 1; })
        .sort(function (a, b) { return b[0] - a[0]; }).slice(0, 4)
        .map(function (p) {
          return tokens[p[1]] + " (" + (p[1] + 1) + ") " + Math.round(100 * p[0]) + "%";
        }).join(", ");
    }

    /* One head: its strongest keys; several: the same, head by head. */
    function sentence(picked, i) {
      var joined = picked.length === 1 ? parts(picked[0], i) : picked.map(function (h) {
        return fill(text.per_head, { name: (layer + 1) + "." + (h + 1), parts: parts(h, i) });
      }).join("; ");
      return fill(text.attends, { q: tokens[i], i: i + 1, parts: joined });
    }

    function draw() {
      var picked = selected();
      root.setAttribute("data-layer", String(layer));
      root.setAttribute("data-heads", picked.join(","));
      root.setAttribute("data-query", shown === null ? "" : String(shown));
      layers.buttons.forEach(function (b, i) { b.setAttribute("aria-pressed", String(i === layer)); });
      thumbs.forEach(function (b) {
        var on = +b.getAttribute("data-layer") === layer && picked.indexOf(+b.getAttribute("data-head")) >= 0;
        b.setAttribute("aria-pressed", String(on));
      });
      for (var h = 0; h < nHeads; h++) {
        var drawn = picked.indexOf(h) >= 0;
        for (var q = 0; q < n; q++) {
          var on = drawn && (shown === null || shown === q);
          for (var k = 0; k < n; k++) {
            var w = on ? row(h, q)[k] : 0;
            line[h][q][k].setAttribute("stroke-opacity", String(w));
            line[h][q][k].setAttribute("data-w", String(w));
          }
        }
      }
      /* A key's box takes the colour of the head that looks at it most. */
      keys.forEach(function (g, k) {
        var best = 0, colour = "transparent";
        if (shown !== null) picked.forEach(function (h) {
          if (row(h, shown)[k] > best) { best = row(h, shown)[k]; colour = data.colours[h]; }
        });
        g.querySelector("rect").setAttribute("fill", colour);
        g.querySelector("rect").setAttribute("fill-opacity", String(0.45 * best));
        g.setAttribute("data-w", String(best));
      });
      queries.forEach(function (g, q) { g.classList.toggle("pa-hv-active", q === shown); });
      said.textContent = "";
      if (!picked.length) said.appendChild(el("span", { class: "pa-hv-hint" }, text.none));
      else if (shown === null) said.appendChild(el("span", { class: "pa-hv-hint" }, text.hint));
      else said.appendChild(el("span", { class: "pa-hv-said" }, sentence(picked, shown)));
    }

    function show(i) { shown = i; draw(); }
    function pin(i) {
      pinned = i;
      queries.forEach(function (g, q) { g.setAttribute("aria-pressed", String(q === i)); });
      show(i);
    }

    function listen() {
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
    }

    /* The reader's own sequence (docs/assets/learnedlive.js runs the model in
       the page): new tokens and weights, the lines built again for them, the
       thumbnails repainted, the same layer and heads kept, no query pinned. */
    function update(newTokens, newWeights, colormap) {
      tokens = data.tokens = newTokens;
      data.weights = newWeights;
      n = tokens.length;
      pinned = shown = null;
      build();
      thumbs.forEach(function (b) {
        var l = +b.getAttribute("data-layer"), h = +b.getAttribute("data-head");
        paintThumb(b.querySelector("svg"), newWeights[l][h], data.causal, colormap);
      });
      draw();
    }
    root.portattnHeadView = { update: update };

    draw();
    root.classList.add("pa-headview-ready");
  }

  window.portattnWidgets.start("[data-pa-headview]", init);
})();
