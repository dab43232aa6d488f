// The console's shell: sign-in, the pages by the URL's #fragment, the status line, and one
// /events stream while the page is open, shared by every page.

import { ApiError, controlKey, follow, get, setControlKey, unauthorized } from "./api.js";
import { clear, errorBox, field, h } from "./dom.js";
import { configPage } from "./config.js";
import { groupsPage } from "./groups.js";
import { keysPage } from "./keys.js";
import { requestPage, trafficPage } from "./traffic.js";
import { upstreamsPage } from "./upstreams.js";
import { usagePage } from "./usage.js";

const PAGES = [
  ["traffic", "Traffic", trafficPage],
  ["upstreams", "Upstreams", upstreamsPage],
  ["groups", "Groups", groupsPage],
  ["keys", "Keys", keysPage],
  ["usage", "Usage", usagePage],
  ["config", "Config", configPage],
];

const main = document.getElementById("main");
const nav = document.getElementById("nav");
const banner = document.getElementById("banner");
const statusLine = document.getElementById("status");
const signout = document.getElementById("signout");

// The live events: pages subscribe while shown.
export const events = new EventTarget();
export const running = new Map(); // id → what the events told of a request still running
let following = null;
let current = null; // {leave} of the page shown

function onEvent(name, data) {
  if (name === "RequestStarted") running.set(data.id, { ...data, started: data.ts });
  else if (name === "RequestRouted" && running.has(data.id)) Object.assign(running.get(data.id), { routed: data });
  else if (name === "RequestFinished" || name === "RequestFailed" || name === "RequestAborted") running.delete(data.id);
  events.dispatchEvent(new CustomEvent("event", { detail: { name, data } }));
  if (name === "ConfigReloaded" || name === "ConfigRejected" || name === "HealthChanged") refreshStatus();
}

function startFollowing() {
  if (following) return;
  following = new AbortController();
  follow(onEvent, following.signal, (live) => statusLine.classList.toggle("offline", !live));
}

function stopFollowing() {
  if (following) following.abort();
  following = null;
  running.clear();
}

export function showBanner(nodes) {
  if (!nodes) {
    banner.hidden = true;
    banner.replaceChildren();
    return;
  }
  clear(banner, nodes);
  banner.hidden = false;
}

export async function refreshStatus() {
  try {
    const st = await get("/status");
    const cfg = st.config || {};
    clear(
      statusLine,
      h("span", null, `v${st.version}`),
      h("span", { title: cfg.config_version || "" }, ` · config #${cfg.generation}`),
      st.safe_mode ? h("span", { class: "badge bad" }, "safe mode") : null,
    );
    if (st.safe_mode) {
      const sm = st.safe_mode;
      showBanner([
        h("strong", null, "Safe mode: "),
        `the config file failed its ${sm.stage || "validation"} stage (`,
        h("code", null, sm.problem_code || sm.code),
        sm.line ? ` at line ${sm.line}` : "",
        `): ${sm.message || ""}. The gateway's port is not serving; only this console is. `,
        h("a", { href: "#/config" }, "Fix the file on the Config page"),
        ".",
      ]);
    } else {
      showBanner(null);
    }
    return st;
  } catch (err) {
    return null;
  }
}

function signInPage(message) {
  stopFollowing();
  signout.hidden = true;
  nav.replaceChildren();
  statusLine.replaceChildren();
  const input = h("input", { type: "password", name: "control-key", autocomplete: "current-password", required: true, id: "control-key" });
  const note = h("p", { class: "muted" }, "The key is kept in this tab only (sessionStorage) and sent in the Authorization header.");
  const out = h("div");
  if (message) out.appendChild(errorBox(message));
  const form = h(
    "form",
    { class: "card signin", id: "signin" },
    h("h1", null, "Sign in"),
    field("Control key (listen.control.key)", input),
    h("button", { type: "submit" }, "Sign in"),
    note,
    out,
  );
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    setControlKey(input.value.trim());
    try {
      await get("/status");
      input.value = "";
      if (!location.hash || location.hash === "#/signin") location.hash = "#/traffic";
      render();
    } catch (err) {
      setControlKey(null);
      clear(out, errorBox(err instanceof ApiError && err.status === 401 ? { code: err.code, message: "that is not the control key" } : err));
    }
  });
  clear(main, form);
  input.focus();
}

function renderNav(active) {
  clear(
    nav,
    PAGES.map(([id, title]) => h("a", { href: `#/${id}`, class: id === active ? "active" : "", "aria-current": id === active ? "page" : null }, title)),
  );
}

function render() {
  if (current && current.leave) current.leave();
  current = null;
  if (!controlKey()) {
    signInPage();
    return;
  }
  signout.hidden = false;
  startFollowing();
  refreshStatus();
  const [, page, ...rest] = (location.hash || "#/traffic").split("/");
  let found = PAGES.find(([id]) => id === page);
  let view;
  if (page === "request" && rest.length) {
    renderNav("traffic");
    view = requestPage;
  } else {
    if (!found) found = PAGES[0];
    renderNav(found[0]);
    view = found[2];
  }
  const root = h("div", { class: "page", id: `page-${page || "traffic"}` });
  clear(main, root);
  document.title = `twserve · ${found ? found[1] : "Request"}`;
  current = view(root, { events, running, refreshStatus, args: rest.map(decodeURIComponent) }) || null;
}

signout.addEventListener("click", () => {
  setControlKey(null);
  render();
});
unauthorized.addEventListener("401", () => {
  if (document.getElementById("signin")) return; // the form says so itself
  setControlKey(null);
  signInPage({ code: "control.auth.bad_key", message: "the control key was refused; sign in again" });
});
window.addEventListener("hashchange", render);
render();
