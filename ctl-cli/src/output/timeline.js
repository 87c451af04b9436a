// The timeline page's hover and zoom (`record -o FILE.html`; timeline.rs
// embeds this file and the samples as JSON). The chart is drawn by
// memshim-ctl; this only stretches its lines in time (#plot), draws the
// time axis again (#x-axis), and shows the values of the nearest sample.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var chart = document.getElementById("chart");
  var svg = chart.querySelector("svg");
  var plot = svg.querySelector("#plot");
  var axis = svg.querySelector("#x-axis");
  var tip = document.getElementById("tip");
  var reset = document.getElementById("reset-zoom");
  var g = data.geometry;
  var ts = data.t;
  var tMax = Math.max(ts.length ? ts[ts.length - 1] : 0, 0.001);
  var view = [0, tMax];
  var NS = "http://www.w3.org/2000/svg";

  function el(name, attrs) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  var cursor = el("line", { id: "cursor", y1: g.top, y2: g.top + g.height,
                            stroke: "#444", "stroke-width": 1, visibility: "hidden" });
  var band = el("rect", { id: "zoom-band", y: g.top, height: g.height,
                          fill: "#4682b4", "fill-opacity": 0.15, visibility: "hidden" });
  svg.appendChild(band);
  svg.appendChild(cursor);

  // Client coordinates to the chart's own.
  function svgX(ev) {
    var p = svg.createSVGPoint();
    p.x = ev.clientX;
    p.y = ev.clientY;
    return p.matrixTransform(svg.getScreenCTM().inverse());
  }
  function inPlot(p) {
    return p.x >= g.left && p.x <= g.left + g.width && p.y >= g.top && p.y <= g.top + g.height;
  }
  function tOf(x) { return view[0] + (x - g.left) / g.width * (view[1] - view[0]); }
  function xOf(t) { return g.left + (t - view[0]) / (view[1] - view[0]) * g.width; }

  // The same round steps as timeline.rs's tick_step.
  function tickStep(span, n) {
    if (span <= 0) return 1;
    var raw = span / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    var units = [1, 2, 5, 10];
    for (var i = 0; i < units.length; i++) if (units[i] * mag >= raw) return units[i] * mag;
    return 10 * mag;
  }
  function drawAxis() {
    while (axis.firstChild) axis.removeChild(axis.firstChild);
    var step = tickStep(view[1] - view[0], 8);
    var digits = step >= 1 ? 0 : Math.min(3, Math.ceil(-Math.log10(step)));
    var y = g.top + g.height;
    for (var t = Math.ceil(view[0] / step - 1e-9) * step; t <= view[1] + step * 1e-6; t += step) {
      var x = xOf(t);
      axis.appendChild(el("line", { x1: x, y1: y, x2: x, y2: y + 5, stroke: "#999" }));
      var label = el("text", { x: x, y: y + 18, "text-anchor": "middle" });
      label.textContent = t.toFixed(digits) + "s";
      axis.appendChild(label);
    }
  }
  function apply() {
    // x' = a x + b maps the whole run's x onto the view's.
    var span = view[1] - view[0];
    var a = tMax / span;
    var b = g.left - g.left * a - g.width * view[0] / span;
    plot.setAttribute("transform", "matrix(" + a + ",0,0,1," + b + ",0)");
    drawAxis();
    unhover(); // its line was placed for the old view
    reset.style.display = (view[0] > 0 || view[1] < tMax) ? "" : "none";
  }

  function nearest(t) {
    var best = -1;
    for (var k = 0; k < ts.length; k++) {
      if (ts[k] < view[0] || ts[k] > view[1]) continue;
      if (best < 0 || Math.abs(ts[k] - t) < Math.abs(ts[best] - t)) best = k;
    }
    return best;
  }
  function hover(p, ev) {
    var k = nearest(tOf(p.x));
    if (k < 0) return unhover();
    var lines = [ts[k].toFixed(1) + " s"];
    data.series.forEach(function (s) { lines.push(s.name + ": " + (s.shown[k] || "–")); });
    tip.textContent = lines.join("\n");
    var box = chart.getBoundingClientRect();
    tip.style.left = (ev.clientX - box.left + 12) + "px";
    tip.style.top = (ev.clientY - box.top + 12) + "px";
    tip.style.display = "block";
    cursor.setAttribute("x1", xOf(ts[k]));
    cursor.setAttribute("x2", xOf(ts[k]));
    cursor.setAttribute("visibility", "visible");
  }
  function unhover() {
    tip.style.display = "none";
    cursor.setAttribute("visibility", "hidden");
  }

  var dragFrom = null;
  svg.addEventListener("mousedown", function (ev) {
    var p = svgX(ev);
    if (!inPlot(p)) return;
    dragFrom = p.x;
    ev.preventDefault();
  });
  svg.addEventListener("mousemove", function (ev) {
    var p = svgX(ev);
    if (dragFrom !== null) {
      var x0 = Math.max(g.left, Math.min(dragFrom, p.x));
      var x1 = Math.min(g.left + g.width, Math.max(dragFrom, p.x));
      band.setAttribute("x", x0);
      band.setAttribute("width", x1 - x0);
      band.setAttribute("visibility", "visible");
    }
    if (inPlot(p)) hover(p, ev); else unhover();
  });
  svg.addEventListener("mouseleave", unhover);
  window.addEventListener("mouseup", function (ev) {
    if (dragFrom === null) return;
    var x = Math.max(g.left, Math.min(g.left + g.width, svgX(ev).x));
    var from = dragFrom;
    dragFrom = null;
    band.setAttribute("visibility", "hidden");
    if (Math.abs(x - from) < 4) return; // a click, not a drag
    var a = tOf(Math.min(from, x)), b = tOf(Math.max(from, x));
    view = [a, b];
    apply();
  });
  function unzoom() { view = [0, tMax]; apply(); }
  svg.addEventListener("dblclick", unzoom);
  reset.addEventListener("click", unzoom);
  apply();
})();
