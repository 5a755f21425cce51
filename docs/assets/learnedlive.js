/* The trained models of "What attention learns", run in the page on the reader's own sequence.
 *
 * docs/_gen/sitegen/learnedlive.py writes each model's tensors at build time
 * as base64 float64 (exact to the bit). This script decodes them and runs the
 * model's forward pass in float64, as portattn runs it (learned.py's
 * TinyTransformer): token and position embeddings; per block a layer norm, the
 * q, k and v projections, per head the scores q·k / √d, the causal mask for
 * induction, a softmax that subtracts each row's largest score, the weighted
 * sum of v, the output projection and the residual; then the final layer
 * norm, the logits and their argmax. As the reader types, it shows the
 * model's output and hands the attention weights to the head view
 * (docs/assets/headview.js). window.portattnLearned.forward is what the
 * browser test (tests/site/test_site_learned_live.py) compares with portattn.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var fill = window.portattnWidgets.fill;

  /* base64 of little-endian float64 bytes -> Float64Array, whatever the machine's byte order. */
  function decode(b64) {
    var bin = atob(b64), view = new DataView(new ArrayBuffer(bin.length));
    for (var i = 0; i < bin.length; i++) view.setUint8(i, bin.charCodeAt(i));
    var out = new Float64Array(bin.length / 8);
    for (var j = 0; j < out.length; j++) out[j] = view.getFloat64(8 * j, true);
    return out;
  }

  function tensors(data) {
    var p = {};
    Object.keys(data.params).forEach(function (name) {
      p[name] = { shape: data.params[name].shape, v: decode(data.params[name].data) };
    });
    return p;
  }

  /* rows · Wᵀ (+ b), as torch's nn.Linear: W is (out, in), row-major. */
  function linear(rows, w, b) {
    var o = w.shape[0], c = w.shape[1];
    return rows.map(function (x) {
      var y = new Float64Array(o);
      for (var i = 0; i < o; i++) {
        var s = 0;
        for (var k = 0; k < c; k++) s += x[k] * w.v[i * c + k];
        y[i] = b ? s + b.v[i] : s;
      }
      return y;
    });
  }

  /* torch's nn.LayerNorm: the biased variance, eps inside the square root. */
  function layerNorm(rows, w, b, eps) {
    return rows.map(function (x) {
      var c = x.length, mean = 0, variance = 0, y = new Float64Array(c);
      for (var i = 0; i < c; i++) mean += x[i];
      mean /= c;
      for (i = 0; i < c; i++) variance += (x[i] - mean) * (x[i] - mean);
      var inv = 1 / Math.sqrt(variance / c + eps);
      for (i = 0; i < c; i++) y[i] = (x[i] - mean) * inv * w.v[i] + b.v[i];
      return y;
    });
  }

  /* One head's weights for query i: scaled scores, the mask, a max-subtracted softmax. */
  function softmaxRow(qkv, i, off, hd, causal) {
    var n = qkv.length, c = qkv[0].length / 3, scale = 1 / Math.sqrt(hd);
    var s = new Float64Array(n), top = -Infinity;
    for (var j = 0; j < n; j++) {
      if (causal && j > i) { s[j] = -Infinity; continue; }
      var dot = 0;
      for (var d = 0; d < hd; d++) dot += qkv[i][off + d] * qkv[j][c + off + d];
      s[j] = dot * scale;
      if (s[j] > top) top = s[j];
    }
    var sum = 0;
    for (j = 0; j < n; j++) { s[j] = s[j] === -Infinity ? 0 : Math.exp(s[j] - top); sum += s[j]; }
    for (j = 0; j < n; j++) s[j] /= sum;
    return s;
  }

  /* One block: x + out(attention(norm(x))), and its weights [head][query][key]. */
  function block(x, p, name, m) {
    var n = x.length, c = x[0].length, hd = c / m.heads;
    var qkv = linear(layerNorm(x, p[name + "norm.weight"], p[name + "norm.bias"], m.eps),
                     p[name + "qkv.weight"]);
    var y = x.map(function () { return new Float64Array(c); });
    var weights = [];
    for (var h = 0; h < m.heads; h++) {
      var off = h * hd, rows = [];
      for (var i = 0; i < n; i++) {
        var w = softmaxRow(qkv, i, off, hd, m.causal);
        for (var d = 0; d < hd; d++) {
          var acc = 0;
          for (var j = 0; j < n; j++) acc += w[j] * qkv[j][2 * c + off + d];
          y[i][off + d] = acc;
        }
        rows.push(Array.prototype.slice.call(w));
      }
      weights.push(rows);
    }
    var out = linear(y, p[name + "out.weight"]);
    return { x: x.map(function (r, i) { return r.map(function (v, k) { return v + out[i][k]; }); }),
             weights: weights };
  }

  /* The whole model on token ids: weights[layer][head][query][key], logits, predicted ids. */
  function forward(m, p, ids) {
    var c = p["tok.weight"].shape[1];
    var x = ids.map(function (t, i) {
      var row = new Float64Array(c);
      for (var k = 0; k < c; k++) row[k] = p["tok.weight"].v[t * c + k] + p["pos.weight"].v[i * c + k];
      return row;
    });
    var weights = [];
    for (var l = 0; l < m.layers; l++) {
      var r = block(x, p, "blocks." + l + ".", m);
      x = r.x;
      weights.push(r.weights);
    }
    var logits = linear(layerNorm(x, p["norm.weight"], p["norm.bias"], m.eps), p["head.weight"], p["head.bias"]);
    var predicted = logits.map(function (z) {
      var best = 0;
      for (var k = 1; k < z.length; k++) if (z[k] > z[best]) best = k;
      return best;
    });
    return { weights: weights, logits: logits.map(function (z) { return Array.prototype.slice.call(z); }),
             predicted: predicted };
  }

  /* The reader's text as token ids, or the message that says what is wrong with it. */
  function parse(m, value) {
    var chars = Array.from(value.toUpperCase().replace(/[\s,]+/g, ""));
    var bad = chars.filter(function (ch, i) { return m.letters.indexOf(ch) < 0 && chars.indexOf(ch) === i; });
    var quoted = bad.map(function (b) { return fill(m.text.bad, { c: b }); }).join(m.text.bad_sep);
    if (bad.length) return { error: fill(m.text.unknown, { bad: quoted }) };
    if (chars.length < m.min || chars.length > m.max) return { error: fill(m.text.length, { n: chars.length }) };
    return { ids: chars.map(function (ch) { return m.letters.indexOf(ch); }) };
  }

  /* Two rows, the input and the model's letter under each position. Right ones
     are marked; wrong ones are struck through for reversal only, since before
     a repeat starts nothing tells induction what comes next. */
  function outputGrid(m, ids, predicted) {
    var n = ids.length;
    var grid = el("div", { class: "pa-ll-grid", style: "grid-template-columns:auto repeat(" + n + ", minmax(0, 1.6em))" });
    grid.appendChild(el("span", { class: "pa-ll-rowname" }, m.text.input));
    ids.forEach(function (t) { grid.appendChild(el("span", { class: "pa-ll-tok" }, m.letters[t])); });
    grid.appendChild(el("span", { class: "pa-ll-rowname" }, m.text.output));
    var right = 0;
    predicted.forEach(function (t, i) {
      var want = m.task === "reverse" ? ids[n - 1 - i] : ids[i + 1];
      var cls = "pa-ll-tok pa-ll-out";
      if (want === undefined) cls += " pa-ll-next";
      else if (t === want) { cls += " pa-ll-right"; right += 1; }
      else if (m.task === "reverse") cls += " pa-ll-wrong";
      grid.appendChild(el("span", { class: cls }, m.letters[t]));
    });
    return { grid: grid, right: right };
  }

  function init(root) {
    var m = JSON.parse(root.querySelector(".pa-ll-data").textContent);
    var p = tensors(m), text = m.text;
    var id = "pa-ll-" + m.task;
    var input = el("input", { id: id, type: "text", class: "pa-ll-input", spellcheck: "false",
                              autocomplete: "off", autocapitalize: "characters",
                              "aria-describedby": id + "-hint " + id + "-said" });
    input.value = m.start.split("").join(" ");
    var said = el("p", { id: id + "-said", class: "pa-ll-said", "aria-live": "polite" });
    var out = el("div", { class: "pa-ll-output" });
    [el("label", { for: id }, text.label), input, el("p", { id: id + "-hint", class: "pa-ll-hint" }, text.hint),
     out, said].forEach(function (node) { root.appendChild(node); });

    function run() {
      var got = parse(m, input.value);
      if (got.error) {
        root.setAttribute("data-state", "invalid");
        input.setAttribute("aria-invalid", "true");
        out.classList.add("pa-ll-stale");
        said.className = "pa-ll-said pa-ll-error";
        said.textContent = got.error;
        return null;
      }
      var r = forward(m, p, got.ids), letters = function (ts) { return ts.map(function (t) { return m.letters[t]; }); };
      var shown = outputGrid(m, got.ids, r.predicted);
      root.setAttribute("data-state", "ok");
      root.setAttribute("data-predicted", letters(r.predicted).join(""));
      input.removeAttribute("aria-invalid");
      out.classList.remove("pa-ll-stale");
      out.textContent = "";
      out.appendChild(shown.grid);
      said.className = "pa-ll-said";
      said.textContent = fill(text.said, {
        out: letters(r.predicted).join(" "), right: shown.right, n: got.ids.length,
        last: m.letters[got.ids[got.ids.length - 1]], next: m.letters[r.predicted[r.predicted.length - 1]]
      });
      return { tokens: letters(got.ids), weights: r.weights };
    }

    /* The head view of the same task, drawn by headview.js, takes the new weights. */
    function update() {
      var r = run(), view = document.querySelector('[data-pa-headview="' + m.task + '"]');
      if (r && view && view.portattnHeadView) view.portattnHeadView.update(r.tokens, r.weights, m.colormap);
    }

    input.addEventListener("input", update);
    /* At load only the output: the head view already shows this sequence, as built. */
    run();
    window.portattnLearned = window.portattnLearned || { forward: {}, parse: {} };
    window.portattnLearned.forward[m.task] = function (ids) { return forward(m, p, ids); };
    window.portattnLearned.parse[m.task] = function (value) { return parse(m, value); };
  }

  window.portattnWidgets.start("[data-pa-learnedlive]", init);
})();
