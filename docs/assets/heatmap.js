/* The chapter's interactive heatmap. Plain JavaScript on docs/assets/widgets.js alone.
 *
 * The numbers come from portattn at build time (docs/_gen/sitegen/widget.py
 * writes them as JSON next to the widget); this script only draws them, lets
 * the reader switch the causal mask, and reads one row out as a sentence in
 * the words of portattn.chapter.describe_row.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var fill = window.portattnWidgets.fill;
  var colour = window.portattnWidgets.colour;

  /* "sat attends to The 3%, cat 26%, sat 71%": keys with weight exactly 0 are left out. */
  function sentence(text, tokens, state, i) {
    var parts = [];
    state.weights[i].forEach(function (w, j) {
      if (w !== 0) parts.push(tokens[j] + " " + state.percent[i][j] + "%");
    });
    return fill(text.attends, { q: tokens[i], parts: parts.join(", ") });
  }

  /* The colour scale under a grid: the colormap as a gradient, and the hatch
   * (left out when nothing is masked, as on the playground). Shared through
   * portattnWidgets, so every HTML grid on the site shows the same scale. */
  function scale(text, map, noMask) {
    var box = el("div", { class: "pa-hm-scale", "aria-hidden": "true" });
    var bar = el("span", { class: "pa-hm-scale-bar" });
    var stops = [];
    for (var k = 0; k <= 8; k++) stops.push(map[Math.round(k * (map.length - 1) / 8)]);
    bar.style.backgroundImage = "linear-gradient(to right, " + stops.join(", ") + ")";
    box.appendChild(el("span", {}, "0%"));
    box.appendChild(bar);
    box.appendChild(el("span", {}, "100%"));
    if (noMask) return box;
    box.appendChild(el("span", { class: "pa-hm-scale-mask" }));
    box.appendChild(el("span", {}, text.masked));
    return box;
  }
  window.portattnWidgets.scale = scale;

  function init(root) {
    var data = JSON.parse(root.querySelector(".pa-heatmap-data").textContent);
    var text = data.text;
    var live = root.querySelector(".pa-heatmap-live");
    var tokens = data.tokens;
    var n = tokens.length;
    var causal = true;
    var pinned = null;

    var toggle = el("button", {
      type: "button", role: "switch", "aria-checked": "true", class: "pa-hm-toggle"
    });
    toggle.appendChild(el("span", { class: "pa-hm-track", "aria-hidden": "true" }));
    toggle.appendChild(el("span", { class: "pa-hm-label" }, text.switch));
    var controls = el("div", { class: "pa-hm-controls" });
    controls.appendChild(toggle);

    var buttons = [];
    var g = window.portattnWidgets.grid("pa-hm-grid", text, tokens, function (th, t, i) {
      var button = el("button", {
        type: "button", class: "pa-hm-query", "data-row": String(i), "aria-pressed": "false"
      }, t);
      th.appendChild(button);
      buttons.push(button);
    });
    var table = g.table, tbody = g.tbody, rows = g.rows, cells = g.cells;
    rows.forEach(function (tr, i) { tr.setAttribute("data-row", String(i)); });

    var said = el("p", { class: "pa-hm-sentence", "aria-live": "polite" });

    live.appendChild(controls);
    live.appendChild(table);
    live.appendChild(scale(text, data.colormap));
    live.appendChild(said);

    function state() { return causal ? data.causal : data.full; }

    function draw() {
      var s = state();
      toggle.setAttribute("aria-checked", causal ? "true" : "false");
      root.classList.toggle("pa-hm-masked", causal);
      for (var i = 0; i < n; i++) {
        for (var j = 0; j < n; j++) {
          var w = s.weights[i][j];
          var td = cells[i][j];
          var hidden = causal && j > i;
          td.setAttribute("data-weight", String(w));
          td.setAttribute("data-percent", String(s.percent[i][j]));
          td.classList.toggle("pa-hm-hidden", hidden);
          if (hidden) {
            /* No inline colour here: the stylesheet's hatching must show. */
            td.style.backgroundColor = "";
            td.style.color = "";
            td.textContent = "—";
            td.setAttribute("aria-label", tokens[i] + " → " + tokens[j] + ": " + text.masked);
          } else {
            var c = colour(data.colormap, w);
            td.style.backgroundColor = c.fill;
            td.style.color = c.ink;
            td.textContent = s.percent[i][j] + "%";
            td.setAttribute("aria-label", tokens[i] + " → " + tokens[j] + ": " + s.percent[i][j] + "%");
          }
        }
      }
    }

    function show(i) {
      rows.forEach(function (tr, k) { tr.classList.toggle("pa-hm-active", k === i); });
      table.classList.toggle("pa-hm-focused", i !== null);
      said.textContent = "";
      if (i === null) {
        said.appendChild(el("span", { class: "pa-hm-hint" }, text.hint));
        return;
      }
      said.appendChild(el("span", { class: "pa-hm-said" }, sentence(text, tokens, state(), i)));
      if (causal && i < n - 1) {
        said.appendChild(el("span", { class: "pa-hm-note" }, fill(text.hidden, { q: tokens[i] })));
      }
    }

    function pin(i) {
      pinned = i;
      buttons.forEach(function (b, k) { b.setAttribute("aria-pressed", k === i ? "true" : "false"); });
      show(i);
    }

    function setMask(on) {
      if (on === causal) return;
      causal = on;
      draw();
      show(pinned);
    }

    /* The page's content tabs with the same titles show the same two states;
       keep them and the switch in step, whichever the reader uses. */
    function tabTitle(input) {
      var label = document.querySelector('label[for="' + input.id + '"]');
      return label ? label.textContent.trim() : null;
    }
    var tabs = data.tabs || {};
    toggle.addEventListener("click", function () {
      setMask(!causal);
      var want = causal ? tabs.on : tabs.off;
      var inputs = document.querySelectorAll(".tabbed-set > input");
      for (var k = 0; k < inputs.length; k++) {
        if (tabTitle(inputs[k]) === want) {
          if (!inputs[k].checked) inputs[k].click();
          break;
        }
      }
    });
    document.addEventListener("change", function (event) {
      var input = event.target;
      if (!input.matches || !input.matches(".tabbed-set > input") || !input.checked) return;
      var title = tabTitle(input);
      if (title === tabs.on) setMask(true);
      else if (title === tabs.off) setMask(false);
    });
    rows.forEach(function (tr, i) {
      tr.addEventListener("mouseenter", function () { show(i); });
    });
    tbody.addEventListener("mouseleave", function () { show(pinned); });
    buttons.forEach(function (b, i) {
      b.addEventListener("click", function () { pin(i); });
      b.addEventListener("focus", function () { pin(i); });
      b.addEventListener("keydown", function (event) {
        var next = null;
        if (event.key === "ArrowDown") next = Math.min(n - 1, i + 1);
        else if (event.key === "ArrowUp") next = Math.max(0, i - 1);
        else if (event.key === "Home") next = 0;
        else if (event.key === "End") next = n - 1;
        if (next !== null) {
          event.preventDefault();
          buttons[next].focus();
        }
      });
    });

    draw();
    show(null);
    root.classList.add("pa-heatmap-ready");
  }

  window.portattnWidgets.start("[data-pa-heatmap]", init);
})();
