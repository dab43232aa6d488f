// The control plane as the page speaks to it: the control key from this tab's sessionStorage in
// the Authorization header (never in a URL), JSON in and out, and /events read by fetch()
// streaming (EventSource cannot send a header).

const KEY = "twserve.control-key";

export function controlKey() {
  return sessionStorage.getItem(KEY);
}

export function setControlKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

export class ApiError extends Error {
  constructor(status, code, message, body) {
    super(message);
    this.status = status;
    this.code = code;
    this.body = body;
  }
}

function headers(json) {
  const out = { Authorization: "Bearer " + (controlKey() || ""), "X-Twserve-Console": "1" };
  if (json) out["Content-Type"] = "application/json";
  return out;
}

export const unauthorized = new EventTarget();

export async function api(method, path, body) {
  const resp = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  let data = null;
  try {
    data = await resp.json();
  } catch (err) {
    data = null;
  }
  if (!resp.ok) {
    const e = (data && data.error) || {};
    if (resp.status === 401) unauthorized.dispatchEvent(new Event("401"));
    throw new ApiError(resp.status, e.code || "http." + resp.status, e.message || resp.statusText, data);
  }
  return data;
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") q.set(name, String(value));
  }
  const text = q.toString();
  return text ? "?" + text : "";
}

export const get = (path, params = {}) => api("GET", path + query(params));

// One SSE frame's lines into {event, data, id}.
function parseFrame(frame) {
  let event = "message";
  let id = null;
  const data = [];
  for (const line of frame.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const at = line.indexOf(":");
    const field = at < 0 ? line : line.slice(0, at);
    let value = at < 0 ? "" : line.slice(at + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") event = value;
    else if (field === "data") data.push(value);
    else if (field === "id") id = value;
  }
  return data.length ? { event, id, data: data.join("\n") } : null;
}

// Follow /events until `signal` aborts; reconnects after a pause when the stream ends.
export async function follow(onEvent, signal, onState = () => {}) {
  while (!signal.aborted) {
    try {
      const resp = await fetch("/events", { headers: headers(false), signal, cache: "no-store" });
      if (!resp.ok) throw new ApiError(resp.status, "http." + resp.status, resp.statusText);
      onState(true);
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const frame = parseFrame(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
          if (frame) {
            let payload = null;
            try {
              payload = JSON.parse(frame.data);
            } catch (err) {
              payload = { raw: frame.data };
            }
            onEvent(frame.event, payload);
          }
        }
      }
    } catch (err) {
      if (signal.aborted) return;
      if (err instanceof ApiError && err.status === 401) {
        unauthorized.dispatchEvent(new Event("401"));
        return;
      }
    }
    onState(false);
    await new Promise((done) => setTimeout(done, 2000));
  }
}
