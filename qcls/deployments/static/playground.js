// qcls playground: classify queries and edit the served prompt set. Plain JavaScript, no build step.
"use strict";
const STAGES = ["queue_wait", "cache", "tokenize", "prepare", "forward", "score", "postprocess"];
const FIELDS = ["name", "template", "label_prefix", "label_end", "labels"];
const BASE = location.pathname.endsWith("/") ? location.pathname : location.pathname + "/";
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "for" || k === "role") node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) if (c != null) node.append(c);
  return node;
}

// -- the API: the key (sessionStorage) as a bearer token on every JSON route --------------------------------
async function api(method, path, body) {
  const headers = {};
  const key = $("api-key").value.trim();
  if (key) headers["Authorization"] = "Bearer " + key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res;
  try {
    res = await fetch(BASE + path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body)});
  } catch (e) {
    return {status: 0, data: {detail: "the server did not answer (" + e.message + ")"}};
  }
  let data = null;
  try { data = await res.json(); } catch (e) { data = {detail: res.statusText}; }
  if (res.status === 401) data.detail = "this server needs an API key: enter it above (" + (data.detail || "") + ")";
  return {status: res.status, data};
}

// -- queries ------------------------------------------------------------------------------------------------
function queryLines() {
  return $("queries").value.split("\n").map((q) => q.trim()).filter((q) => q);
}

async function classify() {
  const queries = queryLines();
  if (!queries.length) { setStatus("status", "type a query first", true); return; }
  setStatus("status", "classifying " + queries.length + " quer" + (queries.length > 1 ? "ies" : "y") + " …");
  // at most max_queries_per_request a request: more go as several requests at once (the replica batches them)
  const per = (facts && facts.limits.max_queries_per_request) || 16;
  const chunks = [];
  for (let i = 0; i < queries.length; i += per) chunks.push(queries.slice(i, i + per));
  const answers = await Promise.all(chunks.map((c) => api("POST", "v1/classify", {queries: c})));
  const results = answers.flatMap((a) => a.data.results || []);
  const failed = answers.find((a) => a.status !== 200 && !(a.data.results || []).length);
  if (failed) { setStatus("status", failed.data.detail || "HTTP " + failed.status, true); if (!results.length) return; }
  else setStatus("status", results.length + " result(s), configuration " + (answers[0].data.fingerprint || "?"));
  $("results").replaceChildren(...results.map(renderResult));
}

function renderResult(r) {
  const card = el("article", {class: "result", "data-query": r.query},
    el("h3", {text: r.query}),
    el("div", {class: "meta", text: r.ok ? `${r.query_tokens} query tokens · batch of ${r.batch_size} · ` +
      `${fmt(r.timings_ms.in_replica ?? r.timings_ms.total)} ms in the replica` + (r.meta && r.meta.cache === "hit" ?
      " · from the result cache" : "") : ""}));
  if (!r.ok) { card.append(el("p", {class: "error", text: r.error})); return card; }
  card.append(stageBar(r.timings_ms));
  const heads = (r.meta && r.meta.heads) || {};
  for (const p of r.prompts) card.append(renderPrompt(p, heads));
  return card;
}

function stageBar(t) {
  const parts = STAGES.filter((s) => t[s] > 0);
  const sum = parts.reduce((a, s) => a + t[s], 0) || 1;
  const bar = el("div", {class: "stages", role: "img",
    "aria-label": "stage timings: " + parts.map((s) => `${s} ${fmt(t[s])} ms`).join(", ")});
  const legend = el("div", {class: "legend"});
  for (const s of parts) {
    bar.append(el("span", {class: "st-" + s, title: `${s} ${fmt(t[s])} ms`, "data-stage": s,
                           style: `width:${(100 * t[s] / sum).toFixed(2)}%`}));
    legend.append(el("span", {}, el("i", {class: "st-" + s}), `${s} ${fmt(t[s])} ms`));
  }
  return el("div", {class: "timing"}, bar, legend);
}

function renderPrompt(p, heads = {}) {
  // what answered this prompt: its head or the LLM's own label scores (the results' meta.heads)
  const known = Array.isArray(heads.with_head), byHead = known && heads.with_head.includes(p.prompt);
  const head = el("h4", {}, p.prompt + ": ", el("span", {class: "winner", text: p.label}), ` ${pct(p.prob)}`,
                  known ? el("span", {class: "by", text: byHead ? "head" : "LLM scores"}) : null);
  if (p.raw_label != null)  // a head answered: the LLM's own winner beside it
    head.append(el("span", {class: "raw", text: `LLM: ${p.raw_label} ${pct(p.raw_prob)}`}));
  if (p.abstained) head.append(el("span", {class: "abstain", text: "abstained" +
    (p.threshold != null ? ` (below ${pct(p.threshold)})` : "")}));
  const box = el("div", {class: "prompt-result", "data-prompt": p.prompt, "data-winner": p.label,
                         "data-answered-by": known ? (byHead ? "head" : "llm") : ""}, head);
  const lost = (heads.lost || {})[p.prompt];  // its head no longer fits it: say so, with the way back
  if (lost) box.append(el("p", {class: "lost-head", role: "note", text: lost}));
  for (const l of p.labels) {
    const won = l.label === p.label;
    const title = `${l.label}: p ${pct(l.prob)}` + (l.score != null ? `, score ${fmt(l.score)}` : ", no raw score " +
      "(the forward stops at the head's layer)") + (l.raw_prob != null ? `, LLM p ${pct(l.raw_prob)}` : "") +
      `, ${l.tokens} tokens`;
    box.append(el("div", {class: "row" + (won ? " won" : ""), title},
      el("span", {class: "name", text: l.label}),
      el("div", {class: "track"}, el("div", {class: "bar", "data-label": l.label, "data-prob": String(l.prob ?? 0),
        style: `width:${(100 * (l.prob ?? 0)).toFixed(1)}%`})),
      el("span", {class: "num", text: pct(l.prob)})));
  }
  return box;
}

const fmt = (x) => (x == null ? "–" : Math.abs(x) >= 100 ? x.toFixed(0) : x.toFixed(2));
const pct = (x) => (x == null ? "–" : (100 * x).toFixed(1) + "%");

function setStatus(id, text, bad = false) {
  $(id).textContent = text;
  $(id).className = bad ? "error" : "";
}

// -- saved queries (localStorage) ---------------------------------------------------------------------------
const SAVED = "qcls.playground.saved";
const savedList = () => JSON.parse(localStorage.getItem(SAVED) || "[]");

function renderSaved() {
  $("saved").replaceChildren(...savedList().map((q, i) => el("li", {},
    el("button", {type: "button", text: q, onclick: () => { $("queries").value = q; classify(); }}),
    el("button", {type: "button", text: "remove", "aria-label": "remove " + q, onclick: () => {
      const all = savedList(); all.splice(i, 1); localStorage.setItem(SAVED, JSON.stringify(all)); renderSaved();
    }}))));
}

function saveQueries() {
  const all = savedList();
  for (const q of queryLines()) if (!all.includes(q)) all.push(q);
  localStorage.setItem(SAVED, JSON.stringify(all));
  renderSaved();
  $("saved-box").open = true;
}

// -- the prompt set: check facts, edit, validate, apply, download -------------------------------------------
let facts = null;

async function loadPrompts() {
  const {status, data} = await api("GET", "v1/check");
  if (status !== 200) { setStatus("served", data.detail || "HTTP " + status, true); return; }
  facts = data;
  setStatus("served", `${data.model} · strategy ${data.strategy} · configuration ${data.fingerprint} · ` +
    `forward ${data.depth.layers} of ${data.depth.of} layers`);
  $("forward").textContent = "Tokens per forward (queries of " + data.forward[0].query_tokens + " tokens): " +
    data.forward.map((f) => `batch ${f.batch}: ${f.tokens} tokens, T4 ≈ ${f.t4_ms} ms`).join("; ") +
    `; prefix pool ${data.prefix_pool_tokens} tokens (computed once). T4: ${data.t4_model}.` +
    (data.depth.loaded < data.depth.of ? ` Only the heads' layers are loaded (${data.depth.loaded} of ` +
     `${data.depth.of}): an edit that leaves a prompt without its head needs every layer and is refused here; ` +
     "serve without naming the head file (or with engine.layer_exit=false) to edit freely." : "");
  $("prompts").replaceChildren(...data.prompts.map((p, i) => promptEditor(p, i)));
}

function promptEditor(p, i) {
  const id = (f) => `p${i}-${f}`;
  const field = (f, label, input) => [el("label", {for: id(f), text: label}), input,
    el("div", {class: "field-error", id: id(f) + "-error", "data-field": f, "aria-live": "polite"})];
  const fs = el("fieldset", {class: "prompt-edit", "data-index": String(i)},
    el("legend", {text: p ? p.name : "new prompt"}),
    ...field("name", "name", el("input", {type: "text", id: id("name"), value: p ? p.name : ""})),
    ...field("template", "template (exactly one {query})", el("textarea", {id: id("template"), rows: 4,
      value: p ? p.template : "Query: {query}\nLabel:"})),
    ...field("label_prefix", "label prefix (JSON string)", el("input", {type: "text", id: id("label_prefix"),
      value: JSON.stringify(p ? p.label_prefix : " ")})),
    ...field("label_end", "label end (JSON string; null: the tokenizer's end token)", el("input", {type: "text",
      id: id("label_end"), value: JSON.stringify(p ? p.label_end : null)})),
    ...field("labels", "labels, one per line", el("textarea", {id: id("labels"), rows: 4,
      value: p ? p.labels.map((l) => l.label).join("\n") : ""})));
  if (p) {
    fs.append(el("p", {class: "facts", text: `prefix ${p.prefix_tokens} tokens (${p.shared_prefix_tokens} shared ` +
      `with other prompts), suffix ${p.suffix_tokens}, ${p.row_trie_tokens} label-trie tokens per row` +
      (p.end_token ? `; labels others extend end with ${JSON.stringify(p.end_token)}` : "")}));
    const rows = p.labels.map((l) => el("tr", {},
      el("td", {text: l.label}), el("td", {class: "num", text: String(l.tokens)}),
      el("td", {class: "num", text: String(l.trie_reads)}),
      el("td", {text: l.shares_first_token.length ? l.shares_first_token.join(", ") : "–"})));
    fs.append(el("table", {class: "costs"}, el("thead", {}, el("tr", {}, el("th", {text: "label"}),
      el("th", {text: "tokens"}), el("th", {text: "logits read"}), el("th", {text: "shares its first token with"}))),
      el("tbody", {}, ...rows)));
  }
  fs.append(el("button", {type: "button", text: "Remove this prompt", onclick: () => { fs.remove(); }}));
  return fs;
}

function editedPrompts() {
  return [...document.querySelectorAll(".prompt-edit")].map((fs) => {
    const v = (f) => fs.querySelector(`#p${fs.dataset.index}-${f}`).value;
    const json = (f, empty) => {  // a JSON string (or null); anything else is taken as written
      const text = v(f);
      if (!text.trim()) return empty;
      try { return JSON.parse(text); } catch (e) { return text; }
    };
    return {name: v("name").trim(), template: v("template"), label_prefix: json("label_prefix", ""),
            label_end: json("label_end", null), labels: v("labels").split("\n").map((l) => l.trim()).filter((l) => l)};
  });
}

function showErrors(errors) {
  document.querySelectorAll(".field-error").forEach((e) => { e.textContent = ""; });
  const editors = [...document.querySelectorAll(".prompt-edit")];
  const general = [];
  for (const e of errors || []) {
    const fs = e.prompt != null ? editors[e.prompt] : null;
    const slot = fs && fs.querySelector(`.field-error[data-field="${FIELDS.includes(e.field) ? e.field : "name"}"]`);
    if (slot) slot.textContent = (slot.textContent ? slot.textContent + "; " : "") + e.message;
    else general.push(e.message);
  }
  return general;
}

async function send(dryRun) {
  setStatus("apply-status", dryRun ? "validating …" : "applying: the new prompts are built beside the serving ones …");
  const {status, data} = await api("PUT", "v1/prompts", {prompts: editedPrompts(), dry_run: dryRun});
  const general = showErrors(data.errors);
  if (status === 200) {
    setStatus("apply-status", dryRun ? "valid" : `serving configuration ${data.fingerprint} (${data.prompts.join(", ")})`);
    $("apply-status").className = "okay";
    if (!dryRun) await loadPrompts();
  } else {
    setStatus("apply-status", [data.detail || "HTTP " + status, ...general].join(": "), true);
  }
}

function yamlOf(prompts, name) {
  // JSON strings are YAML double-quoted scalars: templates keep their newlines and quotes exactly
  const s = JSON.stringify;
  return "# @package _global_\n# written by the qcls playground: save as DIR/prompts/" + name + ".yaml, then\n" +
    "# qcls --config-dir DIR classify prompts=" + name + " …  (or qcls --config-dir DIR reload … prompts=" + name +
    ")\nprompts:\n" + prompts.map((p) => `  - name: ${s(p.name)}\n    template: ${s(p.template)}\n` +
    `    label_prefix: ${s(p.label_prefix)}\n` + (p.label_end != null ? `    label_end: ${s(p.label_end)}\n` : "") +
    `    labels: [${p.labels.map(s).join(", ")}]\n`).join("");
}

function download() {
  const name = $("set-name").value.trim() || "playground";
  const url = URL.createObjectURL(new Blob([yamlOf(editedPrompts(), name)], {type: "text/yaml"}));
  const a = el("a", {href: url, download: name + ".yaml"});
  document.body.append(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

// -- wiring -------------------------------------------------------------------------------------------------
document.addEventListener("DOMContentLoaded", () => {
  $("api-key").value = sessionStorage.getItem("qcls.apiKey") || "";
  $("api-key").addEventListener("change", () => { sessionStorage.setItem("qcls.apiKey", $("api-key").value.trim());
                                                  loadPrompts(); });
  $("queries").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); classify(); }
  });
  $("classify").addEventListener("click", classify);
  $("save-queries").addEventListener("click", saveQueries);
  $("add-prompt").addEventListener("click", () => {
    const fs = promptEditor(null, document.querySelectorAll(".prompt-edit").length + Date.now() % 100000);
    $("prompts").append(fs); fs.querySelector("input").focus();
  });
  $("validate").addEventListener("click", () => send(true));
  $("prompts-form").addEventListener("submit", (e) => { e.preventDefault(); send(false); });
  $("download").addEventListener("click", download);
  renderSaved();
  loadPrompts();
});
