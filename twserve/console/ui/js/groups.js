// Groups and routing: members with their weight and automatic factor, the strategy, and a
// dry run that shows the exact next upstream and why.

import { get } from "./api.js";
import { badge, clear, errorBox, field, fmtAny, fmtMs, fmtPct, h, section, table } from "./dom.js";

export function groupsPage(root) {
  const out = h("div", { id: "groups" });
  const model = h("input", { name: "model", required: true, placeholder: "the model a request names" });
  const key = h("input", { name: "key", placeholder: "a key's name (default_key when blank)" });
  const dialect = h("select", { name: "dialect" }, ["openai-chat", "openai-responses", "anthropic", "gemini"].map((d) => h("option", { value: d }, d)));
  const stream = h("input", { type: "checkbox", name: "stream" });
  const result = h("div", { id: "dryrun-result" });
  const form = h(
    "form",
    { class: "filters", id: "dryrun" },
    field("Model", model),
    field("Key", key),
    field("Format", dialect),
    h("label", { class: "check" }, stream, " streamed"),
    h("div", { class: "buttons" }, h("button", { type: "submit" }, "Dry run")),
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const r = await get("/dryrun", { model: model.value.trim(), key: key.value.trim(), dialect: dialect.value, stream: stream.checked ? 1 : "" });
      clear(result, dryrun(r));
    } catch (err) {
      clear(result, errorBox(err));
    }
  });
  clear(root, h("h1", null, "Groups and routing"), out, section("Dry run", form, result));

  get("/groups")
    .then(({ groups }) => {
      clear(
        out,
        groups.length
          ? groups.map((g) =>
              section(g.name, [
                h("p", null, `${g.type} · balance by ${g.balance_by}`, g.selected ? ` · selected ${g.selected}` : ""),
                table(
                  [
                    { title: "Member", cell: (m) => m.provider },
                    { title: "Weight", cell: (m) => m.weight, cls: "num" },
                    { title: "Automatic factor", cell: (m) => m.factor, cls: "num" },
                    { title: "Effective weight", cell: (m) => Math.round(m.weight * m.factor * 1000) / 1000, cls: "num" },
                  ],
                  g.members,
                ),
              ]),
            )
          : h("p", { class: "muted" }, "No groups in the config in force."),
      );
    })
    .catch((err) => clear(out, errorBox(err)));
}

function dryrun(r) {
  const why = r.denied
    ? `refused: ${r.deny_message}`
    : r.sticky
      ? `the conversation stays on ${r.sticky}`
      : r.waits
        ? "every candidate is full or paused: the request would wait"
        : `${r.next} leads ${r.group ? "group " + r.group : "the rule"} (${r.balance_by || r.group_type || r.target})`;
  return [
    h("p", { class: "next" }, "Next upstream: ", h("strong", { id: "dryrun-next" }, r.next ?? "none"), " — ", why),
    h("p", { class: "muted" }, `route ${r.route ?? "—"} · rule ${r.rule ?? "—"} · ${r.target}${r.group ? " " + r.group : ""}${r.held ? " · held" : ""}`),
    table(
      [
        { title: "Candidate", cell: (c) => c.provider },
        { title: "Model sent", cell: (c) => c.model },
        { title: "Weight", cell: (c) => c.weight ?? "—", cls: "num" },
        { title: "Factor", cell: (c) => c.balance_factor ?? "—", cls: "num" },
        { title: "Effective", cell: (c) => c.effective_weight ?? "—", cls: "num" },
        { title: "First content", cell: (c) => fmtMs(c.first_content_ms), cls: "num" },
        { title: "Success", cell: (c) => fmtPct(c.success_rate), cls: "num" },
        { title: "Slots", cell: (c) => `${c.in_flight} / ${c.max_concurrent ?? "∞"}`, cls: "num" },
        { title: "State", cell: (c) => (c.paused ? badge(`paused ${c.pause_reason || ""}`, "bad") : c.full ? badge("full", "warn") : c.sticky ? badge("sticky", "ok") : badge("ready", "ok")) },
      ],
      r.candidates,
      { empty: "No candidate." },
    ),
    r.skipped && r.skipped.length ? h("p", { class: "muted" }, "Skipped: ", fmtAny(r.skipped)) : null,
  ];
}
