// The page's one door to the server: same-origin fetches, the API key as a header, streams read line by line.
//
// The key (when the server has one) lives in sessionStorage: this tab only, gone when it closes, never in
// a URL (URLs end up in logs, history and Referer headers). Every call sends it as `Authorization: Bearer`.

const KEY_SLOT = "localrun.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY_SLOT) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY_SLOT, key);
  else sessionStorage.removeItem(KEY_SLOT);
}

/** An error the server answered, with its message (OpenAI, Ollama or plain shape) and status. */
export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

function headers(extra) {
  const h = { Accept: "application/json", ...extra };
  const key = apiKey();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function errorOf(response) {
  let text = "";
  try {
    text = await response.text();
    const data = JSON.parse(text);
    const err = data.error;
    const msg = typeof err === "string" ? err : err && err.message ? err.message : data.message || data.detail;
    const hint = err && typeof err === "object" && err.hint ? " (" + err.hint + ")" : "";
    if (msg) return new ApiError(String(msg) + hint, response.status);
  } catch (_) {
    // not JSON: the text itself says it
  }
  return new ApiError(text.slice(0, 300) || response.status + " " + response.statusText, response.status);
}

/** A same-origin request; resolves to the response once it is OK, else throws ApiError with the server's words. */
export async function request(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }), signal };
  if (body !== undefined) init.body = JSON.stringify(body);
  init.credentials = "omit";
  init.cache = "no-store";
  const response = await fetch(path, init);
  if (response.status === 401) document.dispatchEvent(new CustomEvent("localrun:unauthorized"));
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJSON(path) {
  return (await request(path)).json();
}

export async function postJSON(path, body) {
  const response = await request(path, { method: "POST", body });
  const text = await response.text();
  return text ? JSON.parse(text) : {};
}

/** Whether the server wants a key and whether the one we hold opens it: /health answers anyone,
 *  but only a caller with the key (or a server without one) gets more than its status. */
export async function keyState() {
  const response = await fetch("/health", { headers: headers(), credentials: "omit", cache: "no-store" });
  if (!response.ok) throw await errorOf(response);
  const data = await response.json();
  return "version" in data ? "open" : "needs-key";
}

async function* lines(response, separator) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at;
    while ((at = buffer.indexOf(separator)) >= 0) {
      const part = buffer.slice(0, at);
      buffer = buffer.slice(at + separator.length);
      yield part;
    }
  }
  buffer += decoder.decode();
  if (buffer.trim()) yield buffer;
}

/** The JSON data of each server-sent event of a streamed answer, until `[DONE]`. */
export async function* sseEvents(response) {
  for await (const block of lines(response, "\n\n")) {
    const data = block
      .split("\n")
      .filter((l) => l.startsWith("data:"))
      .map((l) => l.slice(5).trimStart())
      .join("\n");
    if (!data) continue;
    if (data === "[DONE]") return;
    yield JSON.parse(data);
  }
}

/** Each JSON line of an NDJSON answer (Ollama's pull progress). */
export async function* ndjson(response) {
  for await (const line of lines(response, "\n")) {
    if (line.trim()) yield JSON.parse(line);
  }
}

export function humanBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  let v = Number(n);
  while (v >= 1000 && i < units.length - 1) {
    v /= 1000;
    i += 1;
  }
  return (i ? v.toFixed(v < 10 ? 1 : 0) : String(v)) + " " + units[i];
}

/** A DOM element with text (never HTML) and attributes; children appended in order. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) if (child) node.append(child);
  return node;
}

let toastTimer = 0;

export function toast(message) {
  const box = document.getElementById("toast");
  box.textContent = message;
  box.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (box.hidden = true), 6000);
}
