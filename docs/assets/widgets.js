/* What the site's widgets share. Plain JavaScript, no dependencies.
 *
 * mkdocs.yml loads this before the other scripts, which take from
 * window.portattnWidgets their HTML and SVG element builders, their text
 * templates, their start once the page is parsed, and the token grid with its
 * cell colours, so that every grid is laid out, colours a weight and picks its
 * ink by the same rule.
 */
(function () {
  "use strict";

  /* An element with its attributes and, if given, its text: HTML by el, SVG by svg. */
  function dress(node, attrs, text) {
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }
  function el(tag, attrs, text) { return dress(document.createElement(tag), attrs, text); }
  function svg(tag, attrs, text) {
    return dress(document.createElementNS("http://www.w3.org/2000/svg", tag), attrs, text);
  }

  /* A text of the page's words with each {name} replaced by values[name]. */
  function fill(template, values) {
    return template.replace(/\{(\w+)\}/g, function (_, k) { return values[k]; });
  }

  /* A weight in [0, 1] as its colormap entry, with black or white ink, whichever reads on it. */
  function colour(map, w) {
    var entry = map[Math.min(map.length - 1, Math.max(0, Math.round(w * (map.length - 1))))];
    var r = parseInt(entry.slice(1, 3), 16) / 255;
    var g = parseInt(entry.slice(3, 5), 16) / 255;
    var b = parseInt(entry.slice(5, 7), 16) / 255;
    var luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    return { fill: entry, ink: luminance > 0.45 ? "#000000" : "#ffffff" };
  }

  /* The token-by-token table of the heatmap, the playground and the live head:
   * a caption, a header row of keys, and per query a row whose header cell
   * rowHead(th, token, i) fills (the token as text when none is given), then
   * one empty cell per key, marked with its row and column, for the caller to
   * paint. */
  function grid(cls, text, tokens, rowHead) {
    var table = el("table", { class: cls });
    table.appendChild(el("caption", { class: "pa-hm-caption" }, text.caption));
    var thead = el("thead"), head = el("tr"), tbody = el("tbody");
    head.appendChild(el("td", { class: "pa-hm-corner" }, text.corner));
    tokens.forEach(function (t) { head.appendChild(el("th", { scope: "col" }, t)); });
    thead.appendChild(head);
    var rows = [], cells = [];
    tokens.forEach(function (t, i) {
      var tr = el("tr"), th = el("th", { scope: "row" });
      if (rowHead) rowHead(th, t, i);
      else th.textContent = t;
      tr.appendChild(th);
      cells.push(tokens.map(function (_, j) {
        return tr.appendChild(el("td", { class: "pa-hm-cell", "data-row": String(i), "data-col": String(j) }));
      }));
      tbody.appendChild(tr);
      rows.push(tr);
    });
    table.appendChild(thead);
    table.appendChild(tbody);
    return { table: table, tbody: tbody, rows: rows, cells: cells };
  }

  /* init(element) on every element that matches selector, once the page is parsed. */
  function start(selector, init) {
    function boot() { document.querySelectorAll(selector).forEach(init); }
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", boot);
    else boot();
  }

  window.portattnWidgets = { el: el, svg: svg, fill: fill, colour: colour, grid: grid, start: start };

  /* A table wider than its box scrolls sideways; say so above it, in the
     page's language, and keep saying so while it does (resizes included). */
  var CUE = { en: "Scroll sideways for more columns \u2192", ja: "横にスクロールすると続きの列がある \u2192" };

  function markScrolling() {
    var lang = (document.documentElement.lang || "en").slice(0, 2) === "ja" ? "ja" : "en";
    /* Material wraps a table in a scrolling box, but the table scrolls itself
       too (overflow: auto): whichever of the two overflows gets the mark, and
       the cue goes above the outer box. */
    var boxes = ".md-typeset__scrollwrap, .pa-table-wrap, article table";
    document.querySelectorAll(boxes).forEach(function (box) {
      var scrolls = box.scrollWidth > box.clientWidth + 1;
      /* an attribute, not a class: Material styles tables by table:not([class]) */
      if (scrolls) box.setAttribute("data-pa-scrolls", "");
      else box.removeAttribute("data-pa-scrolls");
    });
    document.querySelectorAll(".md-typeset__scrollwrap, .pa-table-wrap").forEach(function (wrap) {
      var scrolls = wrap.hasAttribute("data-pa-scrolls") || !!wrap.querySelector("[data-pa-scrolls]");
      var cue = wrap.previousElementSibling;
      var has = cue && cue.classList.contains("pa-scroll-cue");
      if (scrolls && !has) wrap.parentNode.insertBefore(el("p", { "class": "pa-scroll-cue" }, CUE[lang]), wrap);
      if (!scrolls && has) cue.remove();
    });
  }

  /* Display formulas wider than the column (phones) are scaled down to fit,
     never below 60 %; what still does not fit scrolls inside its box. */
  function fitMaths() {
    document.querySelectorAll(".pa-math-block").forEach(function (box) {
      var math = box.querySelector("math");
      if (!math) return;
      math.style.fontSize = "";
      var base = parseFloat(getComputedStyle(math).fontSize);
      /* The formula's own width is the box's scroll width (a block <math> is as
         wide as its box); shrink it in a few steps, not below 60 %. */
      for (var i = 0; i < 4 && box.scrollWidth > box.clientWidth + 1; i++) {
        var size = parseFloat(getComputedStyle(math).fontSize);
        var next = Math.max(0.6 * base, size * (box.clientWidth - 2) / box.scrollWidth);
        if (next >= size) break;
        math.style.fontSize = next + "px";
      }
    });
  }

  /* Search: the index holds both editions, so list the pages of the reader's
     language first (Material ranks by score alone), keeping each group's order. */
  function ownLanguageFirst(list) {
    var ja = (document.documentElement.lang || "").slice(0, 2) === "ja";
    var items = Array.prototype.slice.call(list.children);
    var mine = function (li) {
      var a = li.querySelector("a");
      var inJa = !!a && new URL(a.href, location.href).pathname.indexOf("/ja/") >= 0;
      return inJa === ja;
    };
    var sorted = items.filter(mine).concat(items.filter(function (li) { return !mine(li); }));
    if (sorted.some(function (li, i) { return li !== items[i]; }))
      sorted.forEach(function (li) { list.appendChild(li); });
  }

  function watchSearch() {
    var list = document.querySelector(".md-search-result__list");
    if (!list) return;
    new MutationObserver(function () { ownLanguageFirst(list); })
      .observe(list, { childList: true });
  }

  function layout() { fitMaths(); markScrolling(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watchSearch);
  else watchSearch();
  var pending = null;
  window.addEventListener("load", layout);
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(layout, 100);
  });
  if (document.readyState === "complete") layout();
})();
