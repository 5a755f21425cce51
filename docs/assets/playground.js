/* The √d playground. Plain JavaScript on docs/assets/widgets.js alone.
 *
 * Every number comes from portattn at build time
 * (docs/_gen/sitegen/playground.py writes the grid as JSON next to the
 * widget); this script only picks the state the controls name and draws it.
 */
(function () {
  "use strict";

  var el = window.portattnWidgets.el;  // docs/assets/widgets.js
  var svg = window.portattnWidgets.svg;
  var colour = window.portattnWidgets.colour;

  var uid = 0;

  function radios(name, legend, options, checked) {
    var fs = el("fieldset", { class: "pa-pg-choice" });
    fs.appendChild(el("legend", {}, legend));
    options.forEach(function (o) {
      var id = "pa-pg-" + (uid++);
      var input = el("input", { type: "radio", name: name, value: o[0], id: id });
      if (o[0] === checked) input.checked = true;
      fs.appendChild(input);
      fs.appendChild(el("label", { for: id }, o[1]));
    });
    return fs;
  }

  function init(root) {
    var data = JSON.parse(root.querySelector(".pa-playground-data").textContent);
    var live = root.querySelector(".pa-playground-live");
    var text = data.text;
    var tokens = data.tokens;
    var n = tokens.length;
    var group = "pa-pg-" + (uid++);

    var controls = el("div", { class: "pa-pg-controls" });
    var sliderId = "pa-pg-d-" + (uid++);
    var sliderBox = el("div", { class: "pa-pg-slider" });
    var sliderLabel = el("label", { for: sliderId }, text.width + " ");
    var shown = el("output", { for: sliderId, class: "pa-pg-d" });
    sliderLabel.appendChild(shown);
    var slider = el("input", {
      type: "range", id: sliderId, min: "0", max: String(data.dims.length - 1), step: "1",
      value: String(data.dims.indexOf(64) >= 0 ? data.dims.indexOf(64) : 0)
    });
    sliderBox.appendChild(sliderLabel);
    sliderBox.appendChild(slider);
    controls.appendChild(sliderBox);
    controls.appendChild(radios(group + "-s", text.division,
      [["unscaled", text.unscaled], ["scaled", text.scaled]], "unscaled"));
    controls.appendChild(radios(group + "-i", text.init,
      [["constant", text.constant], ["scaled", text.unit]], "constant"));

    var g = window.portattnWidgets.grid("pa-hm-grid pa-pg-grid", text, tokens);
    var table = g.table, cells = g.cells;
    var sharp = el("p", { class: "pa-pg-sharp", "aria-live": "polite" });

    /* The curve: both columns of the √d measurement for the chosen initialisation. */
    var W = 340, H = 210, L = 58, R = 12, T = 12, B = 40;
    var plot = svg("svg", {
      viewBox: "0 0 " + W + " " + H, class: "pa-figure pa-pg-curve", role: "img",
      "aria-label": text.curve_y
    });
    var curves = svg("g", {});
    plot.appendChild(curves);

    live.appendChild(controls);
    var panes = el("div", { class: "pa-pg-panes" });
    var left = el("div", {}), right = el("div", {});
    left.appendChild(table);
    left.appendChild(window.portattnWidgets.scale(text, data.colormap, true));  // heatmap.js
    left.appendChild(sharp);
    right.appendChild(plot);
    panes.appendChild(left);
    panes.appendChild(right);
    live.appendChild(panes);

    function current() {
      var s = root.querySelector('input[name="' + group + '-s"]:checked').value;
      var i = root.querySelector('input[name="' + group + '-i"]:checked').value;
      return { d: data.dims[Number(slider.value)], scaled: s, init: i };
    }

    function x(d) {
      var lo = Math.log2(2), hi = Math.log2(512);
      return L + (Math.log2(d) - lo) / (hi - lo) * (W - L - R);
    }
    function y(v) { return T + (1 - v) * (H - T - B); }

    function drawCurve(c) {
      while (curves.firstChild) curves.removeChild(curves.firstChild);
      [0, 0.5, 1].forEach(function (v) {
        curves.appendChild(svg("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: "pa-pg-gridline" }));
        curves.appendChild(svg("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, v.toFixed(1)));
      });
      [2, 8, 32, 128, 512].forEach(function (d) {
        curves.appendChild(svg("text", { x: x(d), y: H - B + 16, "text-anchor": "middle" }, String(d)));
      });
      curves.appendChild(svg("text", { x: (L + W - R) / 2, y: H - 6, "text-anchor": "middle" }, text.curve_x));
      curves.appendChild(svg("text", {
        x: -(T + H - B) / 2, y: 14, "text-anchor": "middle", transform: "rotate(-90)"
      }, text.curve_y));
      curves.appendChild(svg("line", {
        x1: L, x2: W - R, y1: y(1 / data.seq_len), y2: y(1 / data.seq_len), class: "pa-pg-uniform"
      }));
      var curve = data.curves[c.init];
      ["unscaled", "scaled"].forEach(function (which) {
        var pts = curve.d.map(function (d, k) { return x(d) + "," + y(curve[which][k]); }).join(" ");
        curves.appendChild(svg("polyline", {
          points: pts, class: "pa-pg-line pa-pg-" + which + (which === c.scaled ? " pa-pg-chosen" : "")
        }));
      });
      var k = curve.d.indexOf(c.d);
      var v = curve[c.scaled][k];
      curves.appendChild(svg("circle", { cx: x(c.d), cy: y(v), r: 6, class: "pa-pg-dot" }));
      var label = (c.scaled === "scaled" ? text.scaled : text.unscaled) + ": " + v.toFixed(3);
      /* The curves rise with d: on the left half the label goes below the dot,
         where the line it extends over is higher; on the right half, above. */
      var right = x(c.d) > W / 2;
      curves.appendChild(svg("text", {
        x: right ? x(c.d) - 8 : x(c.d) + 8,
        y: right ? Math.max(y(v) - 12, T + 10) : Math.min(y(v) + 20, H - B - 4),
        "text-anchor": right ? "end" : "start", class: "pa-pg-dot-label"
      }, label));
    }

    function draw() {
      var c = current();
      shown.textContent = String(c.d);
      slider.setAttribute("aria-valuetext", "d = " + c.d);
      var s = data.states[c.init + "/" + c.d + "/" + c.scaled];
      for (var i = 0; i < n; i++) {
        for (var j = 0; j < n; j++) {
          var w = s.weights[i][j], col = colour(data.colormap, w), td = cells[i][j];
          td.style.backgroundColor = col.fill;
          td.style.color = col.ink;
          td.textContent = s.percent[i][j] + "%";
          td.setAttribute("data-weight", String(w));
        }
      }
      sharp.textContent = text.sharp.replace("{v}", s.sharpness.toFixed(3));
      root.setAttribute("data-state", c.init + "/" + c.d + "/" + c.scaled);
      drawCurve(c);
    }

    root.addEventListener("input", draw);
    root.addEventListener("change", draw);
    draw();
    root.classList.add("pa-playground-ready");
  }

  window.portattnWidgets.start("[data-pa-playground]", init);
})();
