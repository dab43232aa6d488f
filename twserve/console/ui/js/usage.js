// Usage: cost and tokens over time by key, model or upstream — the figures of /usage, asked
// once per time bucket — and the totals of the whole span.

import { get } from "./api.js";
import { clear, errorBox, field, fmtNum, fmtUsd, h, section, table } from "./dom.js";
import { stackedBars } from "./chart.js";

const SPANS = {
  "24h": { secs: 86400, buckets: 12 },
  "7d": { secs: 7 * 86400, buckets: 7 },
  "30d": { secs: 30 * 86400, buckets: 15 },
};
const BY = { key: "Key", model: "Model", provider: "Upstream" };

function label(ts, span) {
  const d = new Date(ts * 1000);
  const pad = (n) => String(n).padStart(2, "0");
  return span === "24h" ? `${pad(d.getHours())}:${pad(d.getMinutes())}` : `${d.getMonth() + 1}/${d.getDate()}`;
}

export function usagePage(root) {
  const span = h("select", { name: "span" }, Object.keys(SPANS).map((k) => h("option", { value: k }, `last ${k}`)));
  const by = h("select", { name: "by" }, Object.entries(BY).map(([k, v]) => h("option", { value: k }, v)));
  const form = h("form", { class: "filters", id: "usage-form" }, field("Span", span), field("By", by), h("div", { class: "buttons" }, h("button", { type: "submit" }, "Show")));
  const out = h("div", { id: "usage" });
  clear(root, h("h1", null, "Usage"), form, out);

  async function show() {
    const { secs, buckets } = SPANS[span.value];
    const group = by.value;
    const now = Date.now() / 1000;
    const width = secs / buckets;
    const starts = Array.from({ length: buckets }, (_, i) => now - secs + i * width);
    try {
      const [whole, ...parts] = await Promise.all([
        get("/usage", { by: group, since: Math.floor(now - secs) }),
        ...starts.map((t) => get("/usage", { by: group, since: t.toFixed(3), until: (t + width).toFixed(3) })),
      ]);
      const names = whole.rows.map((r) => String(r[group] ?? "(none)"));
      const series = (measure) =>
        parts.map((p, i) => ({
          label: label(starts[i], span.value),
          values: Object.fromEntries(p.rows.map((r) => [String(r[group] ?? "(none)"), measure(r)])),
        }));
      clear(
        out,
        h(
          "div",
          { class: "charts" },
          stackedBars({ title: `Cost by ${BY[group].toLowerCase()}`, buckets: series((r) => r.cost_micros), series: names, format: fmtUsd }),
          stackedBars({ title: `Tokens by ${BY[group].toLowerCase()}`, buckets: series((r) => r.input_tokens + r.output_tokens), series: names, format: (v) => fmtNum(Math.round(v)) }),
        ),
        section(
          `Totals, last ${span.value}`,
          table(
            [
              { title: BY[group], cell: (r) => String(r[group] ?? "(none)") },
              { title: "Requests", cell: (r) => fmtNum(r.requests), cls: "num" },
              { title: "Errors", cell: (r) => fmtNum(r.errors), cls: "num" },
              { title: "Input tokens", cell: (r) => fmtNum(r.input_tokens), cls: "num" },
              { title: "Output tokens", cell: (r) => fmtNum(r.output_tokens), cls: "num" },
              { title: "Cost", cell: (r) => fmtUsd(r.cost_micros), cls: "num" },
              { title: "Unpriced / free / estimated", cell: (r) => `${r.unpriced_requests} / ${r.free_requests} / ${r.estimated_requests}`, cls: "num" },
            ],
            whole.rows,
            { empty: "No requests in this span." },
          ),
          h("p", { class: "muted" }, `Prices: ${whole.prices.package || "—"} ${whole.prices.version || ""}`),
        ),
      );
    } catch (err) {
      clear(out, errorBox(err));
    }
  }
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    show();
  });
  show();
}
