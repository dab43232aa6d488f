// Traffic: the stored requests, newest first, with filters and paging by cursor, kept live by
// the events; and the Routing view of one request.

import { api, get } from "./api.js";
import { badge, clear, errorBox, field, fmtAny, fmtMs, fmtNum, fmtTime, fmtUsd, h, section, table, tableRow } from "./dom.js";

const FILTERS = [
  ["key", "Key", "text"],
  ["model", "Model", "text"],
  ["provider", "Upstream", "text"],
  ["status", "Status", "text", "200, 4xx, 5xx, error"],
  ["since", "Since", "text", "30m, 24h, 7d or a date"],
  ["until", "Until", "text"],
  ["q", "Text", "search", "id, model, key, error code"],
];

function statusBadge(row) {
  if (row.running) return badge("running", "warn");
  if (row.cancelled) return badge("cancelled", "warn");
  const st = row.status;
  return badge(String(st ?? "—"), st >= 500 ? "bad" : st >= 400 ? "warn" : "ok");
}

const COLUMNS = [
  { title: "Time", cell: (r) => fmtTime(r.ts) },
  { title: "Id", cell: (r) => h("code", null, String(r.id).slice(-8)), cls: "mono" },
  { title: "Key", cell: (r) => r.key_name ?? r.key ?? "—" },
  { title: "Model", cell: (r) => r.model ?? "—" },
  { title: "Upstream", cell: (r) => r.provider ?? "—" },
  { title: "Status", cell: statusBadge },
  { title: "First content", cell: (r) => fmtMs(r.ttfb_ms), cls: "num" },
  { title: "Duration", cell: (r) => fmtMs(r.duration_ms), cls: "num" },
  { title: "Tokens in/out", cell: (r) => (r.running ? "—" : `${fmtNum(r.input_tokens)} / ${fmtNum(r.output_tokens)}`), cls: "num" },
  { title: "Cost", cell: (r) => (r.running ? "—" : `${fmtUsd(r.cost_micros)} (${r.cost_state ?? "—"})`), cls: "num" },
  { title: "Attempts", cell: (r) => (r.routing ? r.routing.attempts.length : "—"), cls: "num" },
  { title: "Error", cell: (r) => r.error_code ?? "" },
];

const open = (row) => {
  location.hash = `#/request/${encodeURIComponent(row.id)}`;
};

export function trafficPage(root, ctx) {
  const inputs = {};
  const form = h("form", { class: "filters", id: "traffic-filters" });
  const saved = JSON.parse(sessionStorage.getItem("twserve.traffic-filters") || "{}");
  for (const [name, label, type, hint] of FILTERS) {
    inputs[name] = h("input", { type, name, value: saved[name] || "", placeholder: hint || "" });
    form.appendChild(field(label, inputs[name]));
  }
  form.appendChild(h("div", { class: "buttons" }, h("button", { type: "submit" }, "Apply"), h("button", { type: "reset", class: "quiet" }, "Clear")));
  const state = h("p", { class: "muted", id: "traffic-state" });
  const out = h("div", { id: "traffic-table" });
  const more = h("button", { type: "button", class: "quiet", id: "traffic-more", hidden: true }, "Older requests");
  clear(root, h("h1", null, "Traffic"), form, state, out, more);

  let tbody = null;
  let next = null;
  const shown = new Set();
  let stopped = false;

  const filters = () => {
    const f = {};
    for (const [name] of FILTERS) if (inputs[name].value.trim()) f[name] = inputs[name].value.trim();
    return f;
  };
  const filtered = () => Object.keys(filters()).length > 0;

  function put(row, { top }) {
    const old = tbody.querySelector(`tr[data-id="${CSS.escape(row.id)}"]`);
    const tr = tableRow(COLUMNS, row, { onRow: open, rowClass: (r) => (r.running ? "running" : "") });
    tr.dataset.id = row.id;
    if (old) old.replaceWith(tr);
    else if (top) tbody.prepend(tr);
    else tbody.appendChild(tr);
    shown.add(row.id);
    const empty = out.querySelector(".empty");
    if (empty) empty.remove();
  }

  async function load(before) {
    const started = performance.now();
    try {
      const page = await get("/requests", { ...filters(), before, limit: 50 });
      const ms = Math.round(performance.now() - started);
      if (!before) {
        const t = table(COLUMNS, [], { empty: "No requests match." });
        clear(out, t);
        tbody = t.querySelector("tbody");
        shown.clear();
        if (!filtered()) for (const r of ctx.running.values()) put(runningRow(r), { top: true });
      }
      for (const row of page.requests) put(row, { top: false });
      next = page.next;
      more.hidden = !next;
      state.textContent = `${tbody.children.length} shown · first page in ${ms} ms · live`;
      state.dataset.ms = String(ms);
    } catch (err) {
      clear(out, errorBox(err));
    }
  }

  async function arrived(id, tries = 0) {
    // The row is written as the request ends; ask for it with the filters in force, so it
    // shows only when it matches them.
    if (stopped) return;
    try {
      const page = await get("/requests", { ...filters(), id, limit: 1 });
      if (page.requests.length) put(page.requests[0], { top: true });
      else if (tries < 4) setTimeout(() => arrived(id, tries + 1), 150 * (tries + 1));
      else if (shown.has(id)) tbody.querySelector(`tr[data-id="${CSS.escape(id)}"]`)?.remove();
    } catch (err) {
      /* the next event or a reload shows it */
    }
  }

  const listener = (e) => {
    if (!tbody) return;
    const { name, data } = e.detail;
    if ((name === "RequestStarted" || name === "RequestRouted") && !filtered()) {
      const r = ctx.running.get(data.id);
      if (r) put(runningRow(r), { top: !shown.has(data.id) });
    } else if (name === "RequestFinished" || name === "RequestFailed") {
      arrived(data.id);
    }
  };
  ctx.events.addEventListener("event", listener);

  form.addEventListener("submit", (e) => {
    e.preventDefault();
    sessionStorage.setItem("twserve.traffic-filters", JSON.stringify(filters()));
    load();
  });
  form.addEventListener("reset", () => {
    sessionStorage.removeItem("twserve.traffic-filters");
    setTimeout(load, 0);
  });
  more.addEventListener("click", () => next && load(next));
  load();
  return {
    leave() {
      stopped = true;
      ctx.events.removeEventListener("event", listener);
    },
  };
}

function runningRow(r) {
  const routed = r.routed || {};
  return { id: r.id, ts: r.ts, key_name: r.key, model: routed.model, provider: (routed.candidates || [])[0], running: true };
}

function facts(pairs) {
  return h(
    "dl",
    { class: "facts" },
    pairs.filter(Boolean).map(([k, v]) => [h("dt", null, k), h("dd", null, v ?? "—")]),
  );
}

function outcomeBadge(a) {
  const kind = a.outcome === "ok" ? "ok" : a.outcome === "failed" ? "bad" : "warn";
  return badge(a.outcome, kind);
}

const ATTEMPT_COLUMNS = [
  { title: "#", cell: (a) => a.n, cls: "num" },
  { title: "Upstream", cell: (a) => a.provider },
  { title: "Model sent", cell: (a) => a.model ?? "—" },
  { title: "Outcome", cell: outcomeBadge },
  { title: "Status", cell: (a) => a.status ?? "—", cls: "num" },
  { title: "Reason", cell: (a) => a.error ?? a.skipped ?? "—" },
  { title: "Time", cell: (a) => fmtMs(a.ms), cls: "num" },
  { title: "Queued", cell: (a) => fmtMs(a.queued_ms), cls: "num" },
  { title: "Retry", cell: (a) => a.retry ?? 0, cls: "num" },
  { title: "Back-off", cell: (a) => fmtMs(a.backoff_ms), cls: "num" },
  { title: "Resent", cell: (a) => a.resend ?? "—" },
  { title: "Effort", cell: (a) => (a.effort ? `asked ${a.effort.asked ?? "—"} → sent ${a.effort.sent ?? "—"} (${a.effort.reason ?? ""})` : "—") },
  { title: "Resumed from", cell: (a) => a.resumed_from ?? "—" },
  { title: "Usage", cell: (a) => (a.usage ? `${fmtNum(a.usage.input)} in / ${fmtNum(a.usage.output)} out` : "—") },
  { title: "Cost", cell: (a) => (a.cost_state ? `${fmtUsd(a.cost_micros)} (${a.cost_state})` : "—") },
];

export function requestPage(root, ctx) {
  const id = ctx.args[0];
  let stopped = false;
  const show = async () => {
    let row = null;
    try {
      const page = await get("/requests", { id, limit: 1 });
      row = page.requests[0] || null;
    } catch (err) {
      clear(root, h("h1", null, "Request"), errorBox(err));
      return;
    }
    if (stopped) return;
    if (!row) {
      const live = ctx.running.get(id);
      clear(root, h("h1", null, "Request ", h("code", null, id)), live ? runningView(live) : h("p", { class: "muted" }, "No stored request with this id (it may still be running, or be older than the store keeps)."));
      return;
    }
    clear(root, h("h1", null, "Request ", h("code", null, row.id)), routingView(row));
  };
  const runningView = (live) => {
    const routed = live.routed || {};
    const out = h("p", { class: "muted", id: "abort-result" });
    const abort = h("button", { type: "button", class: "danger", id: "abort" }, "Abort");
    abort.addEventListener("click", async () => {
      abort.disabled = true;
      try {
        await api("POST", `/requests/${encodeURIComponent(id)}/abort`);
        out.textContent = "Aborted: the client gets an error in its own format; the upstream is not blamed.";
      } catch (err) {
        clear(out, errorBox(err));
        abort.disabled = false;
      }
    });
    return [
      badge("running", "warn"),
      section("Routing so far", facts([
        ["Key", live.key],
        ["Path", live.path],
        ["Format", live.format],
        ["Model", routed.model],
        ["Route / rule", `${routed.route ?? "—"} / ${routed.rule ?? "—"}`],
        ["Group", routed.group],
        ["Candidates", fmtAny(routed.candidates)],
        ["Stayed on its upstream", routed.sticky ? `yes (${routed.sticky})` : "no"],
        ["Started", fmtTime(live.ts)],
      ])),
      h("div", { class: "buttons" }, abort),
      out,
    ];
  };
  const listener = (e) => {
    const { name, data } = e.detail;
    if (data.id === id && (name === "RequestFinished" || name === "RequestFailed" || name === "RequestRouted")) setTimeout(show, 100);
  };
  ctx.events.addEventListener("event", listener);
  show();
  return {
    leave() {
      stopped = true;
      ctx.events.removeEventListener("event", listener);
    },
  };
}

function routingView(row) {
  const r = row.routing || { attempts: [] };
  const attempts = r.attempts.map((a, i) => ({ ...a, n: i + 1 }));
  const sticky = r.sticky;
  return [
    h("p", null, statusBadge(row), " ", `${row.format} · ${row.path} · ${row.stream ? "streamed" : "not streamed"}`),
    section("Decision", facts([
      ["Route", r.route],
      ["Rule", r.rule],
      ["Group", r.group],
      ["Stayed on its upstream (affinity)", sticky ? fmtAny(sticky) : "no earlier upstream for this conversation"],
      ["Skipped", fmtAny(r.skipped)],
      ["Paused", fmtAny(r.paused)],
      ["Full", fmtAny(r.full)],
      ["Translated", fmtAny(row.translated)],
    ])),
    section(`Attempts (${attempts.length})`, table(ATTEMPT_COLUMNS, attempts, { empty: "No attempt (refused before routing)." })),
    section("Answer", facts([
      ["Status", String(row.status)],
      ["Error code", row.error_code],
      ["Cancelled", row.cancelled ? "yes" : "no"],
      ["Time to first content", fmtMs(row.ttfb_ms)],
      ["Duration", fmtMs(row.duration_ms)],
      ["Tokens", `${fmtNum(row.input_tokens)} in · ${fmtNum(row.output_tokens)} out · ${fmtNum(row.cache_read_tokens)} cache read · ${fmtNum(row.cache_write_tokens)} cache write · ${fmtNum(row.reasoning_tokens)} reasoning`],
      ["Cost", `${fmtUsd(row.cost_micros)} (${row.cost_state})`],
      ["Counted against limits", row.counted ? "yes" : "no"],
      ["x-request-id", h("code", null, row.id)],
      ["Client's correlation id", row.correlation_id],
      ["Key", row.key_name],
      ["At", fmtTime(row.ts)],
    ])),
  ];
}

