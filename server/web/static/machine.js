// The Models view: what this machine has (fit, size, capabilities), what is loaded, pulls with live
// progress, the upstreams and the mirror. Every action goes through the existing admin and Ollama routes.
import { el, getJSON, humanBytes, ndjson, postJSON, request, toast } from "./api.js";

const $ = (id) => document.getElementById(id);
let onChange = () => {};
let timer = 0;
let busy = false;

function table(headers, rows) {
  const t = el("table", { class: "grid" });
  const head = t.createTHead().insertRow();
  for (const h of headers) head.append(el("th", { text: h.text ?? h, class: h.class }));
  const body = t.createTBody();
  for (const cells of rows) {
    const tr = body.insertRow();
    cells.forEach((c, i) => {
      const td = el("td", { class: headers[i].class });
      td.append(c === null || c === undefined ? "—" : c);
      tr.append(td);
    });
  }
  return t;
}

function cacheSummary(cache) {
  // llama.cpp's prompt cache (manager.cache_stats): slots in use, tokens kept, RAM and disk tiers, reuse.
  if (!cache || typeof cache !== "object") return "—";
  const n = (k) => (typeof cache[k] === "number" ? cache[k] : null);
  const parts = [];
  if (n("slots") !== null) parts.push((n("slots_held") ?? 0) + "/" + n("slots") + " slots held, " + (n("slot_tokens") ?? 0) + " tokens");
  if (n("host_entries")) parts.push("RAM " + n("host_entries") + " (" + humanBytes(n("host_bytes")) + ")");
  if (n("disk_entries")) parts.push("disk " + n("disk_entries") + " (" + humanBytes(n("disk_bytes")) + ")");
  const reused = (n("reused_in_place") ?? 0) + (n("restored") ?? 0) + (n("disk_hits") ?? 0);
  if (reused) parts.push(reused + " reused");
  return parts.join(" · ") || "—";
}

async function act(label, fn) {
  if (busy) return;
  busy = true;
  $("conn").textContent = label + "…";
  try {
    await fn();
    $("conn").textContent = "";
  } catch (err) {
    $("conn").textContent = "";
    toast(label + " failed: " + err.message);
  } finally {
    busy = false;
    await refresh();
    onChange();
  }
}

function button(text, label, fn, danger = false) {
  return el("button", { type: "button", text, class: danger ? "danger" : undefined, "aria-label": label, onclick: () => act(label, fn) });
}

function showLoaded(status) {
  const rows = status.models.map((m) => [
    m.name,
    (m.runtime || "") + (m.device ? " · " + m.device : ""),
    humanBytes(m.memory_bytes),
    m.n_ctx ? m.n_ctx.toLocaleString("en") : null,
    String(m.n_slots ?? 1),
    m.in_flight + " / " + m.active,
    cacheSummary(m.cache),
    button("Unload", "Unload " + m.name, () => postJSON("/admin/unload", { model: m.name })),
  ]);
  $("loaded").replaceChildren(
    rows.length
      ? table(
          ["Model", { text: "Runtime", class: "wide" }, { text: "Memory", class: "num" }, { text: "Context", class: "num" },
            { text: "Parallel", class: "num wide" }, { text: "In flight / active", class: "num wide" },
            { text: "Prompt cache", class: "wide" }, ""],
          rows,
        )
      : el("p", { class: "muted", text: "Nothing is loaded: a model loads on its first request, or with Load below." }),
  );
  const ups = status.upstreams || [];
  $("upstreams").replaceChildren(
    ups.length
      ? table(
          ["Name", { text: "Address", class: "wide" }, "Health", { text: "In flight", class: "num" },
            { text: "Models", class: "num wide" }],
          ups.map((u) => [
            u.name,
            u.url,
            el("span", { class: "health-" + u.health, text: String(u.health ?? "—") + (u.detail ? " — " + u.detail : "") }),
            String(u.in_flight ?? 0),
            String((u.models || []).length),
          ]),
        )
      : el("p", { class: "muted", text: "No upstreams configured ([[upstreams]] in the config)." }),
  );
}

function showModels(library) {
  const rows = library.models.map((m) => {
    const fit = el("span", { class: "fit-" + (m.fit || "unknown"), text: m.fit || "no runtime", title: m.fit_reason || "" });
    const actions = el("div", { class: "row" });
    actions.append(
      m.loaded
        ? button("Unload", "Unload " + m.name, () => postJSON("/admin/unload", { model: m.name }))
        : button("Load", "Load " + m.name, () => postJSON("/admin/load", { model: m.name })),
      button("Remove", "Remove " + m.name, async () => {
        if (!window.confirm("Remove " + m.name + " from this machine?")) return;
        await request("/api/delete", { method: "DELETE", body: { model: m.name } });
      }, true),
    );
    return [
      m.name,
      [m.format, m.quant].filter(Boolean).join(" "),
      humanBytes(m.size),
      (m.capabilities || []).join(", ") || "—",
      fit,
      m.planned_ctx ? m.planned_ctx.toLocaleString("en") : null,
      actions,
    ];
  });
  $("models").replaceChildren(
    rows.length
      ? table(["Name", { text: "Format", class: "wide" }, { text: "Size", class: "num" }, { text: "Can", class: "wide" }, "Fit",
          { text: "Context", class: "num wide" }, ""], rows)
      : el("p", { class: "muted", text: "No models yet: pull one above." }),
  );
  const hub = library.hub;
  $("hubinfo").textContent = "From " + hub.endpoint + (hub.offline ? " (offline: only what is cached)" : "");
  const mirror = library.mirror;
  $("mirror").textContent = mirror.enabled
    ? "On: other machines pull from this one with HF_ENDPOINT=" + location.origin + " (" + mirror.hub_models + " pulled from a hub)."
    : "Off (start with `localrun serve --mirror` to share this machine's models).";
}

export async function refresh() {
  try {
    const [status, library] = await Promise.all([getJSON("/admin/status"), getJSON("/admin/models")]);
    showLoaded(status);
    showModels(library);
  } catch (err) {
    toast("Could not read the machine's state: " + err.message);
  }
}

async function pull(ref) {
  const box = el("div", { class: "pull" });
  const label = el("div", { text: ref + ": starting" });
  const bar = el("progress", { max: "1", value: "0", "aria-label": "Pull progress of " + ref });
  box.append(label, bar);
  $("pulls").prepend(box);
  try {
    const response = await request("/api/pull", { method: "POST", body: { model: ref, stream: true } });
    for await (const line of ndjson(response)) {
      if (line.error) throw new Error(typeof line.error === "string" ? line.error : line.error.message);
      let text = ref + ": " + line.status;
      if (line.total) {
        bar.max = line.total;
        bar.value = line.completed || 0;
        text += " — " + humanBytes(line.completed || 0) + " of " + humanBytes(line.total);
      }
      if (line.status === "success") {
        bar.max = 1;
        bar.value = 1;
        text = ref + ": done";
      }
      label.textContent = text;
    }
  } catch (err) {
    label.textContent = ref + ": failed — " + err.message;
    label.className = "error";
  }
  await refresh();
  onChange();
}

export function setupMachine(changed) {
  onChange = changed;
  $("pullform").addEventListener("submit", (e) => {
    e.preventDefault();
    const ref = $("pullref").value.trim();
    if (ref) pull(ref);
    $("pullref").value = "";
  });
}

/** Refresh now and every few seconds while the view is shown; stop when hidden. */
export function watch(on) {
  clearInterval(timer);
  if (!on) return;
  refresh();
  timer = setInterval(() => {
    if (!document.hidden && !busy) refresh();
  }, 4000);
}
