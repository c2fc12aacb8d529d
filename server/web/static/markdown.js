// A small Markdown renderer that builds DOM nodes, never HTML.
//
// Why not innerHTML and a sanitiser: model text is untrusted (a prompt can make a model say anything,
// and the fake runtime echoes it). Parsing Markdown into elements whose text is set with textContent
// means no string from the model is ever parsed as HTML, so `<script>`, `<img onerror>` or an event
// attribute can only ever appear as the characters they are. Links keep only http(s) and mailto
// targets (a `javascript:` or `data:` link becomes plain text), and Markdown images are shown as
// links, never loaded, so an answer cannot make the page fetch from another origin.
//
// What it understands: headings, paragraphs, fenced code blocks, block quotes, bullet and numbered
// lists, tables, rules; inline code, bold, italics, strike-through, links and images. Anything else
// is text. It is re-run on the whole answer as it streams, so unfinished constructs simply render as
// text until they close.

const FENCE = /^\s{0,3}(```|~~~)\s*([\w+#.-]*)/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const RULE = /^\s{0,3}([-*_])(\s*\1){2,}\s*$/;
const QUOTE = /^\s{0,3}>\s?/;
const ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const TABLE_SEP = /^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$/;
const INLINE =
  /(`+)([\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|~~(?=\S)([\s\S]*?\S)~~|\*(?=[^\s*])([^*]*?[^\s*])\*|\b_(?=[^\s_])([^_]*?[^\s_])_\b|!\[([^\]]*)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)|\[([^\]]+)\]\(\s*<?([^)\s>]*)>?(?:\s+"[^"]*")?\s*\)|<(https?:\/\/[^\s>]+)>/g;

/** The URL if it is one a link may point at (http, https, mailto, absolute), else null. */
export function safeHref(raw) {
  let url;
  try {
    url = new URL(raw);
  } catch (_) {
    return null;
  }
  return ["http:", "https:", "mailto:"].includes(url.protocol) ? url.href : null;
}

function link(text, href) {
  const safe = safeHref(href);
  if (!safe) return document.createTextNode(text === href ? text : text + " (" + href + ")");
  const a = document.createElement("a");
  a.href = safe;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  a.textContent = text;
  return a;
}

function wrap(tag, text) {
  const node = document.createElement(tag);
  inline(node, text);
  return node;
}

/** Append the inline Markdown of `text` to `parent`, as text nodes and elements. */
export function inline(parent, text) {
  const re = new RegExp(INLINE.source, "g"); // its own lastIndex: wrap() recurses into inline()
  let last = 0;
  let m;
  while ((m = re.exec(text)) !== null) {
    if (m.index > last) parent.append(text.slice(last, m.index));
    last = re.lastIndex;
    if (m[1]) {
      const code = document.createElement("code");
      code.textContent = m[2].replace(/^ (.*) $/, "$1");
      parent.append(code);
    } else if (m[3] !== undefined || m[4] !== undefined) parent.append(wrap("strong", m[3] ?? m[4]));
    else if (m[5] !== undefined) parent.append(wrap("del", m[5]));
    else if (m[6] !== undefined || m[7] !== undefined) parent.append(wrap("em", m[6] ?? m[7]));
    else if (m[9] !== undefined) parent.append(link("image: " + (m[8] || m[9]), m[9]));
    else if (m[10] !== undefined) parent.append(link(m[10], m[11]));
    else if (m[12] !== undefined) parent.append(link(m[12], m[12]));
  }
  if (last < text.length) parent.append(text.slice(last));
}

function paragraph(lines) {
  const p = document.createElement("p");
  lines.forEach((line, i) => {
    if (i) p.append(document.createElement("br"));
    inline(p, line.trim());
  });
  return p;
}

function cells(line) {
  return line.trim().replace(/^\|/, "").replace(/\|$/, "").split("|").map((c) => c.trim());
}

function table(head, rows) {
  const t = document.createElement("table");
  const tr = t.createTHead().insertRow();
  for (const c of cells(head)) tr.append(wrap("th", c));
  const body = t.createTBody();
  for (const row of rows) {
    const r = body.insertRow();
    for (const c of cells(row)) r.append(wrap("td", c));
  }
  return t;
}

function list(lines, start) {
  const first = ITEM.exec(lines[start]);
  const ordered = /\d/.test(first[2]);
  const node = document.createElement(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  const indent = first[1].length;
  let i = start;
  let item = null;
  while (i < lines.length) {
    const line = lines[i];
    const m = ITEM.exec(line);
    if (m && m[1].length <= indent + 1 && /\d/.test(m[2]) === ordered) {
      item = { text: [m[3]] };
      node.append(Object.assign(document.createElement("li"), { _md: item }));
    } else if (item && line.trim() && (/^\s+/.test(line) || !blockStart(line))) {
      item.text.push(line.replace(/^\s{1,4}/, ""));
    } else break;
    i += 1;
  }
  for (const li of node.children) {
    const inner = li._md.text;
    delete li._md;
    if (inner.length === 1) inline(li, inner[0]);
    else li.append(render(inner.join("\n")));
  }
  return [node, i];
}

function blockStart(line) {
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line);
}

/** A DocumentFragment holding `text` rendered as Markdown. */
export function render(text) {
  const out = document.createDocumentFragment();
  const lines = String(text).replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if (!line.trim()) {
      i += 1;
    } else if ((m = FENCE.exec(line))) {
      const fence = m[1];
      const code = [];
      i += 1;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence)) code.push(lines[i++]);
      i += 1;
      const pre = document.createElement("pre");
      const c = document.createElement("code");
      if (m[2]) c.dataset.lang = m[2];
      c.textContent = code.join("\n");
      pre.append(c);
      out.append(pre);
    } else if ((m = HEADING.exec(line))) {
      out.append(wrap("h" + Math.min(6, m[1].length + 2), m[2]));
      i += 1;
    } else if (RULE.test(line)) {
      out.append(document.createElement("hr"));
      i += 1;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      while (i < lines.length && QUOTE.test(lines[i])) quoted.push(lines[i++].replace(QUOTE, ""));
      const q = document.createElement("blockquote");
      q.append(render(quoted.join("\n")));
      out.append(q);
    } else if (ITEM.test(line)) {
      const [node, next] = list(lines, i);
      out.append(node);
      i = next;
    } else if (line.includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1])) {
      const rows = [];
      let j = i + 2;
      while (j < lines.length && lines[j].includes("|") && lines[j].trim()) rows.push(lines[j++]);
      out.append(table(line, rows));
      i = j;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() && (para.length === 0 || !blockStart(lines[i]))) para.push(lines[i++]);
      out.append(paragraph(para));
    }
  }
  return out;
}
