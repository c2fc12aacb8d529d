// The chat view: model picker, conversations, streamed answers with reasoning apart, images, settings.
import { ApiError, el, getJSON, request, sseEvents, toast } from "./api.js";
import * as store from "./convos.js";
import { render } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const CURRENT_SLOT = "localrun.current";

let convos = [];
let current = null;
let models = [];
let attachments = []; // [{name, url}] waiting to go with the next message
let running = null; // the AbortController of the answer streaming now

function save() {
  current.updated = Date.now();
  const note = store.saveAll(convos);
  if (note) toast(note);
  localStorage.setItem(CURRENT_SLOT, current.id);
}

function capsOf(model) {
  const entry = models.find((m) => m.id === model);
  if (!entry) return [];
  const caps = new Set(entry.capabilities || []);
  if (entry.modalities && entry.modalities.vision) caps.add("vision");
  return [...caps].filter((c) => c !== "multimodal" && c !== "completion");
}

function describeModel(m) {
  const caps = capsOf(m.id);
  const where = m.upstream ? " · " + m.owned_by + (m.upstream.health ? " (" + m.upstream.health + ")" : "") : "";
  return m.id + (caps.length ? " — " + caps.join(", ") : "") + where;
}

export async function refreshModels() {
  const data = await getJSON("/v1/models");
  models = data.data || [];
  const select = $("model");
  select.replaceChildren(...models.map((m) => el("option", { value: m.id, text: describeModel(m) })));
  if (!models.length) select.append(el("option", { value: "", text: "no models yet: pull one in Models" }));
  pickModel();
}

function pickModel() {
  const select = $("model");
  if (current.model && models.some((m) => m.id === current.model)) select.value = current.model;
  else if (models.length) current.model = select.value = models[0].id;
  const caps = capsOf(select.value);
  $("model-caps").textContent = caps.join(" · ");
  $("attach").title = caps.includes("vision")
    ? "Attach images (or paste or drop them)"
    : "This model is not listed as seeing images: the server will say if it refuses them";
}

// --- conversations -------------------------------------------------------------------------------

function listConvos() {
  const list = $("convo-list");
  const sorted = [...convos].sort((a, b) => b.updated - a.updated);
  list.replaceChildren(
    ...sorted.map((c) =>
      el(
        "li",
        {},
        el("button", {
          type: "button",
          text: c.title,
          title: c.title,
          "aria-current": c.id === current.id ? "true" : "false",
          onclick: () => open(c),
        }),
      ),
    ),
  );
}

function open(convo) {
  if (running) stop();
  current = convo;
  $("system").value = convo.system || "";
  $("temperature").value = convo.temperature ?? "";
  $("max-tokens").value = convo.max_tokens ?? "";
  $("stats").textContent = "";
  attachments = [];
  showAttachments();
  pickModel();
  localStorage.setItem(CURRENT_SLOT, convo.id);
  listConvos();
  showMessages();
  $("sidebar").classList.remove("open");
  $("prompt").focus();
}

function startNew() {
  const convo = store.newConversation($("model").value || null);
  convos.push(convo);
  open(convo);
}

// --- messages ------------------------------------------------------------------------------------

function statsText(s) {
  if (!s) return "";
  const parts = [s.completion_tokens + " tokens"];
  if (s.tps) parts.push(s.tps.toFixed(1) + " tokens/s");
  if (s.prompt_tokens !== undefined) parts.push(s.prompt_tokens + " prompt (" + (s.cached_tokens || 0) + " cached)");
  return parts.join(" · ");
}

function messageNode(m) {
  if (m.role === "user") {
    const node = el("div", { class: "msg user" });
    for (const url of m.images || []) {
      if (typeof url === "string" && url.startsWith("data:image/")) node.append(el("img", { class: "thumb", src: url, alt: "attached image" }));
      else if (url === "") node.append(el("span", { class: "muted", text: "[image dropped from storage] " }));
    }
    node.append(document.createTextNode(m.content));
    return node;
  }
  const node = el("div", { class: "msg assistant" + (m.error ? " error" : "") });
  fillAssistant(node, m);
  return node;
}

function fillAssistant(node, m) {
  node.classList.toggle("error", Boolean(m.error));
  const parts = [];
  if (m.reasoning) {
    const details = el("details", { class: "think" }, el("summary", { text: m.content || !running ? "Thinking" : "Thinking…" }));
    details.append(el("div", { text: m.reasoning }));
    const before = node.querySelector("details.think");
    if (before && before.open) details.open = true;
    parts.push(details);
  }
  const body = el("div", { class: "body" });
  body.append(render(m.content));
  parts.push(body);
  if (m.error) parts.push(el("div", { class: "error", text: m.error }));
  const meta = [statsText(m.stats), m.stopped ? "stopped" : ""].filter(Boolean).join(" · ");
  if (meta) parts.push(el("div", { class: "meta", text: meta }));
  node.replaceChildren(...parts);
}

function showMessages() {
  const box = $("messages");
  box.replaceChildren(...current.messages.map(messageNode));
  box.scrollTop = box.scrollHeight;
}

/** The conversation as OpenAI chat messages: failed turns left out, images as image_url parts. */
function wireMessages() {
  const out = [];
  if (current.system && current.system.trim()) out.push({ role: "system", content: current.system });
  for (const m of current.messages) {
    if (m.failed || m.error || (m.role === "assistant" && !m.content)) continue;
    const images = (m.images || []).filter((u) => u);
    if (m.role === "user" && images.length) {
      out.push({
        role: "user",
        content: [{ type: "text", text: m.content }, ...images.map((url) => ({ type: "image_url", image_url: { url } }))],
      });
    } else out.push({ role: m.role, content: m.content });
  }
  return out;
}

function numberOrNull(v) {
  return v === "" || v === null || v === undefined || Number.isNaN(Number(v)) ? null : Number(v);
}

async function send() {
  const text = $("prompt").value;
  if (running || (!text.trim() && !attachments.length)) return;
  const model = $("model").value;
  if (!model) {
    toast("Pick a model first (or pull one in Models).");
    return;
  }
  current.model = model;
  const user = { role: "user", content: text, images: attachments.map((a) => a.url) };
  if (!current.messages.length) current.title = store.titleFrom(text || "Image");
  current.messages.push(user);
  const answer = { role: "assistant", content: "", reasoning: "", model };
  current.messages.push(answer);
  $("prompt").value = "";
  attachments = [];
  showAttachments();
  save();
  listConvos();
  showMessages();
  const node = $("messages").lastElementChild;

  const body = { model, messages: wireMessages(), stream: true, stream_options: { include_usage: true } };
  const temperature = numberOrNull(current.temperature);
  const maxTokens = numberOrNull(current.max_tokens);
  if (temperature !== null) body.temperature = temperature;
  if (maxTokens !== null) body.max_tokens = maxTokens;

  running = new AbortController();
  $("messages").setAttribute("aria-busy", "true"); // screen readers hear the answer once, not each token
  $("stop").hidden = false;
  $("send").disabled = true;
  $("stats").textContent = "waiting for " + model + "…";
  const started = performance.now();
  let first = null;
  let usage = null;
  let pending = false;
  const repaint = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      fillAssistant(node, answer);
      const box = $("messages");
      box.scrollTop = box.scrollHeight;
    });
  };
  try {
    const response = await request("/v1/chat/completions", { method: "POST", body, signal: running.signal });
    for await (const event of sseEvents(response)) {
      if (event.error) throw new ApiError(event.error.message || String(event.error), 500);
      if (event.usage) usage = event.usage;
      const delta = event.choices && event.choices[0] && event.choices[0].delta;
      if (!delta) continue;
      const thought = delta.reasoning_content ?? delta.reasoning;
      if (thought) answer.reasoning += thought;
      if (delta.content) answer.content += delta.content;
      if ((thought || delta.content) && first === null) first = performance.now();
      if (first !== null) $("stats").textContent = "streaming…";
      repaint();
    }
  } catch (err) {
    if (err.name === "AbortError") answer.stopped = true;
    else {
      answer.error = err.message || String(err);
      user.failed = true;
    }
  } finally {
    const ended = performance.now();
    if (usage) {
      const gen = first === null ? 0 : (ended - first) / 1000;
      answer.stats = {
        completion_tokens: usage.completion_tokens,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: (usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens) || 0,
        tps: gen > 0 && usage.completion_tokens > 1 ? (usage.completion_tokens - 1) / gen : null,
        seconds: (ended - started) / 1000,
      };
    }
    running = null;
    $("messages").removeAttribute("aria-busy");
    $("stop").hidden = true;
    $("send").disabled = false;
    $("stats").textContent = statsText(answer.stats) || (answer.stopped ? "stopped" : answer.error ? "failed" : "");
    fillAssistant(node, answer);
    save();
  }
}

function stop() {
  if (running) running.abort();
}

// --- images --------------------------------------------------------------------------------------

function showAttachments() {
  $("attachments").replaceChildren(
    ...attachments.map((a, i) =>
      el(
        "figure",
        {},
        el("img", { src: a.url, alt: a.name }),
        el("figcaption", { text: a.name }),
        el("button", { type: "button", text: "Remove", "aria-label": "Remove " + a.name, onclick: () => dropAttachment(i) }),
      ),
    ),
  );
}

function dropAttachment(i) {
  attachments.splice(i, 1);
  showAttachments();
}

function addFiles(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) {
      toast(file.name + " is not an image");
      continue;
    }
    const reader = new FileReader();
    reader.onload = () => {
      attachments.push({ name: file.name || "pasted image", url: String(reader.result) });
      showAttachments();
    };
    reader.readAsDataURL(file);
  }
}

// --- wiring --------------------------------------------------------------------------------------

function setting(id, key, parse) {
  $(id).addEventListener("change", () => {
    current[key] = parse($(id).value);
    save();
  });
}

export function setupChat() {
  convos = store.loadAll();
  const wanted = localStorage.getItem(CURRENT_SLOT);
  current = convos.find((c) => c.id === wanted) || convos.sort((a, b) => b.updated - a.updated)[0];
  if (!current) {
    current = store.newConversation(null);
    convos.push(current);
  }
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && running) {
      e.preventDefault();
      stop();
    }
  });
  $("stop").addEventListener("click", stop);
  $("new-chat").addEventListener("click", startNew);
  $("model").addEventListener("change", () => {
    current.model = $("model").value;
    pickModel();
    save();
  });
  $("settings-toggle").addEventListener("click", () => {
    const box = $("settings");
    box.hidden = !box.hidden;
    $("settings-toggle").setAttribute("aria-expanded", String(!box.hidden));
  });
  setting("system", "system", (v) => v);
  setting("temperature", "temperature", numberOrNull);
  setting("max-tokens", "max_tokens", numberOrNull);
  $("rename").addEventListener("click", () => {
    const title = window.prompt("Rename this conversation", current.title);
    if (title && title.trim()) {
      current.title = title.trim().slice(0, 200);
      save();
      listConvos();
    }
  });
  $("delete").addEventListener("click", () => {
    if (!window.confirm("Delete “" + current.title + "”?")) return;
    convos = convos.filter((c) => c !== current);
    store.saveAll(convos);
    if (convos.length) open(convos.sort((a, b) => b.updated - a.updated)[0]);
    else startNew();
  });
  $("export").addEventListener("click", () => store.exportJSON(current));
  $("attach").addEventListener("click", () => $("file").click());
  $("file").addEventListener("change", () => {
    addFiles($("file").files);
    $("file").value = "";
  });
  $("prompt").addEventListener("paste", (e) => {
    const files = [...(e.clipboardData ? e.clipboardData.files : [])];
    if (files.length) {
      e.preventDefault();
      addFiles(files);
    }
  });
  const composer = $("composer");
  composer.addEventListener("dragover", (e) => {
    e.preventDefault();
    composer.classList.add("dragging");
  });
  composer.addEventListener("dragleave", () => composer.classList.remove("dragging"));
  composer.addEventListener("drop", (e) => {
    e.preventDefault();
    composer.classList.remove("dragging");
    addFiles(e.dataTransfer ? e.dataTransfer.files : []);
  });
  open(current);
}
