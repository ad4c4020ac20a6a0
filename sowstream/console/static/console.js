// The sowstream console page: plain JS over Tabulator (grids) and Chart.js (charts).
// The server sends row events and fleet samples over one websocket; queries go over HTTP.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "_key";
const state = { topics: [], ws: null, live: null, liveFields: [], views: {}, charts: {} };

async function api(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  };
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  return { ok: response.ok, status: response.status, data };
}

// A grid whose calls wait until Tabulator has built it.
function grid(el, options) {
  const table = new Tabulator(el, {
    layout: "fitDataFill", maxHeight: "420px", placeholder: "no rows",
    rowFormatter: (row) => { row.getElement().dataset.key = row.getData()[KEY] ?? ""; },
    ...options,
  });
  table.ready = new Promise((resolve) => table.on("tableBuilt", resolve));
  return table;
}

function columnsFor(fields, keyTitle = "SowKey") {
  return fields.map((f) => ({ title: f === KEY ? keyTitle : f, field: f, headerSort: true }));
}

function fieldsOf(rows, known = []) {
  const fields = [...known];
  for (const row of rows) for (const f of Object.keys(row)) if (!fields.includes(f)) fields.push(f);
  return fields.includes(KEY) ? [KEY, ...fields.filter((f) => f !== KEY)] : fields;
}

function showError(el, data, input) {
  for (const i of document.querySelectorAll("input.bad")) i.classList.remove("bad");
  if (!data) { el.hidden = true; el.textContent = ""; return; }
  let text = data.error || String(data);
  if (data.position !== undefined && input) {
    // the reason, then a caret under the position in what the user typed, which is selected
    text = `${text.split("\n")[0]}\n${data.field}: ${input.value}\n${" ".repeat(data.field.length + 2 + data.position)}^`;
    input.classList.add("bad");
    input.focus();
    input.setSelectionRange(data.position, Math.min(data.position + 1, input.value.length));
  }
  el.textContent = text;
  el.hidden = false;
}

// -- login and navigation ------------------------------------------------------------------

async function start() {
  const session = await api("/api/session");
  if (!session.ok) { $("login").hidden = false; $("main").hidden = true; return; }
  $("login").hidden = true;
  $("main").hidden = false;
  $("who").textContent = session.data.identity ? `as ${session.data.identity}` : "default identity";
  $("logout").hidden = !session.data.required;
  await loadTopics();
  connect();
}

$("login-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const res = await api("/api/login", { token: $("token").value });
  if (!res.ok) { $("login-error").textContent = res.data.error || "login failed"; return; }
  $("login-error").textContent = "";
  start();
});

$("logout").addEventListener("click", async () => {
  await api("/api/logout", {});
  if (state.ws) state.ws.close();
  location.reload();
});

function show(view) {
  for (const b of document.querySelectorAll("#nav button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.hidden = s.id !== `view-${view}`;
  // grids and charts measure themselves when shown
  for (const t of [state.topicsGrid, state.queryGrid, state.liveGrid, state.viewGrid, state.fleetGrid]) {
    if (t) t.redraw(true);
  }
  if (view === "views") refreshView();
}
for (const b of document.querySelectorAll("#nav button")) b.addEventListener("click", () => show(b.dataset.view));

// -- topics --------------------------------------------------------------------------------

async function loadTopics() {
  const res = await api("/api/topics");
  if (!res.ok) return;
  state.topics = res.data.topics;
  const cols = ["name", "kind", "message_type", "keys", "partitions", "view_of", "queue_of", "pattern", "preprocessing", "log_topic"];
  if (!state.topicsGrid) {
    state.topicsGrid = grid($("topics-grid"), { data: state.topics, index: "name",
      columns: cols.map((f) => ({ title: f, field: f })) });
  } else {
    await state.topicsGrid.ready;
    state.topicsGrid.setData(state.topics);
  }
  const queryable = state.topics.filter((t) => t.kind !== "topic").map((t) => t.name);
  for (const sel of document.querySelectorAll(".topic-select")) {
    const current = sel.value;
    sel.innerHTML = queryable.map((n) => `<option>${escapeHtml(n)}</option>`).join("");
    if (queryable.includes(current)) sel.value = current;
  }
  const views = state.topics.filter((t) => t.kind === "view").map((t) => t.name);
  $("v-view").innerHTML = views.map((n) => `<option>${escapeHtml(n)}</option>`).join("");
}

function escapeHtml(s) {
  return String(s).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

// -- query ---------------------------------------------------------------------------------

$("q-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const spec = { topic: $("q-topic").value, filter: $("q-filter").value, order_by: $("q-order").value, top_n: $("q-top").value };
  $("q-info").textContent = "running…";
  const res = await api("/api/query", spec);
  if (!res.ok) {
    showError($("q-error"), res.data, res.data.field === "order_by" ? $("q-order") : $("q-filter"));
    $("q-info").textContent = "";
    if (state.queryGrid) { state.queryGrid.destroy(); state.queryGrid = null; }
    return;
  }
  showError($("q-error"), null);
  const rows = res.data.rows;
  $("q-info").textContent = `${rows.length} row(s) in ${res.data.elapsed_ms.toFixed(0)} ms` +
    (res.data.truncated ? " (first 1000: give top_n for more)" : "");
  if (state.queryGrid) state.queryGrid.destroy();
  state.queryGrid = grid($("q-grid"), { data: rows, index: KEY, columns: columnsFor(fieldsOf(rows)) });
});

// -- the websocket: live grid and fleet ------------------------------------------------------

function connect() {
  const ws = new WebSocket(`${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`);
  state.ws = ws;
  ws.onmessage = (ev) => {
    const msg = JSON.parse(ev.data);
    if (msg.type === "row") onRow(msg);
    else if (msg.type === "fleet") onFleet(msg);
    else if (msg.type === "subscribed") $("l-state").textContent = `subscribed to ${msg.topic}: loading the SOW…`;
    else if (msg.type === "snapshot_end") $("l-state").textContent = `live: ${msg.rows} row(s) from the SOW, then updates`;
    else if (msg.type === "error") { showError($("l-error"), msg, $("l-filter")); $("l-state").textContent = "not subscribed"; }
  };
  ws.onclose = () => { if (state.ws === ws) setTimeout(connect, 2000); };
}

$("l-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  showError($("l-error"), null);
  $("l-left").innerHTML = "";
  if (state.liveGrid) state.liveGrid.destroy();
  state.liveFields = [KEY];
  state.liveGrid = grid($("l-grid"), { index: KEY, columns: columnsFor(state.liveFields), data: [] });
  await state.liveGrid.ready;
  state.ws.send(JSON.stringify({ op: "subscribe", topic: $("l-topic").value, filter: $("l-filter").value }));
});

$("l-stop").addEventListener("click", () => {
  state.ws.send(JSON.stringify({ op: "unsubscribe" }));
  $("l-state").textContent = "not subscribed";
});

// Row events apply in order: each waits for the one before (Tabulator's calls are async).
let rowChain = Promise.resolve();
function onRow(msg) { rowChain = rowChain.then(() => applyRow(msg)).catch((e) => console.error(e)); }

async function applyRow(msg) {
  const table = state.liveGrid;
  if (!table) return;
  await table.ready;
  const fields = fieldsOf([msg.row], state.liveFields);
  if (fields.length !== state.liveFields.length) {
    state.liveFields = fields;
    table.setColumns(columnsFor(fields));
  }
  if (msg.op === "add") {
    const [row] = (await table.addData([msg.row])) || [];
    const r = row || table.getRow(msg.key);
    if (r) flash(r.getElement(), "fresh");
  } else if (msg.op === "update") {
    await table.updateOrAddData([msg.row]);
    const row = table.getRow(msg.key);
    if (row) for (const f of msg.changed) {
      const cell = row.getCell(f);
      if (cell) flash(cell.getElement(), "flash");
    }
  } else if (msg.op === "remove") {
    const row = table.getRow(msg.key);
    const li = document.createElement("li");
    li.dataset.key = msg.key;
    li.dataset.reason = msg.reason;
    li.innerHTML = `${escapeHtml(msg.key)} <span class="reason">${escapeHtml(msg.reason)}</span> ${escapeHtml(JSON.stringify(withoutKey(msg.row)))}`;
    $("l-left").prepend(li);
    if (row) {
      row.getElement().classList.add("leaving");
      row.getElement().title = `out of focus: ${msg.reason}`;
      setTimeout(() => { const r = table.getRow(msg.key); if (r) r.delete(); }, 800);
    }
  }
}

function withoutKey(row) { const r = { ...row }; delete r[KEY]; return r; }

function flash(el, cls) {
  el.classList.remove(cls);
  void el.offsetWidth; // restart the animation
  el.classList.add(cls);
  setTimeout(() => el.classList.remove(cls), 1500);
}

// -- views: a table and a bar chart of the numbers per group --------------------------------

$("v-view").addEventListener("change", () => { $("v-label").innerHTML = ""; refreshView(); });
$("v-label").addEventListener("change", () => refreshView());
setInterval(() => { if (!$("view-views").hidden) refreshView(); }, 2000);

async function refreshView() {
  const view = $("v-view").value;
  if (!view) return;
  const res = await api("/api/query", { topic: view });
  if (!res.ok) { showError($("v-error"), res.data); return; }
  showError($("v-error"), null);
  const rows = res.data.rows;
  const fields = fieldsOf(rows);
  if (!state.viewGrid || state.viewGridFor !== view) {
    if (state.viewGrid) state.viewGrid.destroy();
    state.viewGrid = grid($("v-grid"), { data: rows, index: KEY, columns: columnsFor(fields) });
    state.viewGridFor = view;
  } else {
    await state.viewGrid.ready;
    state.viewGrid.setColumns(columnsFor(fields));
    state.viewGrid.replaceData(rows);
  }
  const data = fields.filter((f) => f !== KEY);
  const numeric = data.filter((f) => rows.some((r) => typeof r[f] === "number"));
  const labels = data.filter((f) => !numeric.includes(f));
  const labelSel = $("v-label");
  if (!labelSel.options.length) {
    labelSel.innerHTML = [...labels, KEY].map((f) => `<option>${escapeHtml(f)}</option>`).join("");
  }
  const label = labelSel.value || KEY;
  chart("v-chart", "bar", {
    labels: rows.map((r) => String(r[label] ?? "(null)")),
    datasets: numeric.map((f) => ({ label: f, data: rows.map((r) => r[f]) })),
  }, `${view}`);
}

function chart(id, type, data, title, yTitle) {
  const existing = state.charts[id];
  if (existing && existing.config.type === type) {
    existing.data = data;
    existing.update("none");
    return;
  }
  if (existing) existing.destroy();
  state.charts[id] = new Chart($(id), {
    type, data,
    options: {
      animation: false, maintainAspectRatio: false, responsive: true,
      plugins: { title: { display: true, text: title } },
      scales: yTitle ? { y: { beginAtZero: true, title: { display: true, text: yTitle } } } : { y: { beginAtZero: true } },
    },
  });
}

// -- fleet -----------------------------------------------------------------------------------

function onFleet(msg) {
  const rows = msg.rows.map((r) => ({ ...r, warnings: (r.warnings || []).map((w) => w.message || w).join("; ") }));
  const cols = ["topic", "partition", "worker", "watermark", "log_end", "lag", "warnings"];
  const extra = fieldsOf(rows).filter((f) => !cols.includes(f) && f !== "sow" && typeof rows[0]?.[f] !== "object");
  if (!state.fleetGrid) {
    state.fleetGrid = grid($("f-grid"), { data: rows, columns: [...cols, ...extra].map((f) => ({ title: f, field: f })) });
  } else {
    state.fleetGrid.ready.then(() => state.fleetGrid.replaceData(rows));
  }
  const workers = new Set(rows.map((r) => r.worker).filter(Boolean));
  const lag = rows.reduce((a, r) => a + (r.lag || 0), 0);
  $("f-info").textContent = `${rows.length} partition(s) on ${workers.size} worker(s), total log lag ${lag} record(s)`;
  const t = msg.series.map((s) => new Date(s.time * 1000).toLocaleTimeString());
  const throughput = [
    { label: "applied records/s", data: msg.series.map((s) => s.applied_per_s) },
    { label: "published records/s", data: msg.series.map((s) => s.published_per_s) },
  ];
  const latency = [{ label: "status round trip, ms", data: msg.series.map((s) => s.status_ms) }];
  if (msg.prometheus) {
    // the workers' own counters, from their Prometheus endpoints
    throughput.push({ label: "worker: updates applied/s", data: msg.series.map((s) => s.worker_updates_per_s) });
    throughput.push({ label: "worker: messages to subscribers/s", data: msg.series.map((s) => s.worker_delivered_per_s) });
    latency.push({ label: "worker: mean partition query, ms", data: msg.series.map((s) => s.worker_query_ms) });
  }
  chart("f-throughput", "line", { labels: t, datasets: throughput }, "throughput", "records/s");
  chart("f-latency", "line", { labels: t, datasets: latency }, "latency", "ms");
  $("f-errors").textContent = (msg.metrics_errors || []).join("\n");
  $("f-errors").hidden = !(msg.metrics_errors || []).length;
}

start();
