// Small DOM helpers: every text goes in as a text node (no innerHTML), so nothing a request or
// a config holds can become markup.

const SVG_NS = "http://www.w3.org/2000/svg";

function add(el, child) {
  if (child === null || child === undefined || child === false) return;
  if (Array.isArray(child)) {
    for (const c of child) add(el, c);
  } else if (child instanceof Node) {
    el.appendChild(child);
  } else {
    el.appendChild(document.createTextNode(String(child)));
  }
}

function build(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2), value);
    } else if (name === "class") {
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else if (name === "value" && "value" in el) {
      el.value = value;
    } else if (name === "checked" || name === "disabled" || name === "hidden") {
      el[name] = Boolean(value);
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
  add(el, children);
  return el;
}

export const h = (tag, attrs, ...children) => build(document.createElement(tag), attrs, children);
export const s = (tag, attrs, ...children) =>
  build(document.createElementNS(SVG_NS, tag), attrs, children);

export function clear(el, ...children) {
  el.replaceChildren();
  add(el, children);
  return el;
}

// A table of `rows` under `columns` ([{title, cell: row => node or text, cls}]) in a scroller.
export function table(columns, rows, { onRow, rowClass, empty = "Nothing yet." } = {}) {
  const head = h("tr", null, columns.map((c) => h("th", { class: c.cls }, c.title)));
  const body = h("tbody");
  for (const row of rows) body.appendChild(tableRow(columns, row, { onRow, rowClass }));
  const el = h("div", { class: "scroll" }, h("table", null, h("thead", null, head), body));
  if (!rows.length) el.appendChild(h("p", { class: "muted empty" }, empty));
  return el;
}

export function tableRow(columns, row, { onRow, rowClass } = {}) {
  const tr = h(
    "tr",
    { class: [onRow ? "link" : "", rowClass ? rowClass(row) : ""] },
    columns.map((c) => h("td", { class: c.cls }, c.cell(row))),
  );
  if (onRow) {
    tr.tabIndex = 0;
    tr.addEventListener("click", () => onRow(row));
    tr.addEventListener("keydown", (e) => e.key === "Enter" && onRow(row));
  }
  return tr;
}

export function field(label, input, hint) {
  return h("label", { class: "field" }, h("span", null, label), input, hint ? h("small", null, hint) : null);
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", null, title), children);
}

export function badge(text, kind) {
  return h("span", { class: ["badge", kind] }, text);
}

export function errorBox(err) {
  const code = err && err.code ? err.code : "error";
  return h("p", { class: "error", role: "alert" }, h("code", null, code), " ", err.message || String(err));
}

const pad = (n) => String(n).padStart(2, "0");

export function fmtTime(ts) {
  if (ts === null || ts === undefined) return "—";
  const d = new Date(ts * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

export const fmtMs = (ms) => (ms === null || ms === undefined ? "—" : `${ms} ms`);
export const fmtNum = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en-US"));
export const fmtPct = (x) => (x === null || x === undefined ? "—" : `${Math.round(x * 1000) / 10} %`);

export function fmtUsd(micros) {
  if (micros === null || micros === undefined) return "—";
  const usd = micros / 1e6;
  return "$" + (usd < 0.01 && usd > 0 ? usd.toFixed(6) : usd.toFixed(4));
}

// A value of any JSON shape as short text ({asked: high, sent: medium}).
export function fmtAny(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value !== "object") return String(value);
  if (Array.isArray(value)) return value.length ? value.map(fmtAny).join(", ") : "—";
  return Object.entries(value)
    .map(([k, v]) => `${k}: ${fmtAny(v)}`)
    .join("; ");
}
