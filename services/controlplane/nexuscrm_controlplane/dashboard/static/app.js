// The operator dashboard: reads the JSON endpoints and redraws in place; it never writes.
"use strict";

const REFRESH_MS = Number(new URLSearchParams(location.search).get("refresh")) || 2000;
const RECEIPTS_SHOWN = 8; // rows per receipt table
const RECEIPTS_LISTED = 50; // what /api/receipts returns at most (overview.RECEIPT_PAGE)
// A coverage page reads every retained range of its identities: proven again every 15th refresh
// (30 s by default), at once when the pack or page changes, or when the operator asks.
const COVERAGE_EVERY = 15;
// A bar's state: its status, or what operators decided of it (held by the order policy block;
// a failure replayed or skipped is no longer a dead letter, so no longer drawn as failed).
const STATES = ["pending", "held", "blocked", "processing", "retry", "completed", "failed", "replayed", "skipped"];
const view = { pack: null, after: "", refreshes: 0, deadLettersPack: "", coveragePack: null, coverageToken: "", coverageRead: null, coverageBusy: false };
const $ = (id) => document.getElementById(id);

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return "<1 s";
  if (seconds < 120) return `${Math.round(seconds)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

// Times come as the command line prints them (docs/output-conventions.md: UTC, to the millisecond,
// with a Z) and are shown as they come; "–" when there is none.
function when(iso) {
  return iso || "–";
}

// A generation's range in the command line's words: "first to last" ordinal (old protocol: no first).
function range(first, last) {
  return first === null || first === undefined ? `old protocol, last ordinal ${last}` : `${first} to ${last}`;
}

// The attempts a generation used, as `nexuscrm work show` says them (attempt counts failed attempts).
function attempts(w) {
  const n = w.attempt, max = w.max_attempts;
  if (w.status === "completed") return `completed on attempt ${n + 1} of ${max}`;
  if (w.status === "failed") return `failed for good after ${n} attempt${n === 1 ? "" : "s"} of ${max}`;
  if (w.status === "processing") return `attempt ${n + 1} of ${max} running`;
  if (n) return `${n} failed; attempt ${n + 1} of ${max} next`;
  return `not attempted yet (up to ${max})`;
}

// What a generation's bar and badge say: "held" for a pending one the order policy block holds,
// "replayed" or "skipped" for a failure an operator resolved, else its status.
function barState(g) {
  return g.held_behind ? "held" : g.resolution || g.status;
}

// The status in words, with what operators decided of it (who skipped it, when and why).
function statusWords(g) {
  if (g.held_behind) return `held by the order policy block behind ${g.held_behind}`;
  if (g.skip) return `failed, skipped at ${when(g.skip.skipped_at)} by ${g.skip.skipped_by}: ${g.skip.reason}`;
  if (g.resolution === "replayed") return "failed, replayed: no longer a dead letter";
  return g.status;
}

function capped(count, cap) {
  return count >= cap ? `${cap}+` : String(count);
}

function stat(metric, label, value, level, explainId) {
  const link = explainId ? ` data-explain="${esc(explainId)}" title="explain ${esc(explainId)}"` : "";
  return `<div class="stat ${level || ""}" data-metric="${metric}"${link}><div class="value">${esc(value)}</div><div class="label">${esc(label)}</div></div>`;
}

function fencesTable(pack) {
  if (!pack.fences.length) return `<p class="muted" data-fences="none">No admission fence.</p>`;
  const rows = pack.fences.map((f) => {
    const overrides = f.overrides.map((o) => `<span title="${esc(o.pack_install_id)}">${esc(o.pack_install_id.slice(0, 11))}…</span>${o.active ? "" : " (expired)"}`).join("<br>") || "–";
    const holds = f.holds_pack ? `<span class="badge bad">holds admission</span>` : f.active ? `<span class="badge ok">overridden</span>` : `<span class="badge">expired</span>`;
    return `<tr data-fence="${esc(f.fence_id)}"><td class="mono">${esc(f.fence_id.slice(0, 8))}</td><td>${esc(f.scope === "*" ? "namespace *" : "this pack")}</td>
      <td>${holds}</td><td>${esc(f.expires_at ? when(f.expires_at) : "never")}</td><td class="mono">${overrides}</td><td>${esc(f.reason)}</td></tr>`;
  });
  return `<table><tr><th>fence</th><th>scope</th><th>state</th><th>expires</th><th>overrides</th><th>reason</th></tr>${rows.join("")}</table>`;
}

function drainBlock(pack) {
  const d = pack.drain;
  if (!d) return `<p class="muted" data-drain="not-applicable">Not applicable: the protocol row is written, old-protocol work was drained before it.</p>`;
  const badge = d.drained ? `<span class="badge ok">drained</span>` : `<span class="badge warn">not drained</span>`;
  const holds = d.holds.map((h) => `<li>${esc(h.reason)}: ${h.count} (${esc(h.sample_work_ids.join(", "))}) <span class="muted">${esc(h.detail)}</span></li>`).join("");
  const counts = ["pending", "blocked", "retry", "processing"].map((k) => `${k} ${d[k]}`).join(", ");
  return `<p data-drain="${d.drained}">${badge} <span class="muted">old-protocol work: ${esc(counts)}</span></p>${holds ? `<ul>${holds}</ul>` : ""}`;
}

function auditBlock(pack) {
  const report = pack.audit_report;
  if (!report) return `<p class="muted">No cutover audit report${pack.protocol.state === "greenfield" ? " (greenfield pack)" : ""}.</p>`;
  const verdict = report.passed ? `<span class="badge ok">passed</span>` : `<span class="badge bad">refused</span>`;
  return `<p>${verdict} ${report.events_audited} Events, ${report.work_items_audited} WorkItems, ${report.identities_audited} identities audited; cutoff ${report.legacy_max_ordinal}</p>
    <details data-details="${esc(pack.pack_install_id)}"><summary>report</summary><pre>${esc(JSON.stringify(report, null, 2))}</pre></details>`;
}

function failuresBlock(pack) {
  if (!pack.failures.length) return "";
  const rows = pack.failures.map((f) => `<tr><td class="mono"><a href="#" data-explain="${esc(f.work_id)}">${esc(f.work_id)}</a></td><td>${esc(range(f.range[0], f.range[1]))}</td><td>${f.attempt}</td><td>${esc(f.last_error)}</td></tr>`);
  return `<h3>Failed generations</h3><table><tr><th>work</th><th>range</th><th>attempts</th><th>last error</th></tr>${rows.join("")}</table>`;
}

function packCard(pack, cap) {
  const q = pack.queue;
  const stats = [
    ...["pending", "blocked", "processing", "retry"].map((s) => stat(s, s, q.depth[s])),
    stat("oldest_waiting", "oldest waiting", age(q.oldest_unclaimed_age_seconds), q.oldest_unclaimed_age_seconds > 60 ? "attention" : "", q.oldest_unclaimed_work_id),
    stat("lag", "end-to-end lag", age(q.end_to_end_lag_seconds), q.end_to_end_lag_seconds > 60 ? "attention" : ""),
    stat("failed", "failed", capped(q.failed, cap), q.dead_letters ? "alert" : ""),
    stat("dead_letters", "dead letters", capped(q.dead_letters, cap), q.dead_letters ? "alert" : ""),
    stat("leases_expired", "leases expired", q.leases_expired, q.leases_expired ? "attention" : ""),
    stat("stranded", "stranded now", capped(q.stranded, cap), q.stranded ? "alert" : ""),
    stat("receipts_waiting", "receipts waiting", capped(q.receipts_waiting, cap), q.receipts_waiting ? "attention" : ""),
    stat("coverage_missing", "coverage missing", capped(q.receipts_coverage_missing, cap), q.receipts_coverage_missing ? "alert" : ""),
  ];
  const selected = pack.pack_install_id === view.pack ? " selected" : "";
  return `<article class="pack${selected}" data-pack="${esc(pack.pack_install_id)}">
    <div class="pack-head" title="show this pack's generations">
      <h2>${esc(pack.pack_name)} ${esc(pack.pack_version)}</h2>
      <span class="badge ${esc(pack.protocol.state)}" data-protocol="${esc(pack.protocol.state)}">${esc(pack.protocol.label)}</span>
      <code>${esc(pack.pack_install_id)}</code><span class="muted">namespace ${esc(pack.namespace)} · ordinal counter ${pack.ordinal_counter}</span>
    </div>
    <div class="stats">${stats.join("")}</div>
    <div class="row">
      <div><h3>Admission fences and overrides</h3>${fencesTable(pack)}</div>
      <div><h3>Drain</h3>${drainBlock(pack)}<h3>Last cutover audit</h3>${auditBlock(pack)}</div>
    </div>
    ${failuresBlock(pack)}
  </article>`;
}

// Replace a section's HTML only when it changed, keeping the reports an operator opened.
function update(element, html) {
  if (element.dataset.html === html) return;
  const open = new Set([...element.querySelectorAll("details[open]")].map((d) => d.dataset.details));
  element.innerHTML = html;
  element.dataset.html = html;
  element.querySelectorAll("details").forEach((d) => { d.open = open.has(d.dataset.details); });
}

function renderPacks(data) {
  if (!data.packs.length) {
    update($("packs"), `<div class="panel muted">No pack is installed yet.</div>`);
    return;
  }
  if (!view.pack || !data.packs.some((p) => p.pack_install_id === view.pack)) view.pack = data.packs[0].pack_install_id;
  update($("packs"), data.packs.map((p) => packCard(p, data.count_cap)).join(""));
}

async function renderTimeline() {
  if (!view.pack) return;
  const data = await getJSON(`/api/packs/${encodeURIComponent(view.pack)}/timeline?after=${encodeURIComponent(view.after)}`);
  $("timeline-pack").textContent = view.pack;
  const gens = data.identities.flatMap((i) => i.generations);
  if (!gens.length) {
    update($("timeline"), `<p class="muted">No generations yet.</p>`);
  } else {
    const low = Math.min(...gens.map((g) => g.start ?? g.end));
    const high = Math.max(...gens.map((g) => g.end));
    const span = Math.max(1, high - low + 1);
    update($("timeline"), data.identities.map((identity) => {
      const bars = identity.generations.map((g) => {
        const start = g.start ?? g.end;
        const left = ((start - low) / span) * 100;
        const width = Math.max(0.4, ((g.end - start + 1) / span) * 100);
        const state = barState(g);
        const title = `${g.work_id}\n${range(g.start, g.end)}, ${statusWords(g)}, ${attempts(g)}${g.replay_of ? `, replay of ${g.replay_of}` : ""}`;
        return `<span class="gen s-${esc(state)}" style="left:${left}%;width:${width}%" title="${esc(title)}" data-explain="${esc(g.work_id)}" data-status="${esc(state)}"></span>`;
      }).join("");
      return `<div class="identity"><div class="name mono" title="${esc(identity.projection_key)}">${esc(identity.label)}</div><div class="track">${bars}</div></div>`;
    }).join("") + `<p class="hint">ordinals ${low} – ${high}</p>`);
  }
  $("timeline-next").hidden = !data.next;
  $("timeline-next").dataset.after = data.next;
}

function receiptRows(rows) {
  if (!rows.length) return `<tr><td class="muted">none</td></tr>`;
  const more = rows.length > RECEIPTS_SHOWN ? `<tr><td class="muted" colspan="4">oldest ${RECEIPTS_SHOWN} of ${rows.length}${rows.length >= RECEIPTS_LISTED ? "+" : ""}; search a key to explain it</td></tr>` : "";
  return `<tr><th>receipt</th><th>pack</th><th>lane</th><th>received at</th></tr>` + rows.slice(0, RECEIPTS_SHOWN).map((r) =>
    `<tr data-receipt="${esc(r.receipt_key)}"><td class="mono"><a href="#" data-explain="${esc(r.receipt_key)}">${esc(r.receipt_key)}</a></td>
      <td class="mono">${esc(r.pack_install_id)}</td><td>${esc(r.lane)}</td><td>${esc(when(r.received_at))}</td></tr>`).join("") + more;
}

async function renderReceipts() {
  // The lists come from Connectors; while it is down they say so and the rest keeps refreshing.
  const [missing, waiting] = await Promise.allSettled([
    getJSON("/api/receipts?state=coverage_missing"),
    getJSON("/api/receipts?state=stored"),
  ]);
  for (const [table, listed] of [["receipts-missing", missing], ["receipts-waiting", waiting]]) {
    update($(table), listed.status === "fulfilled" ? receiptRows(listed.value)
      : `<tr><td class="muted" data-error>${esc(listed.reason.message)}</td></tr>`);
  }
}

function skew(w) {
  if (w.clock_skew_seconds === null) return `<span class="muted">not measured yet</span>`;
  const text = `${w.clock_skew_seconds >= 0 ? "+" : ""}${w.clock_skew_seconds.toFixed(1)} s`;
  return w.skew_flagged ? `<span class="badge bad" title="more than a third of its ${w.lease_seconds} s lease">${esc(text)}</span>` : esc(text);
}

function hostBlock(host) {
  const head = `<h3 class="mono">${esc(host.target)}</h3>`;
  if (host.state !== "answered") {
    return `<div data-host="${esc(host.target)}" data-host-state="${esc(host.state)}">${head}<p><span class="badge bad">${esc(host.state)}</span> <span class="muted">${esc(host.error)}</span></p></div>`;
  }
  const rows = host.workers.map((w) => `<tr data-worker="${esc(w.worker_id)}" data-skew-flagged="${w.skew_flagged}"><td class="mono">${esc(w.worker_id)}</td>
    <td class="mono">${esc(w.pack_install_id)}</td><td>${esc(w.work_type)}</td><td>${esc(w.state)}</td><td>${w.executions}</td>
    <td>${w.lease_seconds} s</td><td data-skew>${skew(w)}</td></tr>`);
  const table = rows.length ? `<table><tr><th>worker</th><th>pack</th><th>work type</th><th>state</th><th>executions</th><th>lease</th><th>clock skew</th></tr>${rows.join("")}</table>`
    : `<p class="muted">No worker: the host waits for its activation gate, or has no pool.</p>`;
  return `<div data-host="${esc(host.target)}" data-host-state="answered">${head}${table}</div>`;
}

async function renderWorkers() {
  // Each host's answer is its own: one that does not answer is marked, the others still show.
  try {
    update($("workers"), (await getJSON("/api/workers")).hosts.map(hostBlock).join(""));
  } catch (error) {
    update($("workers"), `<p class="muted" data-error>${esc(error.message)}</p>`);
  }
}

// The operating panels (issue 37): each asks Connectors; while it is down each says so on its own.
function identityCell(identity) {
  return `<span class="mono" title="${esc(identity.projection_key)}">${esc(identity.label)}</span>`;
}

function pauseScope(p) {
  if (p.scope === "identity") return `identity ${identityCell(p.identity)}`;
  if (p.scope === "work_type") return `work type <code>${esc(p.work_type)}</code>`;
  return "the whole pack";
}

function orderPolicy(policy) {
  if (!policy) return `<p class="muted">Connectors does not know this pack.</p>`;
  const badge = `<span class="badge ${policy.policy === "block" ? "warn" : ""}">${esc(policy.policy)}</span>`;
  const set = policy.default ? `<span class="muted">the default: never set</span>`
    : `<span class="muted">set by ${esc(policy.set_by)} at ${esc(when(policy.set_at))}: ${esc(policy.reason)}</span>`;
  const types = Object.entries(policy.work_types || {}).map(([type, own]) =>
    `<li data-work-type-policy="${esc(type)}">work type ${esc(type)}: <span class="badge ${own.policy === "block" ? "warn" : ""}">${esc(own.policy)}</span>
     <span class="muted">set by ${esc(own.set_by)} at ${esc(when(own.set_at))}: ${esc(own.reason)}</span></li>`).join("");
  return `<p data-order-policy="${esc(policy.policy)}">order policy ${badge} ${set}</p>${types ? `<ul>${types}</ul>` : ""}`;
}

// Retention's limits and the pruner's backlog (decision 181): a backlog that stays means it does not keep up.
function retentionLine(retention) {
  if (!retention) return "";
  const limits = [retention.keep_generations !== null ? `keeps ${retention.keep_generations} generations per identity` : "",
    retention.keep_seconds !== null ? `keeps ${retention.keep_seconds} s` : ""].filter(Boolean).join(", ");
  const backlog = retention.backlog_oldest_finished_at
    ? `<span class="badge warn">${esc(retention.backlog_generations)} generations not pruned yet</span> <span class="muted">the oldest finished at ${esc(when(retention.backlog_oldest_finished_at))}</span>`
    : `<span class="muted">the pruner keeps up</span>`;
  return `<p data-retention-backlog="${esc(retention.backlog_generations)}">retention ${esc(limits)}: ${backlog}</p>`;
}

function pausesBlock(pack) {
  const rows = pack.pauses.map((p) => `<tr data-pause="${esc(p.pause_id)}" data-scope="${esc(p.scope)}"><td>${pauseScope(p)}</td>
    <td>${esc(p.paused_by)}</td><td>${esc(p.reason)}</td><td>${esc(when(p.paused_at))}</td><td>${esc(p.expires_at ? when(p.expires_at) : "until resumed")}</td></tr>`);
  const table = rows.length ? `<table><tr><th>paused</th><th>by</th><th>why</th><th>since</th><th>expires</th></tr>${rows.join("")}</table>`
    : `<p class="muted">Claims are not paused.</p>`;
  const badge = rows.length ? ` <span class="badge bad">paused</span>` : "";
  return `<div data-pauses-pack="${esc(pack.pack_install_id)}" data-paused="${rows.length > 0}"><h3>${esc(pack.pack)} <code>${esc(pack.pack_install_id)}</code>${badge}</h3>
    ${orderPolicy(pack.order_policy)}${retentionLine(pack.retention)}${table}</div>`;
}

async function renderPauses() {
  try {
    const data = await getJSON("/api/claim-pauses");
    update($("pauses"), data.packs.length ? data.packs.map(pausesBlock).join("") : `<p class="muted">No pack is installed yet.</p>`);
  } catch (error) {
    update($("pauses"), `<p class="muted" data-error>${esc(error.message)}</p>`);
  }
}

function duration(seconds) {
  if (!seconds) return "-";
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  return h ? `${h} h ${m} min` : m ? `${m} min ${s} s` : `${s} s`;
}

function flowVersionRow(workType, v) {
  const share = v.inputs_total ? Math.floor((100 * v.inputs_done) / v.inputs_total) : 100;
  const verified = v.verification ? `${esc(v.verification.verdict)} against ${esc(v.verification.against)} at ${esc(v.verification.through_ordinal)}`
    : `<span class="muted">not verified</span>`;
  const failed = v.generations_failed ? ` <span class="badge bad">${esc(v.generations_failed)} failed</span>` : "";
  const state = `<span class="badge ${v.state === "live" ? "" : v.state === "building" ? "warn" : "muted"}">${esc(v.state)}</span>`;
  return `<tr data-flow-version="${esc(workType)}/${esc(v.version)}" data-state="${esc(v.state)}"><td>${esc(workType)}</td><td class="mono">${esc(v.version)}</td>
    <td>${state}${failed}</td><td><progress max="100" value="${share}"></progress> ${esc(v.inputs_done)} of ${esc(v.inputs_total)}</td>
    <td>${esc(v.inputs_per_second.toFixed(1))}/s</td><td>${esc(duration(v.seconds_left))}</td><td>${verified}</td></tr>`;
}

function flowVersionsBlock(pack) {
  const rows = pack.work_types.flatMap((t) => t.versions.map((v) => flowVersionRow(t.work_type, v)));
  const table = rows.length ? `<table><tr><th>work type</th><th>version</th><th>state</th><th>inputs done</th><th>rate</th><th>left</th><th>verified</th></tr>${rows.join("")}</table>`
    : `<p class="muted">One version per work type: no version was built.</p>`;
  return `<div data-flow-versions-pack="${esc(pack.pack_install_id)}"><h3>${esc(pack.pack)} <code>${esc(pack.pack_install_id)}</code></h3>${table}</div>`;
}

async function renderFlowVersions() {
  try {
    const data = await getJSON("/api/flow-versions");
    update($("flow-versions"), data.packs.length ? data.packs.map(flowVersionsBlock).join("") : `<p class="muted">No pack is installed yet.</p>`);
  } catch (error) {
    update($("flow-versions"), `<p class="muted" data-error>${esc(error.message)}</p>`);
  }
}

function deadLettersBlock(pack, pageSize) {
  const counted = pack.complete ? "" : ` <span class="muted">(counted among the ${esc(pack.examined)} oldest failed generations)</span>`;
  const identities = pack.identities.map((i) => `<tr><td>${identityCell(i.identity)}</td><td>${esc(i.dead_letters)}</td></tr>`).join("");
  const rows = pack.dead_letters.map((d) => `<tr data-dead-letter="${esc(d.work_id)}"><td class="mono"><a href="#" data-explain="${esc(d.work_id)}">${esc(d.work_id)}</a></td>
    <td>${identityCell(d.identity)}</td><td>${esc(range(d.range[0], d.range[1]))}</td><td>${esc(attempts({ ...d, status: "failed" }))}</td>
    <td>${esc(d.last_error)}</td><td>${esc(when(d.finished_at))}</td></tr>`).join("");
  const more = pack.more ? `<p class="muted">The oldest ${esc(pageSize)} of ${esc(pack.total)}; <code>nexuscrm dead-letters list ${esc(pack.pack_install_id)}</code> pages through them all.</p>` : "";
  return `<div data-dead-letters-pack="${esc(pack.pack_install_id)}"><h3>${esc(pack.pack)} <code>${esc(pack.pack_install_id)}</code></h3>
    <p data-total="${esc(pack.total)}"><span class="badge bad">${esc(pack.total)} dead letter${pack.total === 1 ? "" : "s"}</span>${counted}</p>
    <div class="columns"><div><table><tr><th>identity</th><th>dead letters</th></tr>${identities}</table></div><div></div></div>
    <table><tr><th>work</th><th>identity</th><th>range</th><th>attempts</th><th>last error</th><th>finished at</th></tr>${rows}</table>${more}</div>`;
}

async function renderDeadLetters() {
  try {
    const data = await getJSON(`/api/dead-letters?pack=${encodeURIComponent(view.deadLettersPack)}`);
    $("replay-command").textContent = data.replay_command;
    update($("dead-letters"), data.packs.length ? data.packs.map((p) => deadLettersBlock(p, data.page_size)).join("")
      : `<p class="muted" data-dead-letters="none">No dead letters.</p>`);
  } catch (error) {
    update($("dead-letters"), `<p class="muted" data-error>${esc(error.message)}</p>`);
  }
}

function deadLettersFilter(packs) {
  const options = [`<option value="">every pack</option>`, ...packs.map((p) =>
    `<option value="${esc(p.pack_install_id)}">${esc(p.pack_name)} ${esc(p.pack_version)} (${esc(p.pack_install_id.slice(0, 11))}…)</option>`)];
  if (!packs.some((p) => p.pack_install_id === view.deadLettersPack)) view.deadLettersPack = "";
  update($("dead-letters-pack"), options.join(""));
  $("dead-letters-pack").value = view.deadLettersPack;
}

function coverageRow(i) {
  const ranges = Object.entries(i.ranges).filter(([, n]) => n).map(([state, n]) => `${state} ${n}`).join(", ") || "–";
  const listed = i.exceptions.map((e) => `${e.kind} ${e.start} to ${e.end}${e.work_ids.length ? ` (${e.work_ids.join(", ")})` : ""}`);
  const more = i.exception_count - i.exceptions.length;
  const exceptions = [...listed, ...(more > 0 ? [`${more} more`] : [])].join("; ") || "–";
  const tiled = i.tiled ? `<span class="badge ok">tiled</span>` : `<span class="badge bad">not tiled</span>`;
  return `<tr class="${i.tiled ? "" : "not-tiled"}" data-identity="${esc(i.identity.projection_key)}" data-tiled="${i.tiled}">
    <td>${identityCell(i.identity)}</td><td>${esc(i.high_water_ordinal)}</td><td>${tiled}</td><td>${esc(i.inputs)}</td><td>${esc(ranges)}</td><td data-exceptions>${esc(exceptions)}</td></tr>`;
}

async function renderCoverage(now = false) {
  if (!view.pack || view.coverageBusy) return;
  if (view.coveragePack !== view.pack) {
    view.coveragePack = view.pack;
    view.coverageToken = "";
    now = true;
  }
  const due = view.coverageRead === null || view.refreshes - view.coverageRead >= COVERAGE_EVERY;
  if (!now && !due) return;
  view.coverageBusy = true;
  view.coverageRead = view.refreshes;
  $("coverage-pack").textContent = view.pack;
  let next = "";
  try {
    const data = await getJSON(`/api/packs/${encodeURIComponent(view.pack)}/coverage?page_token=${encodeURIComponent(view.coverageToken)}`);
    next = data.next;
    if (!data.provable) {
      update($("coverage"), `<p class="muted" data-provable="false">${esc(data.explanation)}</p>`);
    } else if (!data.identities.length) {
      update($("coverage"), `<p class="muted">No projection identity on this page.</p>`);
    } else {
      const head = `<p data-not-tiled="${esc(data.not_tiled)}">${esc(data.identities.length)} identit${data.identities.length === 1 ? "y" : "ies"} on this page; ${data.not_tiled
        ? `<span class="badge bad">${esc(data.not_tiled)} not tiled</span>` : `<span class="badge ok">every one tiled</span>`}</p>`;
      update($("coverage"), `${head}<table><tr><th>identity</th><th>high-water ordinal</th><th>tiled</th><th>inputs</th><th>ranges by state</th><th>first exceptions</th></tr>${data.identities.map(coverageRow).join("")}</table>`);
    }
  } catch (error) {
    update($("coverage"), `<p class="muted" data-error>${esc(error.message)}</p>`);
  } finally {
    view.coverageBusy = false;
  }
  $("coverage-next").hidden = !next;
  $("coverage-next").dataset.token = next;
  $("coverage-first").hidden = !view.coverageToken;
}

function workDetails(w) {
  const detail = w.held_behind || w.resolution ? statusWords(w) : w.status_detail;
  return `<dt>work</dt><dd class="mono">${esc(w.work_id)}</dd><dt>pack</dt><dd class="mono">${esc(w.pack_install_id)}</dd>
    <dt>source lane</dt><dd>${esc(w.identity)}</dd><dt>range</dt><dd data-range>${esc(range(w.range[0], w.range[1]))}${w.members !== null ? ` · ${w.members} members` : ""}</dd>
    <dt>status</dt><dd data-status="${esc(barState(w))}"><span class="badge">${esc(barState(w))}</span> ${esc(detail)}</dd>
    <dt>attempts</dt><dd>${esc(attempts(w))}${w.last_error ? ` · last error: ${esc(w.last_error)}` : ""}</dd>
    ${w.replay_of ? `<dt>replay of</dt><dd class="mono">${esc(w.replay_of)}</dd>` : ""}`;
}

// Each attempt that did not complete the generation, and the newest traceback.
function attemptHistory(r) {
  if (!r.attempts.length) return "";
  const listed = r.attempt_count > r.attempts.length ? `<p class="muted">the newest ${r.attempts.length} of ${r.attempt_count} attempts</p>` : "";
  const rows = r.attempts.map((a) => `<tr><td>${a.attempt}</td><td>${esc(a.outcome)}</td><td class="mono">${esc(a.worker_id)}</td>
    <td>${esc(when(a.started_at))}</td><td>${esc(when(a.finished_at))}</td><td>${esc(a.error)}</td></tr>`).join("");
  const traceback = r.last_traceback ? `<dt>last traceback</dt><dd><pre data-traceback>${esc(r.last_traceback)}</pre></dd>` : "";
  return `<dt>attempt history</dt><dd>${listed}<table data-attempts><tr><th>attempt</th><th>outcome</th><th>worker</th><th>started</th><th>ended</th><th>error</th></tr>${rows}</table></dd>${traceback}`;
}

function renderResult(r) {
  if (r.kind === "work") return `<div class="result" data-kind="work"><strong>Generation</strong><dl>${workDetails(r)}${attemptHistory(r)}</dl></div>`;
  if (r.kind === "none") return `<div class="result none" data-kind="none">${esc(r.explanation)}</div>`;
  if (r.kind === "pruned") return `<div class="result" data-kind="pruned"><strong>Generation <code>${esc(r.work_id)}</code></strong>
    <dl><dt>why</dt><dd data-explanation>${esc(r.explanation)}</dd></dl></div>`;
  const covered = r.covered_by ? workDetails(r.covered_by) : "";
  return `<div class="result" data-kind="receipt"><strong>Receipt <code>${esc(r.receipt_key)}</code></strong>
    <dl><dt>state</dt><dd>${esc(r.receipt_state)}</dd><dt>ordinal</dt><dd>${esc(r.enqueue_ordinal ?? "none (not admitted)")}</dd>
    <dt>why</dt><dd data-explanation>${esc(r.explanation)}</dd>${covered}</dl></div>`;
}

async function explain(text) {
  $("search-input").value = text;
  const box = $("search-results");
  box.hidden = false;
  try {
    const found = await getJSON(`/api/search?q=${encodeURIComponent(text)}`);
    box.innerHTML = found.map(renderResult).join("");
  } catch (error) {
    box.innerHTML = `<div class="result none" data-kind="error">${esc(error.message)}</div>`;
  }
}

async function refresh() {
  try {
    const overview = await getJSON("/api/overview");
    renderPacks(overview);
    deadLettersFilter(overview.packs);
    renderCoverage(); // not awaited: a proof that takes seconds must not hold back the rest of the page
    await Promise.all([renderTimeline(), renderReceipts(), renderWorkers(), renderPauses(), renderDeadLetters(), renderFlowVersions()]);
    view.refreshes += 1;
    $("refreshed").textContent = `refreshed ${when(overview.now)}`;
    $("refreshed").dataset.count = String(view.refreshes);
  } catch (error) {
    $("refreshed").textContent = `refresh failed: ${error.message}`;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("legend").innerHTML = STATES.map((s) => `<span style="--c: var(--${s})">${s}</span>`).join("");
  $("search").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("search-input").value.trim();
    if (text) explain(text);
  });
  document.body.addEventListener("click", (event) => {
    const target = event.target.closest("[data-explain]");
    if (target) {
      event.preventDefault();
      explain(target.dataset.explain);
      return;
    }
    const head = event.target.closest(".pack-head");
    if (head) {
      view.pack = head.parentElement.dataset.pack;
      view.after = "";
      document.querySelectorAll(".pack").forEach((p) => p.classList.toggle("selected", p.dataset.pack === view.pack));
      renderTimeline();
      renderCoverage();
    }
  });
  $("dead-letters-pack").addEventListener("change", () => {
    view.deadLettersPack = $("dead-letters-pack").value;
    renderDeadLetters();
  });
  $("coverage-next").addEventListener("click", () => {
    view.coverageToken = $("coverage-next").dataset.token;
    renderCoverage(true);
  });
  $("coverage-first").addEventListener("click", () => {
    view.coverageToken = "";
    renderCoverage(true);
  });
  $("coverage-again").addEventListener("click", () => renderCoverage(true));
  $("timeline-next").addEventListener("click", () => {
    view.after = $("timeline-next").dataset.after;
    renderTimeline();
  });
  refresh();
});
