// The explorer page: plain JavaScript over the server's own API, no libraries, no network beyond it.
"use strict";

const state = { info: null, attention: null, layer: 0, head: 0 };
const $ = (id) => document.getElementById(id);
const KEY_NAME = "bertforge-api-key";

function element(tag, text, attributes) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  Object.entries(attributes || {}).forEach(([name, value]) => node.setAttribute(name, value));
  return node;
}

async function api(path, body) {
  const headers = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem(KEY_NAME);
  if (key) headers.Authorization = "Bearer " + key;
  const options = body === undefined ? { headers } : { method: "POST", headers, body: JSON.stringify(body) };
  const response = await fetch(path, options);
  let data = null;
  try { data = await response.json(); } catch (ignored) { /* not JSON: the status text says enough */ }
  if (response.status === 401 || response.status === 403) $("key-row").hidden = false;
  if (!response.ok) {
    const message = data && (typeof data.error === "string" ? data.error : (data.error || {}).message);
    throw new Error(message || `${path}: ${response.status} ${response.statusText}`);
  }
  return data;
}

function showErrors(errors) {
  const box = $("error");
  box.hidden = errors.length === 0;
  box.textContent = errors.map((e) => e.message || String(e)).join(" · ");
}

// --- model info ---------------------------------------------------------------------------

async function loadInfo() {
  const info = await api("/info");
  state.info = info;
  $("model-info").textContent =
    `${info.model}: ${info.layers} layers × ${info.heads} heads, ${info.dimension}-d vectors (${info.pooling} pooling)` +
    ` · vocabularies: ${info.vocabularies.join(", ")}` +
    (info.fill_mask ? ` · fill-mask: ${info.fill_mask}` : "") +
    (info.classifier ? ` · classifier: ${info.classifier.name}` : "") +
    ` · search: ${info.search ? "on" : "off"}`;
  showIndexWeights(info.index);
  const layers = $("word-layers");
  layers.replaceChildren(...info.word_layers.map((name) => element("option", name.replaceAll("_", " "), { value: name })));
}

// --- tokens across vocabularies (seed 000's BERT / ClinicalBERT / BlueBERT / BioBERT table) ---

async function showTokens(text) {
  const names = state.info.vocabularies;
  const answers = await Promise.all(names.map((vocab) => api("/tokenize", { inputs: text, vocab, add_special_tokens: false })));
  const columns = answers.map((answer) => answer[0]);
  const rows = Math.max(0, ...columns.map((column) => column.length));
  // A piece differs when the first vocabulary has no piece with the same text over the same characters:
  // compared by token, so one extra split early in a column does not mark every row below it.
  const key = (token) => `${token.start}:${token.stop}:${token.piece}`;
  const firstPieces = new Set(columns[0].map(key));
  const table = $("token-table");
  const head = element("thead");
  const headRow = element("tr");
  headRow.append(element("th", "#"), ...names.map((name) => element("th", name)));
  head.append(headRow);
  const body = element("tbody");
  for (let row = 0; row < rows; row++) {
    const tr = element("tr");
    tr.append(element("td", String(row + 1)));
    columns.forEach((column, i) => {
      const token = column[row];
      const differs = token !== undefined && i > 0 && !firstPieces.has(key(token));
      tr.append(element("td", token ? token.piece : "", differs ? { class: "differs" } : {}));
    });
    body.append(tr);
  }
  const foot = element("tfoot");
  const footRow = element("tr");
  footRow.append(element("td", "tokens"), ...columns.map((column) => element("td", String(column.length))));
  foot.append(footRow);
  table.replaceChildren(head, body, foot);
  table.dataset.text = text;
}

// --- attention heatmaps -------------------------------------------------------------------

function shade(value) { // 0..1 -> white .. the accent blue
  const t = Math.max(0, Math.min(1, value));
  const mix = (from, to) => Math.round(from + t * (to - from));
  return `rgb(${mix(255, 23)},${mix(255, 70)},${mix(255, 160)})`;
}

// The strongest link, over the cells (q, k) that `counts` lets through (every cell when none is given);
// value -1 when none does.
function strongest(matrix, counts) {
  let best = { q: 0, k: 0, value: -1 };
  matrix.forEach((row, q) => row.forEach((value, k) => {
    if (value > best.value && (!counts || counts(q, k))) best = { q, k, value };
  }));
  return best;
}

function drawMatrix(context, matrix, left, top, cell) {
  const peak = strongest(matrix).value || 1;
  matrix.forEach((row, q) => row.forEach((value, k) => {
    context.fillStyle = shade(value / peak);
    context.fillRect(left + k * cell, top + q * cell, Math.ceil(cell), Math.ceil(cell));
  }));
}

function drawHeatmap() {
  const { tokens, attentions, truncated } = state.attention;
  const matrix = attentions[state.layer][state.head];
  const n = tokens.length;
  const canvas = $("attention-heatmap");
  let context = canvas.getContext("2d");
  context.font = "12px system-ui, sans-serif";
  const margin = Math.ceil(Math.max(...tokens.map((t) => context.measureText(t).width))) + 10;
  // Cells fit the room the section has (a 64-token text on a phone), 4 to 28 px each.
  const room = Math.min(440, $("attention-section").clientWidth - 30) - margin;
  const cell = Math.max(4, Math.min(28, Math.floor(room / n)));
  canvas.width = margin + n * cell + 2;
  canvas.height = margin + n * cell + 2;
  context = canvas.getContext("2d"); // resizing resets the context's settings
  context.font = "12px system-ui, sans-serif";
  context.fillStyle = "#1d2433";
  context.textBaseline = "middle";
  tokens.forEach((token, i) => {
    context.textAlign = "right";
    context.fillText(token, margin - 6, margin + i * cell + cell / 2);
    context.save();
    context.translate(margin + i * cell + cell / 2, margin - 6);
    context.rotate(-Math.PI / 2);
    context.textAlign = "left";
    context.fillText(token, 0, 0);
    context.restore();
  });
  drawMatrix(context, matrix, margin, margin, cell);
  const peak = strongest(matrix);
  // Most heads send most of their attention to [CLS] or [SEP] (a resting place), and many to the piece
  // itself or another piece of its own word: the link worth naming joins two different words of the text.
  const words = state.attention.word_ids; // null for [CLS] and [SEP]
  const between = strongest(matrix, (q, k) => words[q] !== null && words[k] !== null && words[q] !== words[k]);
  const best = between.value >= 0 ? between : peak; // a one-word text has no link between words
  Object.assign(canvas.dataset, { layer: state.layer, head: state.head, size: n, strongest: `${best.q},${best.k}`,
                                  peak: `${peak.q},${peak.k}`, margin, cell, text: state.attention.text });
  const sends = `“${tokens[peak.q]}” sends ${peak.value.toFixed(3)} to “${tokens[peak.k]}”.`;
  $("attention-summary").textContent = `Layer ${state.layer + 1}, head ${state.head + 1}: ` +
    (between.value < 0 ? sends : `the strongest link between words is “${tokens[best.q]}” → ` +
      `“${tokens[best.k]}” (${best.value.toFixed(3)})` + (peak.value > best.value ? `; ${sends}` : ".")) +
    (truncated ? ` Only the first ${n} tokens are shown.` : "");
  $("attention-hover").textContent = ""; // the cell under the pointer belongs to the map drawn before
  document.querySelectorAll("#attention-grid canvas").forEach((small) => small.classList.toggle(
    "selected", Number(small.dataset.layer) === state.layer && Number(small.dataset.head) === state.head));
}

function drawGrid() {
  const { attentions, tokens } = state.attention;
  const grid = $("attention-grid");
  const size = 36;
  grid.style.gridTemplateColumns = `auto repeat(${attentions[0].length}, ${size + 2}px)`;
  const children = [element("span", "", { class: "label" })];
  attentions[0].forEach((_, head) => children.push(element("span", `h${head + 1}`, { class: "label" })));
  attentions.forEach((heads, layer) => {
    children.push(element("span", `L${layer + 1}`, { class: "label" }));
    heads.forEach((matrix, head) => {
      const small = element("canvas", null, { width: size, height: size, title: `layer ${layer + 1}, head ${head + 1}` });
      small.dataset.layer = layer;
      small.dataset.head = head;
      drawMatrix(small.getContext("2d"), matrix, 0, 0, size / tokens.length);
      small.addEventListener("click", () => selectHead(layer, head));
      children.push(small);
    });
  });
  grid.replaceChildren(...children);
}

function selectHead(layer, head) {
  state.layer = layer;
  state.head = head;
  $("layer").value = layer;
  $("head").value = head;
  drawHeatmap();
}

function fillSelect(select, count, label) {
  select.replaceChildren(...Array.from({ length: count }, (_, i) => element("option", `${label} ${i + 1}`, { value: i })));
}

async function showAttention(text) {
  const data = await api("/explorer/attention", { text });
  state.attention = { ...data, text };
  const layers = data.attentions.length;
  const heads = data.attentions[0].length;
  state.layer = Math.min(state.layer, layers - 1);
  state.head = Math.min(state.head, heads - 1);
  fillSelect($("layer"), layers, "layer");
  fillSelect($("head"), heads, "head");
  drawGrid();
  selectHead(state.layer, state.head);
}

function hoverHeatmap(event) {
  if (!state.attention) return;
  const canvas = $("attention-heatmap");
  const box = canvas.getBoundingClientRect();
  const scale = canvas.width / box.width; // the canvas may be drawn smaller than its pixels (max-width)
  const margin = Number(canvas.dataset.margin), cell = Number(canvas.dataset.cell), size = Number(canvas.dataset.size);
  const k = Math.floor(((event.clientX - box.left) * scale - margin) / cell);
  const q = Math.floor(((event.clientY - box.top) * scale - margin) / cell);
  const tokens = state.attention.tokens;
  const inside = q >= 0 && k >= 0 && q < size && k < size;
  $("attention-hover").textContent = inside
    ? `“${tokens[q]}” → “${tokens[k]}”: ${state.attention.attentions[state.layer][state.head][q][k].toFixed(3)}` : "";
}

// --- semantic search ----------------------------------------------------------------------

async function showSearch(text) {
  const list = $("search-results");
  if (!state.info.search) {
    $("search-note").textContent = "No index on this server: start it with --index DIR to search.";
    list.replaceChildren();
    return;
  }
  const weights = searchWeights();
  const hits = (await api("/search", { query: text, top_k: 5, ...weights }))[0];
  list.replaceChildren(...hits.map((hit) => {
    const item = element("li", null, { "data-id": hit.id });
    item.append(element("span", hit.score.toFixed(3), { class: "score" }), element("span", hit.text, { class: "text" }));
    return item;
  }));
  list.dataset.query = text;
  list.dataset.weights = WEIGHT_NAMES.map((name) => weights[name]).join(",");
}

// The index's weights (GET /info: what a search naming none ranks by), changeable here to see what each adds.
const WEIGHT_NAMES = ["dense_weight", "sentence_weight", "neighbour_weight"];
const weightInput = (name) => $(name.replace("_", "-"));

function showIndexWeights(index) {
  $("search-weights").hidden = !index;
  if (!index) return;
  WEIGHT_NAMES.forEach((name) => { weightInput(name).value = String(index[name]); });
  weightInput("sentence_weight").disabled = !index.sentence_vectors;  // the server refuses one above 0 without them
}

function searchWeights() {
  if (!state.info.index) return {};
  return Object.fromEntries(WEIGHT_NAMES.map((name) => [name, Number(weightInput(name).value)]));
}

async function searchAgain() {
  const text = $("search-results").dataset.query || $("sentence").value.trim();
  if (text) await guarded($("explore"), [() => showSearch(text)], [clearSearch]);
}

// --- a word in context (seed 003's picture) -------------------------------------------------

function drawPca(points, occurrences, variance) {
  const svg = $("pca-plot");
  const width = Number(svg.getAttribute("width"));
  const height = Number(svg.getAttribute("height"));
  const pad = 34;
  const xs = points.map((p) => p[0]);
  const ys = points.map((p) => p[1]);
  const scale = (values, low, high) => {
    const min = Math.min(...values);
    const span = (Math.max(...values) - min) || 1;
    return (value) => low + ((value - min) / span) * (high - low);
  };
  const x = scale(xs, pad, width - pad);
  const y = scale(ys, height - pad, pad);
  const ns = "http://www.w3.org/2000/svg";
  const make = (tag, attributes, text) => {
    const node = document.createElementNS(ns, tag);
    Object.entries(attributes).forEach(([name, value]) => node.setAttribute(name, value));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const children = [
    make("text", { x: width / 2, y: height - 8, "text-anchor": "middle" }, `PC1 (${(100 * variance[0]).toFixed(0)}% of variance)`),
    make("text", { x: 12, y: height / 2, transform: `rotate(-90 12 ${height / 2})`, "text-anchor": "middle" },
         `PC2 (${(100 * variance[1]).toFixed(0)}%)`),
  ];
  points.forEach((point, i) => {
    const { label, context, sentence } = occurrences[i];
    const group = make("g", { class: "point", "data-index": i, "data-sentence": sentence });
    group.append(make("title", {}, context),
                 make("circle", { cx: x(point[0]), cy: y(point[1]), r: 7, fill: "#1f5fbf", "fill-opacity": 0.8 }),
                 make("text", { x: x(point[0]) + 10, y: y(point[1]) + 4 }, label));
    children.push(group);
  });
  svg.replaceChildren(...children);
}

async function showWord() {
  const sentences = $("contexts").value.split("\n").map((line) => line.trim()).filter(Boolean);
  const word = $("word").value.trim();
  const data = await api("/explorer/word-in-context", { word, sentences, layers: $("word-layers").value });
  // One row, column and point per occurrence: a sentence that holds the word twice gives 2.1 and 2.2.
  const occurrences = data.occurrences;
  const table = $("cosine-table");
  const head = element("tr");
  head.append(element("th", word), ...occurrences.map((o) => element("th", o.label, { title: o.context })));
  const rows = data.cosine.map((row, i) => {
    const tr = element("tr");
    tr.append(element("th", occurrences[i].label, { title: occurrences[i].context }));
    row.forEach((value) => {
      const cell = element("td", value.toFixed(3));
      cell.style.background = shade((value - 0.5) / 0.5);
      if (value > 0.8) cell.style.color = "#fff";
      tr.append(cell);
    });
    return tr;
  });
  table.replaceChildren(element("thead"), element("tbody"));
  table.tHead.append(head);
  table.tBodies[0].append(...rows);
  table.dataset.word = word;
  drawPca(data.points, occurrences, data.explained_variance);
}

// --- fill-mask ------------------------------------------------------------------------------

async function showFillMask() {
  const text = $("masked").value.trim();
  const list = $("fill-results");
  if (!text.includes("[MASK]")) throw new Error("Put [MASK] where a word should be predicted.");
  const masks = await api("/fill-mask", { inputs: text, top_k: 5 });
  list.replaceChildren(...masks.map((candidates, i) => {
    const item = element("li", null, { "data-mask": i });
    item.append(...candidates.map((c) => {
      const chip = element("span", null, { class: "candidate" });
      chip.append(element("span", c.token_str, { class: "token" }), element("span", c.score.toFixed(3), { class: "score" }));
      return chip;
    }));
    return item;
  }));
  list.dataset.text = text;
}

async function fill(event) {
  if (event) event.preventDefault();
  await guarded($("fill"), [showFillMask], [() => $("fill-results").replaceChildren()]);
}

// --- wiring -------------------------------------------------------------------------------

function clearTokens() { $("token-table").replaceChildren(); delete $("token-table").dataset.text; }
function clearSearch() { $("search-results").replaceChildren(); delete $("search-results").dataset.query; }
function clearAttention() {
  state.attention = null;
  const canvas = $("attention-heatmap");
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
  delete canvas.dataset.text;
  $("attention-grid").replaceChildren();
  $("attention-summary").textContent = "";
  $("attention-hover").textContent = "";
}

// Run the views' updates with the button disabled; a view whose update failed is emptied (never
// left showing the previous text's answer) and every failure is shown.
async function guarded(button, updates, clears) {
  button.disabled = true;
  const results = await Promise.allSettled(updates.map((update) => update()));
  button.disabled = false;
  results.forEach((result, i) => { if (result.status === "rejected") clears[i](); });
  showErrors(results.filter((r) => r.status === "rejected").map((r) => r.reason));
}

async function explore(event) {
  if (event) event.preventDefault();
  const text = $("sentence").value.trim();
  if (!text) {
    [clearTokens, clearAttention, clearSearch].forEach((clear) => clear());
    showErrors([new Error("Type a sentence first.")]);
    return;
  }
  await guarded($("explore"), [() => showTokens(text), () => showAttention(text), () => showSearch(text)],
                [clearTokens, clearAttention, clearSearch]);
}

async function compare(event) {
  if (event) event.preventDefault();
  await guarded($("compare"), [showWord], [clearWord]);
}

function clearWord() {
  $("cosine-table").replaceChildren();
  delete $("cosine-table").dataset.word;
  $("pca-plot").replaceChildren();
}

async function load() {
  try {
    await loadInfo();
  } catch (error) {
    showErrors([error]);
    return;
  }
  $("fill-section").hidden = !state.info.fill_mask;
  await explore();
  await compare();
  if (state.info.fill_mask) await fill();
  document.body.dataset.ready = "true";
}

function start() {
  $("explore-form").addEventListener("submit", explore);
  $("word-form").addEventListener("submit", compare);
  $("layer").addEventListener("change", (e) => selectHead(Number(e.target.value), state.head));
  $("head").addEventListener("change", (e) => selectHead(state.layer, Number(e.target.value)));
  $("fill-form").addEventListener("submit", fill);
  WEIGHT_NAMES.forEach((name) => weightInput(name).addEventListener("change", searchAgain));
  $("attention-heatmap").addEventListener("mousemove", hoverHeatmap);
  $("attention-heatmap").addEventListener("mouseleave", () => { $("attention-hover").textContent = ""; });
  $("save-key").addEventListener("click", () => {
    sessionStorage.setItem(KEY_NAME, $("api-key").value);
    $("key-row").hidden = true;
    load();
  });
  load();
}

start();
