// A stacked bar chart in SVG, drawn by hand: one bar per time bucket, one colour per series.

import { h, s } from "./dom.js";

const W = 640;
const H = 220;
const PAD = { left: 70, right: 8, top: 10, bottom: 28 };

function niceMax(value) {
  if (value <= 0) return 1;
  const exp = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * exp >= value) return step * exp;
  return 10 * exp;
}

// buckets: [{label, values: {series: number}}]; series: names in legend order.
export function stackedBars({ title, buckets, series, format }) {
  const totals = buckets.map((b) => series.reduce((sum, name) => sum + (b.values[name] || 0), 0));
  const top = niceMax(Math.max(0, ...totals));
  const plotW = W - PAD.left - PAD.right;
  const plotH = H - PAD.top - PAD.bottom;
  const slot = plotW / Math.max(1, buckets.length);
  const barW = Math.max(2, slot * 0.7);
  const y = (v) => PAD.top + plotH - (v / top) * plotH;
  const grid = [0, 0.5, 1].map((f) => [
    s("line", { x1: PAD.left, x2: W - PAD.right, y1: y(top * f), y2: y(top * f), class: "grid" }),
    s("text", { x: PAD.left - 6, y: y(top * f) + 4, "text-anchor": "end", class: "axis" }, format(top * f)),
  ]);
  const bars = buckets.map((b, i) => {
    let base = 0;
    const x = PAD.left + i * slot + (slot - barW) / 2;
    const parts = series.map((name, n) => {
      const v = b.values[name] || 0;
      if (!v) return null;
      const rect = s("rect", { x, y: y(base + v), width: barW, height: y(base) - y(base + v), class: `c${n % 8}` }, s("title", null, `${b.label} · ${name}: ${format(v)}`));
      base += v;
      return rect;
    });
    const every = Math.ceil(buckets.length / 8);
    const label = i % every === 0 ? s("text", { x: x + barW / 2, y: H - 8, "text-anchor": "middle", class: "axis" }, b.label) : null;
    return [parts, label];
  });
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, class: "chart" }, grid, bars);
  const legend = h("ul", { class: "legend" }, series.map((name, n) => h("li", null, h("span", { class: `swatch c${n % 8}` }), name)));
  return h("figure", { class: "chart-box" }, h("figcaption", null, title), svg, legend);
}
