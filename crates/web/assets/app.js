/* draftlens charts: turns <div class="chart" data-src="ID"> + <script type="application/json" id="ID">
 * into uPlot charts. No network, no build step; the same file is inlined into single-file reports. */
(function () {
  "use strict";

  function rgba(hex, a) {
    var h = hex.replace("#", "");
    var n = parseInt(h.length === 3 ? h.replace(/(.)/g, "$1$1") : h, 16);
    return "rgba(" + ((n >> 16) & 255) + "," + ((n >> 8) & 255) + "," + (n & 255) + "," + a + ")";
  }

  function fmt(v) {
    if (v === null || v === undefined || isNaN(v)) return "\u2014";
    var a = Math.abs(v);
    return a >= 1000 ? v.toFixed(0) : a >= 10 ? v.toFixed(2) : v.toFixed(3);
  }

  function build(el) {
    var src = document.getElementById(el.getAttribute("data-src"));
    if (!src) return;
    var d = JSON.parse(src.textContent);
    el.innerHTML = "";
    var width = Math.max(260, el.clientWidth || 560);
    var height = d.height || 250;
    var data = [d.x];
    var series = [{ label: d.xlabel }];
    var bands = [];
    var main = [];
    var bars = d.kind === "bars";
    d.series.forEach(function (s) {
      var idx = data.length;
      main.push({ idx: idx, label: s.label, color: s.color });
      data.push(s.values);
      series.push({
        label: s.label,
        stroke: s.color,
        width: bars ? 0 : 2,
        dash: s.dash ? [6, 4] : undefined,
        fill: bars ? rgba(s.color, 0.8) : undefined,
        paths: bars ? uPlot.paths.bars({ size: [0.92, 80], align: 0 }) : undefined,
        points: { show: !bars, size: 5, fill: s.color, stroke: s.color },
        spanGaps: false
      });
      if (s.lo && s.hi) {
        data.push(s.hi);
        series.push({ label: s.label + " (CI high)", stroke: "transparent", width: 0, points: { show: false } });
        data.push(s.lo);
        series.push({ label: s.label + " (CI low)", stroke: "transparent", width: 0, points: { show: false } });
        bands.push({ series: [idx + 1, idx + 2], fill: rgba(s.color, 0.15) });
      }
    });
    var readout = document.createElement("div");
    readout.className = "readout";
    readout.textContent = d.hint || "\u00a0";
    var xsplits = d.xsplits;
    var opts = {
      width: width,
      height: height,
      legend: { show: false },
      cursor: { drag: { x: false, y: false }, points: { size: 7 } },
      scales: {
        x: {
          time: false,
          range: d.xrange ? function () { return d.xrange; } : undefined
        },
        y: {
          range: function (u, min, max) {
            var lo = d.ymin !== undefined && d.ymin !== null ? d.ymin : min;
            var hi = d.ymax !== undefined && d.ymax !== null ? d.ymax : max + (max - lo) * 0.08;
            if (!(hi > lo)) hi = lo + 1;
            return [lo, hi];
          }
        }
      },
      axes: [
        {
          label: d.xlabel, stroke: "#687083", grid: { stroke: "#eef0f4" }, ticks: { stroke: "#e3e6ec" },
          // Every label when they fit, else every k-th (two-digit labels need ~30 px each).
          splits: xsplits ? function (u) {
            var w = Math.max(1, u.bbox.width / (uPlot.pxRatio || 1));
            var step = Math.max(1, Math.ceil(xsplits.length * 30 / w));
            return xsplits.filter(function (v, i) { return i % step === 0; });
          } : undefined,
          values: d.xlabels ? function (u, sp) { return sp.map(function (v) { return d.xlabels[String(v)] || ""; }); } : undefined
        },
        { label: d.ylabel, stroke: "#687083", grid: { stroke: "#eef0f4" }, ticks: { stroke: "#e3e6ec" }, size: 56 }
      ],
      series: series,
      bands: bands,
      hooks: {
        setCursor: [function (u) {
          var i = u.cursor.idx;
          if (i === null || i === undefined) { readout.textContent = d.hint || "\u00a0"; return; }
          var x = u.data[0][i];
          var parts = [];
          main.forEach(function (m) {
            var v = u.data[m.idx][i];
            if (v !== null && v !== undefined) parts.push(m.label + ": " + fmt(v));
          });
          var xl = d.xlabels && d.xlabels[String(Math.round(x))] !== undefined && bars ? d.xlabels[String(Math.round(x))] : fmt(x);
          readout.textContent = (d.xname || d.xlabel) + " " + xl + (parts.length ? " \u2014 " + parts.join(" \u00b7 ") : "");
        }]
      }
    };
    var plot = new uPlot(opts, data, el);
    el.appendChild(readout);
    el.setAttribute("data-drawn", "1");
    el._plot = plot;
  }

  function all() {
    var els = document.querySelectorAll(".chart[data-src]");
    for (var i = 0; i < els.length; i++) {
      try { build(els[i]); } catch (e) { els[i].textContent = "chart failed: " + e; }
    }
  }

  var last = window.innerWidth;
  window.addEventListener("resize", function () {
    if (Math.abs(window.innerWidth - last) < 40) return;
    last = window.innerWidth;
    all();
  });
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", all);
  else all();
})();
