/* The mask gallery (Programmable attention): point at or tap a cell of a mask
 * picture to read its query and key, whether the query sees the key, and the
 * tile around it with its kind. Everything shown comes from the JSON the page
 * carries (docs/_gen/sitegen/programmable.py computed it with portattn); the
 * script only finds the cell under the pointer. Plain JavaScript on
 * docs/assets/widgets.js alone.
 */
(function () {
  "use strict";

  var fill = window.portattnWidgets.fill;  // docs/assets/widgets.js

  var WORDS = {
    en: { kinds: ["empty", "partial", "full"], seen: "sees", hidden: "does not see",
          say: "{title}: query q_idx {q} {seen} key kv_idx {kv}; tile ({i}, {j}) is {kind}." },
    ja: { kinds: ["空", "一部", "満杯"], seen: "を見る", hidden: "を見ない",
          say: "{title}:クエリ q_idx {q} はキー kv_idx {kv} {seen}。タイル ({i}, {j}) は{kind}。" }
  };

  function sees(runs, kv) {
    return runs.some(function (r) { return kv >= r[0] && kv < r[1]; });
  }

  function setUp(figure) {
    var data = JSON.parse(figure.querySelector("script.pa-gallery-data").textContent);
    var words = WORDS[figure.dataset.lang] || WORDS.en;
    var readout = figure.querySelector(".pa-gallery-readout");
    data.panels.forEach(function (panel, k) {
      if (!panel) return;
      figure.querySelectorAll('image[id$="-pa-gallery-' + k + '"]').forEach(function (image) {
        image.style.cursor = "crosshair";
        var read = function (event) {
          var box = image.getBoundingClientRect();
          var q = Math.floor((event.clientY - box.top) / box.height * data.n);
          var kv = Math.floor((event.clientX - box.left) / box.width * data.n);
          if (q < 0 || kv < 0 || q >= data.n || kv >= data.n) return;
          var i = Math.floor(q / data.block), j = Math.floor(kv / data.block);
          var said = fill(words.say, {
            title: panel.title, q: q, kv: kv, i: i, j: j,
            seen: sees(panel.runs[q], kv) ? words.seen : words.hidden,
            kind: words.kinds[panel.kinds[i][j]]
          });
          readout.textContent = said;
          figure.dataset.cell = [k, q, kv].join(",");
        };
        image.addEventListener("pointermove", read);
        image.addEventListener("click", read);
      });
    });
  }

  window.portattnWidgets.start("figure.pa-gallery", setUp);
})();
