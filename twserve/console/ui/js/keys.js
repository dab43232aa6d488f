// Keys: usage against every limit with its reset, unpriced models a cost-limited key can reach,
// and create (the secret shown once) / rotate / disable / edit / revoke.

import { api, get } from "./api.js";
import { badge, clear, errorBox, field, fmtNum, fmtTime, h, section, table } from "./dom.js";

function limitsText(limits) {
  // The written form of a key's limits, for the edit box: [{per, requests|tokens|cost}].
  return JSON.stringify(
    limits.map((l) => {
      const out = { per: l.per };
      out[l.measure] = l.amount;
      if (l.cache_reads) out.cache_reads = l.cache_reads;
      if (l.rolling) out.rolling = l.rolling;
      return out;
    }),
  );
}

function parseLimits(text) {
  const t = text.trim();
  if (!t) return [];
  const value = JSON.parse(t);
  if (!Array.isArray(value)) throw new Error("limits must be a JSON list");
  return value;
}

// "gpt-*, claude-*" → ["gpt-*", "claude-*"]; blank → null (every model).
function models(text) {
  const list = text.split(",").map((m) => m.trim()).filter(Boolean);
  return list.length ? list : null;
}

// An <input type=datetime-local> value (local time) → unix seconds; blank → null.
function when(value) {
  return value ? Math.floor(new Date(value).getTime() / 1000) : null;
}

function localInput(ts) {
  if (ts === null || ts === undefined) return "";
  const d = new Date(ts * 1000 - new Date().getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 16);
}

function usage(l) {
  const pct = Math.min(100, Math.round(l.percent ?? 0));
  const amount = l.measure === "cost" ? `$${l.amount}` : fmtNum(l.amount);
  const used = l.measure === "cost" ? `$${Number(l.used).toFixed(4)}` : fmtNum(l.used);
  return h(
    "div",
    { class: "limit" },
    h("span", null, `${l.per} ${l.measure}: ${used} / ${amount} (${pct} %)`),
    h("meter", { min: 0, max: 100, value: pct, low: 80, high: 99, optimum: 0 }),
    h("small", { class: "muted" }, `resets ${l.reset_local ?? "—"}`),
  );
}

export function keysPage(root) {
  const note = h("div", { id: "keys-note" });
  const out = h("div", { id: "keys" });
  const name = h("input", { name: "name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9_.@\\-]{0,63}" });
  const route = h("input", { name: "route", placeholder: "default route when blank" });
  const maxc = h("input", { name: "max_concurrent", type: "number", min: 1 });
  const limits = h("input", { name: "limits", placeholder: '[{"per": "day", "requests": 1000}]' });
  const allowed = h("input", { name: "allowed_models", placeholder: "every model when blank: gpt-*, claude-*" });
  const expires = h("input", { name: "expires_at", type: "datetime-local" });
  const create = h(
    "form",
    { class: "filters", id: "key-create" },
    field("Name", name),
    field("Route", route),
    field("Max concurrent", maxc),
    field("Limits (JSON)", limits),
    field("Allowed models", allowed),
    field("Expires", expires),
    h("div", { class: "buttons" }, h("button", { type: "submit" }, "Create key")),
  );
  clear(root, h("h1", null, "Keys"), note, out, section("New key", create));

  function secretOnce(title, body) {
    const value = h("input", { type: "text", readonly: true, value: body.key, class: "secret", id: "new-secret" });
    const copy = h("button", { type: "button", class: "quiet" }, "Copy");
    copy.addEventListener("click", () => navigator.clipboard && navigator.clipboard.writeText(body.key));
    const done = h("button", { type: "button", id: "secret-done" }, "I have saved it");
    done.addEventListener("click", () => {
      clear(note);
      refresh();
    });
    clear(note, h("div", { class: "card secret-once", role: "status" }, h("h2", null, title), h("p", null, "Shown once: the gateway keeps it and will not show it again."), h("div", { class: "inline" }, value, copy, done)));
    value.select();
  }

  async function write(method, path, body, after) {
    try {
      const answer = await api(method, path, body);
      if (after) after(answer);
      else clear(note);
      await refresh();
      return answer;
    } catch (err) {
      clear(note, errorBox(err));
      if (err.body && err.body.error && err.body.error.problems) {
        note.appendChild(h("ul", { class: "problems" }, err.body.error.problems.map((p) => h("li", null, h("code", null, p.code), ` line ${p.line}: ${p.message}`))));
      }
      return null;
    }
  }

  create.addEventListener("submit", (e) => {
    e.preventDefault();
    const body = { name: name.value.trim() };
    if (route.value.trim()) body.route = route.value.trim();
    if (maxc.value) body.max_concurrent = Number(maxc.value);
    if (models(allowed.value)) body.allowed_models = models(allowed.value);
    if (when(expires.value)) body.expires_at = when(expires.value);
    try {
      const l = parseLimits(limits.value);
      if (l.length) body.limits = l;
    } catch (err) {
      clear(note, errorBox({ code: "limits", message: err.message }));
      return;
    }
    write("POST", "/keys", body, (answer) => {
      create.reset();
      if (answer.shown_once) secretOnce(`Key ${answer.name} created`, answer);
      else clear(note, h("p", null, `Key ${answer.name} created; its secret is read from the environment.`));
    });
  });

  function editor(k) {
    const r = h("input", { name: "route", value: k.route || "" });
    const m = h("input", { name: "max_concurrent", type: "number", min: 1, value: k.max_concurrent ?? "" });
    const l = h("input", { name: "limits", value: limitsText(k.limits || []) });
    const a = h("input", { name: "allowed_models", value: (k.allowed_models || []).join(", ") });
    const x = h("input", { name: "expires_at", type: "datetime-local", value: localInput(k.expires_at) });
    const form = h(
      "form",
      { class: "inline" },
      field("Route", r),
      field("Max concurrent", m),
      field("Limits (JSON)", l),
      field("Allowed models", a),
      field("Expires", x),
      h("button", { type: "submit" }, "Save"),
    );
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      let parsed;
      try {
        parsed = parseLimits(l.value);
      } catch (err) {
        clear(note, errorBox({ code: "limits", message: err.message }));
        return;
      }
      write("PATCH", `/keys/${encodeURIComponent(k.name)}`, {
        route: r.value.trim() || null,
        max_concurrent: m.value ? Number(m.value) : null,
        limits: parsed.length ? parsed : null,
        allowed_models: models(a.value),
        expires_at: when(x.value),
      });
    });
    return form;
  }

  function rotator(k) {
    const overlap = h("input", { name: "overlap_secs", type: "number", min: 1, placeholder: "none: the old secret stops at once" });
    const form = h("form", { class: "inline" }, field("Old secret still accepted for (seconds)", overlap), h("button", { type: "submit" }, "Rotate now"));
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      const body = overlap.value ? { overlap_secs: Number(overlap.value) } : undefined;
      write("POST", `/keys/${encodeURIComponent(k.name)}/rotate`, body, (a) => secretOnce(`Key ${k.name} rotated`, a));
    });
    return form;
  }

  function actions(k) {
    const edit = h("div", { class: "edit" });
    const revoke = h("button", { type: "button", class: "danger", "data-action": "revoke" }, "Revoke");
    revoke.addEventListener("click", () => {
      if (revoke.dataset.armed) write("DELETE", `/keys/${encodeURIComponent(k.name)}`).then((a) => a && clear(note, h("p", null, `Key ${k.name} revoked.`)));
      else {
        revoke.dataset.armed = "1";
        revoke.textContent = "Confirm revoke";
      }
    });
    return h(
      "div",
      { class: "actions" },
      h("button", { type: "button", class: "quiet", "data-action": "rotate", onclick: () => clear(edit, rotator(k)) }, "Rotate"),
      h("button", { type: "button", class: "quiet", "data-action": "disable", onclick: () => write("PATCH", `/keys/${encodeURIComponent(k.name)}`, { disabled: k.disabled ? null : true }) }, k.disabled ? "Enable" : "Disable"),
      h("button", { type: "button", class: "quiet", "data-action": "edit", onclick: () => clear(edit, editor(k)) }, "Edit"),
      revoke,
      edit,
    );
  }

  async function refresh() {
    try {
      const { keys, default_key } = await get("/keys");
      const t = table(
        [
          { title: "Name", cell: (k) => [k.name, k.name === default_key ? [" ", badge("default", "ok")] : null, k.disabled ? [" ", badge("disabled", "bad")] : null] },
          { title: "Key", cell: (k) => h("code", null, k.key) },
          { title: "Route", cell: (k) => k.route ?? "default" },
          { title: "Models", cell: (k) => (k.allowed_models ? k.allowed_models.join(", ") : "any") },
          {
            title: "Expires",
            cell: (k) => [
              k.expires_at ? (k.expired ? badge("expired", "bad") : fmtTime(k.expires_at)) : "never",
              k.previous_key_active ? h("div", null, h("small", { class: "muted" }, `old secret until ${fmtTime(k.previous_key_until)}`)) : null,
            ],
          },
          { title: "In flight", cell: (k) => `${k.in_flight} / ${k.max_concurrent ?? "∞"}`, cls: "num" },
          { title: "Limits", cell: (k) => (k.limits.length ? k.limits.map(usage) : h("span", { class: "muted" }, "none")) },
          { title: "Unpriced models", cell: (k) => (k.unpriced_models.length ? k.unpriced_models.map((u) => `${u.provider}/${u.model}`).join(", ") : "—") },
          { title: "", cell: actions },
        ],
        keys,
        { empty: "No keys." },
      );
      t.querySelectorAll("tbody tr").forEach((tr, i) => (tr.dataset.key = keys[i].name));
      clear(out, t);
    } catch (err) {
      clear(out, errorBox(err));
    }
  }
  refresh();
}
