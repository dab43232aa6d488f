// Upstreams: each one's state, pause and resume, health figures, slots, and its models with
// where each figure came from; model specs editable.

import { api, get } from "./api.js";
import { badge, clear, errorBox, field, fmtMs, fmtNum, fmtPct, fmtTime, h, section, table } from "./dom.js";

const SOURCE = { manual: "set by hand", price_table: "price table" };

function figure(value, source) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "unknown");
  return [fmtNum(value), " ", h("small", { class: "muted" }, `(${SOURCE[source] || source})`)];
}

export function upstreamsPage(root, ctx) {
  const out = h("div", { id: "upstreams" });
  const note = h("div");
  clear(root, h("h1", null, "Upstreams"), note, out);
  let timer = null;

  async function refresh() {
    try {
      const [{ providers }, overview] = await Promise.all([get("/providers"), get("/overview")]);
      clear(out, providers.length ? providers.map((p) => card(p, overview)) : h("p", { class: "muted" }, "No upstreams in the config in force."));
    } catch (err) {
      clear(out, errorBox(err));
    }
  }

  async function write(method, path, body) {
    try {
      await api(method, path, body);
      clear(note);
      await refresh();
    } catch (err) {
      clear(note, errorBox(err));
    }
  }

  function card(p, overview) {
    const paused = p.paused_until !== null;
    const state = paused
      ? [badge("paused", "bad"), ` ${p.pause_reason || ""} until ${fmtTime(p.paused_until)} (${Math.round(p.pause_left_secs)} s left) `, h("button", { type: "button", "data-action": "resume", onclick: () => write("PUT", "/provider-pause", { provider: p.name, paused: false }) }, "Resume")]
      : [badge("serving", "ok"), " ", h("button", { type: "button", class: "quiet", "data-action": "pause", onclick: () => write("PUT", "/provider-pause", { provider: p.name, paused: true, secs: 600 }) }, "Pause 10 min")];
    const models = table(
      [
        { title: "Model", cell: (m) => m.model },
        { title: "Offered", cell: (m) => (m.offered ? "yes" : "no") },
        { title: "Context window", cell: (m) => figure(m.context_window, m.context_window_source), cls: "num" },
        { title: "Output limit", cell: (m) => figure(m.max_output_tokens, m.max_output_tokens_source), cls: "num" },
        { title: "", cell: (m) => h("button", { type: "button", class: "quiet", onclick: () => editSpec(p.name, m) }, "Edit spec") },
      ],
      p.models,
      { empty: p.any_model ? "Any model (no list)." : "No models listed." },
    );
    const c = section(p.name, [
      h("p", { class: "state" }, state),
      h(
        "dl",
        { class: "facts" },
        [
          ["Protocol", p.protocol],
          ["Base URL", p.base_url],
          ["Key", p.has_key ? "set (not shown)" : "none"],
          ["Failures in a row", String(p.failures_in_row)],
          ["Success rate", `${fmtPct(p.success_rate)} of ${p.attempts} recent`],
          ["First content median", `${fmtMs(p.first_content_median_ms)} (${p.first_content_samples} samples)`],
          ["Slots", `${p.in_flight} in use / ${p.max_concurrent ?? "no limit"}`],
          ["Queue (all upstreams)", String(overview.upstreams.waiting)],
          ["Billing", `${p.billing}${p.price_sheet ? " · sheet " + p.price_sheet : ""}`],
        ].map(([k, v]) => [h("dt", null, k), h("dd", null, v)]),
      ),
      models,
      h("div", { class: "spec-form", id: `spec-${p.name}` }),
    ]);
    c.dataset.upstream = p.name;
    return c;
  }

  function editSpec(provider, m) {
    const box = document.getElementById(`spec-${provider}`);
    const ctxIn = h("input", { type: "number", min: 1, name: "context_window", value: m.context_window_source === "manual" ? m.context_window : "" });
    const outIn = h("input", { type: "number", min: 1, name: "max_output_tokens", value: m.max_output_tokens_source === "manual" ? m.max_output_tokens : "" });
    const num = (el) => (el.value ? Number(el.value) : undefined);
    const form = h(
      "form",
      { class: "inline" },
      h("strong", null, `Spec of ${m.model}`),
      field("Context window", ctxIn),
      field("Output limit", outIn),
      h("button", { type: "submit" }, "Save spec"),
      h("button", { type: "button", class: "quiet", onclick: () => write("PUT", "/provider-model-spec", { provider, model: m.model, clear: true }) }, "Clear spec"),
    );
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      write("PUT", "/provider-model-spec", { provider, model: m.model, context_window: num(ctxIn), max_output_tokens: num(outIn) });
    });
    clear(box, form);
  }

  const listener = (e) => {
    if (["HealthChanged", "ConfigReloaded"].includes(e.detail.name)) refresh();
  };
  ctx.events.addEventListener("event", listener);
  refresh();
  timer = setInterval(refresh, 5000);
  return {
    leave() {
      clearInterval(timer);
      ctx.events.removeEventListener("event", listener);
    },
  };
}
