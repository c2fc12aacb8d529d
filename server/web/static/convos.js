// Conversations, kept in this browser's localStorage (never on the server): list, save, rename, delete, export.
//
// One key holds them all as JSON. A conversation: {id, title, model, system, temperature, max_tokens,
// updated, messages: [{role, content, reasoning?, images?: [dataURL], stats?, error?}]}.

const SLOT = "localrun.conversations";

export function loadAll() {
  try {
    const data = JSON.parse(localStorage.getItem(SLOT) || "[]");
    return Array.isArray(data) ? data.filter((c) => c && typeof c.id === "string" && Array.isArray(c.messages)) : [];
  } catch (_) {
    return [];
  }
}

/** Save every conversation; when the browser's quota is full, drop the attached images of the
 *  oldest ones first (their text is what matters) and say so. Returns a note, or "" when all fit. */
export function saveAll(convos) {
  const sorted = [...convos].sort((a, b) => b.updated - a.updated);
  try {
    localStorage.setItem(SLOT, JSON.stringify(sorted));
    return "";
  } catch (_) {
    for (let k = sorted.length - 1; k >= 0; k -= 1) {
      for (const m of sorted[k].messages) if (m.images) m.images = m.images.map(() => "");
      try {
        localStorage.setItem(SLOT, JSON.stringify(sorted));
        return "browser storage is full: images of older conversations were dropped";
      } catch (_e) {
        // keep dropping
      }
    }
    return "browser storage is full: this conversation is not saved";
  }
}

export function newConversation(model) {
  const id = "c" + Date.now().toString(36) + Math.random().toString(36).slice(2, 8);
  return { id, title: "New conversation", model, system: "", temperature: null, max_tokens: null, updated: Date.now(), messages: [] };
}

export function titleFrom(text) {
  const line = String(text).trim().split("\n")[0];
  return line.length > 48 ? line.slice(0, 47) + "…" : line || "Conversation";
}

export function exportJSON(convo) {
  const blob = new Blob([JSON.stringify(convo, null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = (convo.title.replace(/[^\w.-]+/g, "_").slice(0, 60) || "conversation") + ".json";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
