/* What the site's widgets share. Plain JavaScript, no dependencies.
 *
 * mkdocs.yml loads this before heatmap.js and playground.js, which take
 * their element builder and cell colours from window.portattnWidgets, so
 * that both grids colour a weight, and pick its ink, by the same rule.
 */
(function () {
  "use strict";

  function el(tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /* A weight in [0, 1] as its colormap entry, with black or white ink, whichever reads on it. */
  function colour(map, w) {
    var fill = map[Math.min(map.length - 1, Math.max(0, Math.round(w * (map.length - 1))))];
    var r = parseInt(fill.slice(1, 3), 16) / 255;
    var g = parseInt(fill.slice(3, 5), 16) / 255;
    var b = parseInt(fill.slice(5, 7), 16) / 255;
    var luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b;
    return { fill: fill, ink: luminance > 0.45 ? "#000000" : "#ffffff" };
  }

  window.portattnWidgets = { el: el, colour: colour };
})();
