// ContextRender session view: the transcript, the reuse edges (use -> source result, labelled with the value),
// each result's state under one or two policies at the chosen invocation, the scores behind it, and the
// Later-Used Result Recall events (hit / missed), and the calls that needed a value only earlier tool results held:
// ready (every such value visible in the render before the call) or not, per policy; for a stored session, its model
// requests as the upstream billed them (prompt-cache reads and writes). All data is inline (#cr-data); nothing is
// fetched.
(function () {
  "use strict";
  var D = JSON.parse(document.getElementById("cr-data").textContent);
  var PREVIEW = 200, PREVIEW_LINES = 3;
  var NAMES = {F: "full", I: "ids (values kept)", T: "table (values kept)", C: "compacted", O: "omitted", S: "stub",
               N: "not rendered", "-": "later"};
  var REASONS = {p: "picked", n: "not a candidate", f: "did not fit"};
  var bySeq = {}, resultIndex = {}, toolNames = {};
  D.messages.forEach(function (m) { bySeq[m.seq] = m; });
  D.results.forEach(function (r) { resultIndex[r.seq] = r.index; toolNames[r.tool] = true; });
  // state.t indexes D.invocations (the drawn window); D.invocations[k].t is the invocation's own number.
  var state = {a: D.policies[0], b: D.policies[1] || "", t: D.invocations.length - 1, tool: "", recall: true,
               collapse: true, selected: null, only: null};
  var W = D.window || {from: 0, to: D.invocations.length - 1, invocations: D.invocations.length, first_seq: 0,
                       earlier_results: 0};
  function position(t) { return Math.max(0, Math.min(D.invocations.length - 1, t - W.from)); }

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    return e;
  }

  // -- controls ---------------------------------------------------------------------------------------------------
  var controls = document.getElementById("controls");
  function select(label, options, value, onChange, id) {
    var wrap = el("label", {}, label + " ");
    var s = el("select", {id: id});
    options.forEach(function (o) { var opt = el("option", {value: o[0]}, o[1]); if (o[0] === value) opt.selected = true; s.appendChild(opt); });
    s.addEventListener("change", function () { onChange(s.value); });
    wrap.appendChild(s); controls.appendChild(wrap); return s;
  }
  var pol = D.policies.map(function (p) { return [p, p]; });
  select("policy A", pol, state.a, function (v) { state.a = v; refresh(); }, "policy-a");
  select("policy B", [["", "(none)"]].concat(pol), state.b, function (v) { state.b = v; refresh(); }, "policy-b");
  var invLabel = el("span", {id: "inv-label"});
  var slider = el("input", {type: "range", min: 0, max: D.invocations.length - 1, value: state.t, id: "invocation"});
  slider.addEventListener("input", function () { state.t = +slider.value; refresh(); });
  var wrapInv = el("label", {}, "invocation "); wrapInv.appendChild(slider); wrapInv.appendChild(invLabel); controls.appendChild(wrapInv);
  var jump = el("input", {type: "number", min: W.from, max: W.to, id: "jump", style: "width:5em"});
  jump.addEventListener("change", function () {
    var t = position(+jump.value || 0);
    state.t = t; slider.value = t; refresh();
    var row = document.getElementById("m-" + D.invocations[t].seq) || document.getElementById("m-" + (D.invocations[t].seq - 1));
    if (row) row.scrollIntoView({block: "center"});
  });
  var wrapJump = el("label", {}, "jump to turn "); wrapJump.appendChild(jump); controls.appendChild(wrapJump);
  if (W.from > 0 || W.to < W.invocations - 1) {  // a window of a longer session: say what is left out
    controls.appendChild(el("span", {id: "window-note", "class": "hint"},
      "drawn: model calls " + W.from + "–" + W.to + " of the session's 0–" + (W.invocations - 1) +
      " (--from/--to/--last pick others); messages before #" + W.first_seq + " are not drawn, except the " +
      W.earlier_results + " earlier tool results these renders still show"));
  }
  // -- prompt cache: a stored session's requests as the upstream billed them (docs/service.md) --------------------
  var CACHE = D.cache;
  function pct(part, whole) { return whole ? (100 * part / whole).toFixed(1) + " %" : "–"; }
  if (CACHE && CACHE.totals.requests) {
    var T = CACHE.totals;
    controls.appendChild(el("span", {id: "cache-note", "class": "hint"},
      "prompt cache as billed: " + T.requests + " requests (" + T.requests_with_usage + " with usage) · read " +
      T.cache_read + " of " + T.prompt + " prompt tokens (" + pct(T.cache_read, T.prompt) + ") · written " +
      T.cache_write + " · output " + T.output));
  }
  function cacheAt(t) {  // t: the invocation's own number; one entry per request that answered it
    var rows = CACHE ? CACHE.by_invocation[String(t)] : null;
    if (!rows) return "";
    return rows.map(function (r) {
      return r[2] === null ? "billed: no usage reported" :
        "billed: read " + r[3] + " of " + r[2] + " prompt tokens (" + pct(r[3], r[2]) + "), written " + r[4];
    }).join("; ");
  }
  select("tool", [["", "all tools"]].concat(Object.keys(toolNames).sort().map(function (t) { return [t, t]; })), "",
         function (v) { state.tool = v; applyFilter(); drawEdges(); }, "tool-filter");
  var onlyBox = el("label", {}); var onlyCheck = el("input", {type: "checkbox", id: "only-selected"});
  onlyCheck.addEventListener("change", function () { state.only = onlyCheck.checked && state.selected !== null ? state.selected : null;
                                                     applyFilter(); drawEdges(); });
  onlyBox.appendChild(onlyCheck); onlyBox.appendChild(document.createTextNode(" only the selected result and its reuses"));
  controls.appendChild(onlyBox);
  function checkbox(label, value, onChange, id) {
    var w = el("label", {}); var c = el("input", {type: "checkbox", id: id}); c.checked = value;
    c.addEventListener("change", function () { onChange(c.checked); }); w.appendChild(c); w.appendChild(document.createTextNode(" " + label));
    controls.appendChild(w);
  }
  checkbox("recall events", state.recall, function (v) { state.recall = v; drawEdges(); }, "show-recall");
  checkbox("collapse long messages", state.collapse, function (v) { state.collapse = v; renderTexts(); drawEdges(); }, "collapse");
  var legend = el("span", {"class": "legend"});
  ["F", "I", "T", "C", "S", "O", "N"].forEach(function (c) { var s = el("span"); s.appendChild(el("i", {"class": "s-" + c}, c)); s.appendChild(document.createTextNode(" " + NAMES[c])); legend.appendChild(s); });
  controls.appendChild(legend);

  // -- the timeline ------------------------------------------------------------------------------------------------
  var timeline = document.getElementById("timeline");
  var svgNS = "http://www.w3.org/2000/svg";
  var svg = document.createElementNS(svgNS, "svg"); svg.setAttribute("id", "edges"); timeline.appendChild(svg);
  var rows = {};
  D.messages.forEach(function (m) {
    var row = el("div", {"class": "msg role-" + m.role, id: "m-" + m.seq, "data-seq": m.seq, "data-role": m.role,
                          "data-turn": m.invocation});
    var meta = el("div", {"class": "meta"});
    meta.appendChild(el("b", {}, "#" + m.seq));
    meta.appendChild(el("span", {}, m.role + (m.role === "assistant" ? " (turn " + m.invocation + ")" : "")));
    if (m.role === "tool") {
      var r = D.results[resultIndex[m.seq]];
      meta.appendChild(el("span", {"class": "tool"}, r.tool + " · " + r.tokens + " tok · from turn " + r.invocation));
      var badges = el("span", {"class": "badges"});
      meta.appendChild(badges);
      row.addEventListener("click", function (ev) { if (ev.target.classList.contains("more")) return; selectResult(m.seq); });
    } else {
      meta.appendChild(el("span", {}, m.tokens + " tok"));
    }
    row.appendChild(meta);
    row.appendChild(el("div", {"class": "text"}));
    m.calls.forEach(function (c) { row.appendChild(el("div", {"class": "call", "data-call": c.id}, "→ " + c.name + "(" + c.args + ")")); });
    timeline.appendChild(row);
    rows[m.seq] = row;
  });

  function renderTexts() {
    D.messages.forEach(function (m) {
      var box = rows[m.seq].querySelector(".text");
      box.textContent = "";
      var lines = m.text.split("\n");
      var long = m.text.length > PREVIEW || lines.length > PREVIEW_LINES;
      var expanded = rows[m.seq].getAttribute("data-expanded") === "1";
      var preview = lines.slice(0, PREVIEW_LINES).join("\n").slice(0, PREVIEW);
      box.appendChild(document.createTextNode(state.collapse && long && !expanded ? preview + " …" : m.text));
      if (long && state.collapse) {
        var more = el("span", {"class": "more"}, expanded ? " [collapse]" : " [expand " + m.chars + " chars]");
        more.addEventListener("click", function () { rows[m.seq].setAttribute("data-expanded", expanded ? "0" : "1"); renderTexts(); drawEdges(); });
        box.appendChild(more);
      }
    });
  }

  function applyFilter() {
    var keep = null;
    if (state.only !== null) {  // one result, its call, every message that reuses it, and the next invocation
      var r = D.results[resultIndex[state.only]];
      keep = {}; keep[state.only] = 1; keep[r.call_seq] = 1;
      D.edges.forEach(function (e) { if (e.source === state.only) keep[e.op] = 1; });
      var last = D.invocations[state.t].seq; keep[last] = 1; keep[last - 1] = 1;
    }
    D.messages.forEach(function (m) {
      var hide = keep !== null && !(m.seq in keep);
      if (state.tool && m.role === "tool") hide = hide || D.results[resultIndex[m.seq]].tool !== state.tool;
      rows[m.seq].classList.toggle("hidden", hide);
    });
  }

  function stateAt(policy, t, seq) {
    var codes = D.states[policy] && D.states[policy][t];
    return codes ? codes.charAt(resultIndex[seq]) : "-";
  }

  // -- call readiness: a badge per needing call, per policy ---------------------------------------------------------
  var R = D.readiness || {calls: [], missing: {}};
  function readyShare(p) {
    var miss = R.missing[p] || [], n = miss.length, ok = miss.filter(function (m) { return m.length === 0; }).length;
    return n ? p + " call readiness " + Math.round(100 * ok / n) + "% (" + ok + "/" + n + ")" : "";
  }
  function drawReadiness() {
    R.calls.forEach(function (c, k) {
      var row = rows[c[0]]; if (!row) return;
      var div = row.querySelector('.call[data-call="' + CSS.escape(c[1]) + '"]'); if (!div) return;
      var old = div.querySelectorAll(".ready"); old.forEach(function (x) { x.remove(); });
      [state.a, state.b].forEach(function (p) {
        if (!p || !R.missing[p]) return;
        var miss = R.missing[p][k];
        var b = el("span", {"class": "ready " + (miss.length ? "not-ready" : "is-ready"), "data-policy": p,
                            title: "needs " + c[3].join(", ") + " (from #" + c[4].join(", #") + ")"},
                   " " + p + (miss.length ? " NOT READY: " + miss.join(", ") : " ready"));
        div.appendChild(b);
      });
    });
  }

  function refresh() {
    var inv = D.invocations[state.t];
    var parts = ["model call " + inv.t + " (made before message #" + inv.seq + "): the whole history is " +
                 inv.full_tokens + " tokens, the budget B = " + D.budget];
    [state.a, state.b].forEach(function (p) { if (p) parts.push(p + " sends " + D.tokens[p][state.t] + " of them"); });
    [state.a, state.b].forEach(function (p) { var r = p ? readyShare(p) : ""; if (r) parts.push(r); });
    var billed = cacheAt(inv.t); if (billed) parts.push(billed);
    invLabel.textContent = " " + parts.join(" · ");
    drawReadiness();
    jump.value = inv.t;
    D.messages.forEach(function (m) {
      var row = rows[m.seq];
      row.classList.toggle("later", m.seq >= inv.seq);
      row.classList.toggle("current", m.seq === inv.seq);
      if (m.role !== "tool") return;
      var badges = row.querySelector(".badges"); badges.textContent = "";
      [state.a, state.b].forEach(function (p) {
        if (!p) return;
        var c = stateAt(p, state.t, m.seq);
        badges.appendChild(el("span", {"class": "state s-" + c, "data-policy": p, "data-seq": m.seq, "data-state": NAMES[c],
                                       title: p + ": " + NAMES[c]}, p + " " + NAMES[c]));
      });
    });
    drawEdges();
    if (state.selected !== null) selectResult(state.selected);
  }

  // -- edges: from each use back to its source result --------------------------------------------------------------
  function drawEdges() {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    var inv = D.invocations[state.t];
    var hit = {};
    if (state.recall && state.a) {
      D.recall.events.forEach(function (e, k) { hit[e[0] + ":" + e[1]] = D.recall.hits[state.a][k]; });
    }
    var top = timeline.getBoundingClientRect().top;
    var labelsAt = {};  // several values reused by one message: stack their labels
    var h = timeline.scrollHeight; svg.setAttribute("width", 170); svg.setAttribute("height", h);
    D.edges.forEach(function (e) {
      var src = rows[e.source], op = rows[e.op];
      if (!src || !op || src.classList.contains("hidden") || op.classList.contains("hidden")) return;
      var y1 = src.getBoundingClientRect().top - top + 12, y2 = op.getBoundingClientRect().top - top + 12;
      var depth = Math.min(150, 18 + Math.abs(y2 - y1) / 12);
      var x = 168;
      var p = document.createElementNS(svgNS, "path");
      p.setAttribute("d", "M " + x + " " + y2 + " C " + (x - depth) + " " + y2 + ", " + (x - depth) + " " + y1 + ", " + x + " " + y1);
      p.setAttribute("class", "edge");
      p.setAttribute("data-source", e.source); p.setAttribute("data-op", e.op); p.setAttribute("data-value", e.value);
      var turn = bySeq[e.op].invocation, key = turn + ":" + e.source;
      if (state.recall && key in hit) p.classList.add(hit[key] ? "edge-hit" : "edge-miss");
      if (state.selected === e.source) p.classList.add("selected");
      var title = document.createElementNS(svgNS, "title");
      title.textContent = "#" + e.op + " reuses " + e.value + " from #" + e.source;
      p.appendChild(title);
      svg.appendChild(p);
      if (state.selected === e.source || D.edges.length <= 12) {  // labels only where they stay readable
        var label = document.createElementNS(svgNS, "text");
        var ly = Math.round((y1 + y2) / 2);
        while (labelsAt[ly]) ly += 11;
        labelsAt[ly] = 1;
        label.setAttribute("x", x - depth - 2); label.setAttribute("y", ly);
        label.setAttribute("text-anchor", "end"); label.setAttribute("class", "edge-label");
        label.textContent = e.value.length > 22 ? e.value.slice(0, 21) + "…" : e.value;
        svg.appendChild(label);
      }
    });
    void inv;
  }

  // -- details of one result ------------------------------------------------------------------------------------------
  var details = document.getElementById("details");
  function selectResult(seq) {
    state.selected = seq;
    Object.keys(rows).forEach(function (k) { rows[k].classList.toggle("focus", +k === seq); });
    var r = D.results[resultIndex[seq]];
    details.textContent = "";
    details.appendChild(el("h3", {}, "#" + seq + " " + r.tool));
    details.appendChild(el("p", {}, r.tokens + " tokens · produced by turn " + r.invocation + " · at t = " +
                           D.invocations[state.t].t));
    var table = el("table", {"id": "scores"});
    var head = el("tr"); ["", "state", "age", "c_t", "s_t", "U_t", "D(r,S)", "pick", "reason"].forEach(function (h) { head.appendChild(el("th", {}, h)); });
    table.appendChild(head);
    [state.a, state.b].forEach(function (p) {
      if (!p) return;
      var tr = el("tr", {"data-policy": p});
      tr.appendChild(el("td", {}, p));
      tr.appendChild(el("td", {}, NAMES[stateAt(p, state.t, seq)]));
      var row = D.scores[p] && D.scores[p][state.t] && D.scores[p][state.t][resultIndex[seq]];
      var vals = row ? [row[0], row[1], row[2], row[3], row[4], row[5] === null ? "" : row[5], REASONS[row[6]] || row[6]] : ["", "", "", "", "", "", ""];
      vals.forEach(function (v) { tr.appendChild(el("td", {}, v === null ? "" : String(v))); });
      table.appendChild(tr);
    });
    details.appendChild(table);
    var uses = D.edges.filter(function (e) { return e.source === seq; });
    details.appendChild(el("h4", {}, "reused by (" + uses.length + ")"));
    var ul = el("ul");
    uses.forEach(function (e) { ul.appendChild(el("li", {}, "#" + e.op + " (turn " + bySeq[e.op].invocation + "): " + e.value)); });
    details.appendChild(ul);
    var ev = [];
    D.recall.events.forEach(function (e, k) { if (e[1] === seq) ev.push([e, k]); });
    details.appendChild(el("h4", {}, "recall events (" + ev.length + ")"));
    var ul2 = el("ul");
    ev.forEach(function (x) {
      var e = x[0], k = x[1];
      var txt = "turn " + e[0] + ", age " + e[2] + ": " + D.policies.map(function (p) { return p + " " + (D.recall.hits[p][k] ? "hit" : "MISSED"); }).join(", ");
      ul2.appendChild(el("li", {"data-turn": e[0]}, txt));
    });
    details.appendChild(ul2);
    drawEdges();
  }

  renderTexts();
  // #t=18&seq=20 (or #seq=20): open at an invocation and a result, e.g. from a bug report or a README link;
  // &only=1 shows just that result, its call, the messages that reuse it and the next invocation.
  var hash = {};
  location.hash.replace(/^#/, "").split("&").forEach(function (kv) { var p = kv.split("="); if (p[0]) hash[p[0]] = p[1]; });
  if (hash.t !== undefined && +hash.t >= W.from && +hash.t <= W.to) { state.t = position(+hash.t); slider.value = state.t; }
  if (hash.only && hash.seq !== undefined && (+hash.seq) in resultIndex) state.only = +hash.seq;
  onlyCheck.checked = state.only !== null;
  applyFilter();
  refresh();
  if (hash.seq !== undefined && (+hash.seq) in resultIndex) {
    selectResult(+hash.seq);
    // After layout: the header is sticky, so leave room for it above the result.
    setTimeout(function () { window.scrollTo(0, rows[+hash.seq].getBoundingClientRect().top + window.scrollY - 120); }, 0);
  }
  window.addEventListener("resize", drawEdges);
  if (hash.bench) {  // #bench=1: time moving the invocation slider (refresh + edges), for the README's figure
    var b0 = performance.now(), n = 10;
    for (var i = 0; i < n; i++) { state.t = (state.t + 1) % D.invocations.length; refresh(); }
    document.body.setAttribute("data-refresh-ms", String(Math.round((performance.now() - b0) / n)));
  }
  document.body.setAttribute("data-ready", "1");
  document.body.setAttribute("data-render-ms", String(Math.round(performance.now())));
})();
