// Config: the file in an editor with line numbers; a check in the four stages whose problems
// show beside their lines; a diff before saving; history with rollback; safe mode explained.

import { api, get } from "./api.js";
import { badge, clear, errorBox, fmtTime, h, section, table } from "./dom.js";
import { hunks, lineDiff } from "./diff.js";

function diffView(before, after) {
  const d = hunks(lineDiff(before, after));
  if (!d.length) return h("p", { class: "muted" }, "No change.");
  return h(
    "pre",
    { class: "diff" },
    d.map((l) => h("div", { class: l.op === "+" ? "add" : l.op === "-" ? "del" : l.op === "…" ? "gap" : "same" }, l.op === "…" ? "…" : `${l.op} ${l.text}`)),
  );
}

export function configPage(root, ctx) {
  const safe = h("div", { id: "safe-mode" });
  const gutter = h("div", { class: "gutter", "aria-hidden": "true" });
  const notes = h("div", { class: "notes", id: "line-notes" });
  const text = h("textarea", { id: "config-text", spellcheck: "false", wrap: "off", "aria-label": "config file" });
  const editor = h("div", { class: "editor" }, gutter, text, notes);
  const result = h("div", { id: "config-result" });
  const review = h("div", { id: "config-review" });
  const check = h("button", { type: "button", class: "quiet", id: "config-check" }, "Check");
  const save = h("button", { type: "button", id: "config-save" }, "Review and save");
  const reload = h("button", { type: "button", class: "quiet" }, "Reload from the gateway");
  const history = h("div", { id: "config-history" });
  const meta = h("p", { class: "muted", id: "config-meta" });
  clear(root, h("h1", null, "Config"), safe, meta, editor, h("div", { class: "buttons" }, check, save, reload), result, review, section("History", history));

  let loaded = { yaml: "", version: null };
  let problems = new Map(); // line → [problem]

  function lines() {
    const n = text.value.split("\n").length;
    clear(
      gutter,
      Array.from({ length: n }, (_, i) => h("div", { class: problems.has(i + 1) ? "bad" : "", "data-line": i + 1 }, String(i + 1))),
    );
    clear(
      notes,
      Array.from({ length: n }, (_, i) => {
        const list = problems.get(i + 1);
        return h("div", { class: list ? "note bad" : "note", "data-line": i + 1 }, list ? list.map((p) => `${p.code}: ${p.message}`).join(" · ") : "");
      }),
    );
    gutter.scrollTop = notes.scrollTop = text.scrollTop;
  }
  text.addEventListener("input", () => {
    problems = new Map();
    lines();
  });
  text.addEventListener("scroll", () => {
    gutter.scrollTop = notes.scrollTop = text.scrollTop;
  });

  function showProblems(stage, list, title) {
    problems = new Map();
    for (const p of list) {
      const line = p.line || 1;
      if (!problems.has(line)) problems.set(line, []);
      problems.get(line).push(p);
    }
    lines();
    clear(
      result,
      h("div", { class: "error", role: "alert" }, title, ` (${stage} stage):`),
      h(
        "ul",
        { class: "problems", id: "problems" },
        list.map((p) => {
          const li = h("li", { class: "link" }, h("code", null, p.code), ` line ${p.line ?? "—"}: ${p.message}`);
          li.dataset.line = String(p.line ?? "");
          li.dataset.code = p.code;
          li.addEventListener("click", () => goTo(p.line));
          return li;
        }),
      ),
    );
  }

  function goTo(line) {
    if (!line) return;
    const all = text.value.split("\n");
    const start = all.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    text.focus();
    text.setSelectionRange(start, start + (all[line - 1] || "").length);
    const lh = parseFloat(getComputedStyle(text).lineHeight) || 18;
    text.scrollTop = Math.max(0, (line - 4) * lh);
  }

  async function load() {
    try {
      const [cfg, status] = await Promise.all([get("/config"), get("/status")]);
      loaded = cfg;
      text.value = cfg.yaml;
      problems = new Map();
      lines();
      clear(result);
      clear(review);
      meta.textContent = `${cfg.path} · ${cfg.version} · generation ${cfg.generation}`;
      const sm = status.safe_mode;
      if (sm) {
        clear(
          safe,
          h(
            "div",
            { class: "card safe" },
            h("h2", null, badge("safe mode", "bad"), " The gateway is not serving"),
            h("p", null, `The config file failed its ${sm.stage} stage when the gateway started, so only the control listener runs. Fix the problems below in the editor and save: a file that passes starts the gateway's port at once.`),
          ),
        );
        showProblems(sm.stage, sm.problems || [], "The file in force is refused");
      } else {
        clear(safe);
      }
    } catch (err) {
      clear(result, errorBox(err));
    }
    loadHistory();
  }

  async function loadHistory() {
    try {
      const { history: entries } = await get("/config/history");
      const rows = entries.slice().reverse();
      clear(
        history,
        table(
          [
            { title: "#", cell: (e) => e.number, cls: "num" },
            { title: "Applied", cell: (e) => fmtTime(e.applied_at) },
            { title: "Version", cell: (e) => h("code", null, e.version) },
            { title: "From", cell: (e) => e.origin },
            { title: "", cell: (e) => (e.current ? badge("current", "ok") : rollbackButton(e)) },
          ],
          rows,
          { empty: "No history yet." },
        ),
      );
    } catch (err) {
      clear(history, errorBox(err));
    }
  }

  function rollbackButton(e) {
    const b = h("button", { type: "button", class: "quiet", "data-rollback": e.number }, `Roll back to #${e.number}`);
    b.addEventListener("click", async () => {
      try {
        const entry = await get(`/config/history/${e.number}`);
        const go = h("button", { type: "button", id: "rollback-confirm" }, `Apply #${e.number}`);
        const cancel = h("button", { type: "button", class: "quiet" }, "Cancel");
        cancel.addEventListener("click", () => clear(review));
        go.addEventListener("click", async () => {
          try {
            const r = await api("POST", "/config/rollback", { number: e.number, base_version: loaded.version });
            await load();
            clear(result, h("p", { class: "ok", id: "saved" }, `Rolled back to #${e.number}: ${r.version}, generation ${r.generation}.`));
            ctx.refreshStatus();
          } catch (err) {
            showError(err);
          }
        });
        clear(review, section(`Roll back to #${e.number}: the change`, diffView(loaded.yaml, entry.yaml), h("div", { class: "buttons" }, go, cancel)));
      } catch (err) {
        clear(review, errorBox(err));
      }
    });
    return b;
  }

  function showError(err) {
    const e = err.body && err.body.error;
    if (e && e.problems) showProblems(e.stage, e.problems, "Refused; the config in force serves on");
    else clear(result, errorBox(err));
  }

  check.addEventListener("click", async () => {
    try {
      const r = await api("POST", "/config/check", { yaml: text.value });
      if (r.ok) {
        problems = new Map();
        lines();
        clear(result, h("p", { class: "ok", id: "check-ok" }, "The file passes all four stages (yaml, schema, consistency, runtime)."));
      } else {
        showProblems(r.stage, r.problems, "The file would be refused");
      }
    } catch (err) {
      showError(err);
    }
  });

  save.addEventListener("click", async () => {
    const go = h("button", { type: "button", id: "config-confirm" }, "Save");
    const cancel = h("button", { type: "button", class: "quiet" }, "Cancel");
    cancel.addEventListener("click", () => clear(review));
    go.addEventListener("click", async () => {
      go.disabled = true;
      try {
        const r = await api("PUT", "/config", { yaml: text.value, base_version: loaded.version });
        await load();
        clear(result, h("p", { class: "ok", id: "saved" }, `Saved and in force: ${r.version}, generation ${r.generation}.`));
        ctx.refreshStatus();
      } catch (err) {
        clear(review);
        if (err.code === "control.config.stale_version") clear(result, errorBox({ code: err.code, message: "the file changed since it was loaded; reload it and redo the edit" }));
        else showError(err);
      }
    });
    clear(review, section("Review the change", diffView(loaded.yaml, text.value), h("div", { class: "buttons" }, go, cancel)));
  });
  reload.addEventListener("click", load);
  load();
}
