/* The chapter's head, run in the page on the reader's own sentence.
 *
 * docs/_gen/sitegen/live.py writes the head's three matrices and the vectors
 * of a fixed vocabulary as JSON at build time; this script computes
 * Q = X Wq, K = X Wk, V = X Wv, the scores Q Kᵀ / √d, the causal mask, a
 * softmax that subtracts each row's largest score, and the output W V, in
 * float64 like portattn's float64 call. window.portattnLive.forward is what
 * the browser test compares with portattn.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var colour = window.portattnWidgets.colour;

  function matmul(a, b) {
    return a.map(function (row) {
      return b[0].map(function (_, j) {
        var s = 0;
        for (var k = 0; k < row.length; k++) s += row[k] * b[k][j];
        return s;
      });
    });
  }

  function forward(data, tokens, causal) {
    var x = tokens.map(function (t) { return data.vocab[t]; });
    var q = matmul(x, data.wq), k = matmul(x, data.wk), v = matmul(x, data.wv);
    var scale = 1 / Math.sqrt(q[0].length), n = tokens.length;
    var weights = q.map(function (qi, i) {
      var s = k.map(function (kj, j) {
        if (causal && j > i) return -Infinity;
        var dot = 0;
        for (var c = 0; c < qi.length; c++) dot += qi[c] * kj[c];
        return dot * scale;
      });
      var top = Math.max.apply(null, s);
      var e = s.map(function (z) { return z === -Infinity ? 0 : Math.exp(z - top); });
      var sum = e.reduce(function (a, b) { return a + b; }, 0);
      return e.map(function (z) { return z / sum; });
    });
    return { weights: weights, out: matmul(weights, v), n: n };
  }

  function init(root) {
    var data = JSON.parse(root.querySelector(".pa-live-data").textContent);
    var text = data.text;
    var id = "pa-live-" + Math.random().toString(36).slice(2, 8);
    var label = el("label", { for: id }, text.label);
    var input = el("input", { id: id, type: "text", class: "pa-live-input", spellcheck: "false" });
    input.value = text.start;
    var box = el("label", { class: "pa-live-switch" });
    var check = el("input", { type: "checkbox", class: "pa-live-causal" });
    check.checked = true;
    box.appendChild(check);
    box.appendChild(document.createTextNode(" " + text.switch));
    var said = el("p", { class: "pa-live-said", "aria-live": "polite" });
    var grid = el("div", { class: "pa-live-grid" });
    var out = el("p", { class: "pa-live-out" });
    [label, input, box, said, grid, window.portattnWidgets.scale(text, data.colormap), out]
      .forEach(function (node) { root.appendChild(node); });

    function draw() {
      var tokens = input.value.trim().split(/\s+/).filter(Boolean);
      var unknown = tokens.filter(function (t) { return !(t in data.vocab); });
      grid.textContent = "";
      out.textContent = "";
      root.removeAttribute("data-out");
      if (!tokens.length || unknown.length) {
        said.textContent = tokens.length ? text.unknown.replace("{words}", unknown.join(", "))
          .replace("{vocab}", Object.keys(data.vocab).join(" ")) : text.empty;
        return;
      }
      said.textContent = "";
      var r = forward(data, tokens, check.checked);
      var g = window.portattnWidgets.grid("pa-hm-grid", text, tokens);
      r.weights.forEach(function (row, i) {
        row.forEach(function (w, j) {
          var hidden = check.checked && j > i, td = g.cells[i][j];
          if (hidden) td.classList.add("pa-hm-hidden");
          td.setAttribute("data-weight", String(w));
          td.textContent = hidden ? "—" : Math.round(100 * w) + "%";
          if (!hidden) {
            var c = colour(data.colormap, w);
            td.style.backgroundColor = c.fill;
            td.style.color = c.ink;
          }
        });
      });
      grid.appendChild(g.table);
      var last = r.out[r.n - 1].map(function (z) { return z.toFixed(3); }).join(", ");
      out.textContent = text.out.replace("{q}", tokens[r.n - 1]).replace("{v}", "[" + last + "]");
      root.setAttribute("data-out", JSON.stringify(r.out));
    }

    input.addEventListener("input", draw);
    check.addEventListener("change", draw);
    draw();
    window.portattnLive = {
      forward: function (tokens, causal) { return forward(data, tokens, causal); },
      vocabulary: Object.keys(data.vocab)
    };
  }

  window.portattnWidgets.start("[data-pa-live]", init);
})();
