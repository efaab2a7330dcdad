// Saga console: a small single-page client of the admin API (/api/...).
// Everything is built with DOM calls and textContent, never innerHTML, so no
// value from the API is ever interpreted as markup. The one exception is the
// state diagram, an SVG the server draws: it is parsed as an XML document
// (DOMParser, which runs nothing), pruned to an allowlist of SVG elements
// and attributes, and only then adopted into the page (see diagramView).
"use strict";

(function () {
  const TOKEN_KEY = "saga-admin-token";
  const $ = (id) => document.getElementById(id);
  let me = null; // {name, role}
  let types = []; // GET api/types

  // el builds an element: el("td", {class: "mono"}, "text", child, ...).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  function showError(msg) {
    const box = $("error");
    box.textContent = msg || "";
    box.hidden = !msg;
  }

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.error) || ("HTTP " + status));
      this.status = status;
      this.body = body || {};
    }
  }

  // api calls the admin API with the session's token. A 401 forgets the
  // token and shows the sign-in form.
  // With opts.text it returns the body of a successful answer as text.
  async function api(path, opts) {
    opts = opts || {};
    const headers = { "Authorization": "Bearer " + token(), "Accept": opts.text ? "*/*" : "application/json" };
    let body;
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.body);
    }
    const res = await fetch("api/" + path, { method: opts.method || "GET", headers, body });
    if (opts.text && res.ok) return res.text();
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      me = null;
      route();
      throw new APIError(401, data);
    }
    if (!res.ok) throw new APIError(res.status, data);
    return data;
  }

  const fmtTime = (t) => (t ? new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z") : "");
  const short = (name) => (name ? name.slice(name.lastIndexOf(".") + 1) : "");
  const canRepair = () => me && me.role === "repair";

  function parseHash() {
    const h = location.hash.replace(/^#\/?/, "");
    const [path, qs] = h.split("?");
    return { parts: (path || "sagas").split("/").map(decodeURIComponent), params: new URLSearchParams(qs || "") };
  }

  async function route() {
    showError("");
    if (!token()) {
      $("login").hidden = false;
      $("nav").hidden = true;
      $("view").replaceChildren();
      $("who").replaceChildren();
      $("token").focus();
      return;
    }
    $("login").hidden = true;
    $("nav").hidden = false;
    try {
      if (!me) {
        me = (await api("whoami")).principal;
        types = await api("types");
        $("who").replaceChildren(
          el("span", { id: "who-name" }, me.name + " (" + me.role + ")"),
          el("button", { class: "secondary", id: "logout", onclick: logout }, "Sign out"));
      }
      const { parts, params } = parseHash();
      for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === location.hash);
      if (parts[0] === "saga" && parts[1]) await showSaga(parts[1]);
      else if (parts[0] === "types") await showTypes(parts[1]);
      else if (parts[0] === "parked") await showParked(params);
      else await showSagas(params);
    } catch (e) {
      if (!(e instanceof APIError && e.status === 401)) showError(e.message);
    }
  }

  function logout() {
    sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    location.hash = "#/sagas";
    route();
  }

  // ---- saga list ----------------------------------------------------------

  async function showSagas(params) {
    const view = $("view");
    const typeSel = el("select", { id: "f-type", name: "type" }, el("option", { value: "" }, "all types"),
      types.map((t) => el("option", { value: t.name, selected: params.get("type") === t.name }, t.name)));
    const stateSel = el("select", { id: "f-state", name: "state" });
    const fillStates = () => {
      const names = new Set();
      for (const t of types) if (!typeSel.value || t.name === typeSel.value) for (const s of t.states) names.add(s.name);
      stateSel.replaceChildren(el("option", { value: "" }, "any state"),
        [...names].map((n) => el("option", { value: n, selected: params.get("state") === n }, n)));
    };
    fillStates();
    typeSel.addEventListener("change", fillStates);
    const stuck = el("input", { type: "checkbox", id: "f-stuck", checked: params.get("stuck") === "true" });
    const review = el("input", { type: "checkbox", id: "f-review", checked: params.get("review") === "true" });
    const key = el("input", { type: "text", id: "f-key", placeholder: "business key", value: params.get("business_key") || "" });
    const form = el("form", { class: "filters card", id: "saga-filters", onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (typeSel.value) q.set("type", typeSel.value);
      if (stateSel.value) q.set("state", stateSel.value);
      if (key.value) q.set("business_key", key.value);
      if (stuck.checked) q.set("stuck", "true");
      if (review.checked) q.set("review", "true");
      location.hash = "#/sagas" + (q.toString() ? "?" + q : "");
    } },
    el("label", {}, "Type", typeSel), el("label", {}, "State", stateSel), el("label", {}, "Business key", key),
    el("label", { class: "check" }, stuck, "stuck"), el("label", { class: "check" }, review, "manual review"),
    el("button", { type: "submit", id: "f-apply" }, "Apply"));

    const title = params.get("stuck") === "true" ? "Stuck sagas" : params.get("review") === "true" ? "Sagas in manual review" : "Sagas";
    const tbody = el("tbody", { id: "saga-rows" });
    const table = el("table", { id: "saga-table" },
      el("thead", {}, el("tr", {}, ["Type", "Saga", "Business key", "State", "Version", "Updated", "Attention"].map((h) => el("th", {}, h)))),
      tbody);
    const more = el("div", { class: "more" });
    view.replaceChildren(el("h2", {}, title), form, table, more);

    const q = new URLSearchParams();
    for (const k of ["type", "state", "business_key", "stuck", "review"]) if (params.get(k)) q.set(k, params.get(k));
    const load = async (cursor) => {
      if (cursor) q.set("cursor", cursor);
      const page = await api("sagas?" + q);
      for (const s of page.items) tbody.append(sagaRow(s));
      if (!tbody.children.length) tbody.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No sagas match.")));
      more.replaceChildren(page.next_cursor ? el("button", { class: "secondary", id: "load-more", onclick: () => load(page.next_cursor).catch((e) => showError(e.message)) }, "Load more") : "");
    };
    await load("");
  }

  function sagaRow(s) {
    const attention = [];
    if (s.stuck) attention.push(el("span", { class: "badge stuck", title: s.stuck_reason }, "stuck"), " ", s.stuck_reason);
    if (s.state === "MANUAL_REVIEW") attention.push(el("span", { class: "badge review" }, "review"), " ", s.review_reason);
    if (!attention.length && s.last_error) attention.push(el("span", { class: "muted" }, s.last_error));
    return el("tr", { class: "saga-row", "data-id": s.id },
      el("td", {}, short(s.type)),
      el("td", { class: "mono" }, el("a", { href: "#/saga/" + encodeURIComponent(s.id), class: "saga-link" }, s.id)),
      el("td", {}, s.business_key),
      el("td", { class: "state" }, s.state),
      el("td", {}, s.version),
      el("td", {}, fmtTime(s.updated_at)),
      el("td", { class: "reason" }, attention));
  }

  // ---- parked messages ----------------------------------------------------

  async function showParked(params) {
    const view = $("view");
    const includeReplayed = params.get("include_replayed") === "true";
    const toggle = el("a", { href: includeReplayed ? "#/parked" : "#/parked?include_replayed=true" },
      includeReplayed ? "hide replayed" : "show replayed too");
    const tbody = el("tbody", { id: "parked-rows" });
    const table = el("table", { id: "parked-table" },
      el("thead", {}, el("tr", {}, ["#", "Message", "Saga", "Business key", "Step", "Queue", "Class", "Attempts", "First failure", "Parked", "Reason", ""].map((h) => el("th", {}, h)))),
      tbody);
    const more = el("div", { class: "more" });
    view.replaceChildren(el("h2", {}, "Parked messages ", el("small", {}, toggle)), table, more);
    const q = new URLSearchParams();
    if (includeReplayed) q.set("include_replayed", "true");
    const load = async (cursor) => {
      if (cursor) q.set("cursor", cursor);
      const page = await api("parked?" + q);
      for (const p of page.items) tbody.append(parkedRow(p, tbody));
      if (!tbody.children.length) tbody.append(el("tr", {}, el("td", { colspan: 12, class: "muted" }, "No parked messages.")));
      more.replaceChildren(page.next_cursor ? el("button", { class: "secondary", onclick: () => load(page.next_cursor).catch((e) => showError(e.message)) }, "Load more") : "");
    };
    await load("");
  }

  function parkedRow(p) {
    const saga = p.saga_id && p.saga_type
      ? el("a", { href: "#/saga/" + encodeURIComponent(p.saga_id) + "?type=" + encodeURIComponent(p.saga_type) }, p.saga_id)
      : (p.saga_id || "");
    return el("tr", { class: "parked-row", "data-id": p.id },
      el("td", {}, p.id),
      el("td", {}, short(p.message_type), el("div", { class: "mono muted" }, p.message_id)),
      el("td", { class: "mono" }, saga, p.saga_state ? el("div", { class: "muted" }, p.saga_state) : ""),
      el("td", {}, p.business_key || ""),
      el("td", {}, p.step || ""),
      el("td", { class: "mono" }, p.queue),
      el("td", {}, el("span", { class: "badge " + p.class }, p.class)),
      el("td", {}, p.attempts),
      el("td", {}, fmtTime(p.first_failure_at)),
      el("td", {}, fmtTime(p.parked_at)),
      el("td", { class: "reason" }, p.reason),
      el("td", {}, replayControl(p)));
  }

  // replayControl is the replay button of a parked message: it asks for a
  // reason, then POSTs api/parked/{id}/replay and shows the outcome.
  function replayControl(p) {
    if (p.replayed_at) {
      return el("span", {},
        el("span", { class: "badge replayed" }, "replayed by " + p.replayed_by + (p.replay_forced ? " (forced)" : "")),
        p.replay_reason ? " " + p.replay_reason : "");
    }
    if (!canRepair()) return el("span", { class: "muted" }, "read-only");
    const box = el("div", { class: "replay" });
    const start = el("button", { class: "replay-button", "data-id": p.id, onclick: () => {
      const reason = el("input", { type: "text", class: "replay-reason", placeholder: "why (required)", required: true });
      const out = el("span", { class: "result replay-result" });
      const form = el("form", { class: "inline", onsubmit: async (ev) => {
        ev.preventDefault();
        confirmBtn.disabled = true;
        try {
          const res = await api("parked/" + p.id + "/replay", { method: "POST", body: { reason: reason.value } });
          out.replaceChildren(el("span", { class: "badge replayed" }, res.outcome), " ", res.check.explanation);
          form.replaceWith(out);
        } catch (e) {
          confirmBtn.disabled = false;
          out.replaceChildren(el("span", { class: "badge refused" }, (e.body && e.body.code) || "error"), " ", e.message);
        }
      } });
      const confirmBtn = el("button", { type: "submit", class: "replay-confirm" }, "Confirm replay");
      form.append(reason, confirmBtn, out);
      box.replaceChildren(form);
      reason.focus();
    } }, "Replay…");
    box.append(start);
    return box;
  }

  // ---- state diagrams -----------------------------------------------------

  const SVG_NS = "http://www.w3.org/2000/svg";
  // What the server's diagrams use; anything else is dropped before the
  // SVG reaches the page (no script, foreignObject, use, links, styles or
  // event handlers, whatever the answer holds).
  const SVG_TAGS = new Set(["svg", "g", "title", "rect", "circle", "line", "polyline", "polygon", "text"]);
  const SVG_ATTRS = new Set(["viewBox", "width", "height", "class", "role", "aria-label", "font-family", "font-size",
    "font-weight", "text-anchor", "x", "y", "rx", "cx", "cy", "r", "x1", "y1", "x2", "y2", "points", "fill",
    "fill-opacity", "stroke", "stroke-width", "stroke-dasharray", "data-state", "data-from", "data-to"]);

  function pruneSVG(node) {
    for (const a of [...node.attributes]) {
      if (a.namespaceURI !== null || !SVG_ATTRS.has(a.name)) node.removeAttributeNode(a);
    }
    for (const c of [...node.children]) {
      if (c.namespaceURI !== SVG_NS || !SVG_TAGS.has(c.localName)) c.remove();
      else pruneSVG(c);
    }
  }

  // diagramView loads a saga type's state diagram (GET
  // api/types/{type}/diagram.svg, with the token like every call), the
  // current state highlighted and the visited ones marked when given.
  async function diagramView(type, current, visited) {
    const box = el("div", { class: "diagram", id: "diagram" });
    const q = new URLSearchParams();
    if (current) q.set("current", current);
    if (visited && visited.length) q.set("visited", visited.join(","));
    try {
      const text = await api("types/" + encodeURIComponent(type) + "/diagram.svg" + (q.toString() ? "?" + q : ""), { text: true });
      const doc = new DOMParser().parseFromString(text, "image/svg+xml");
      const root = doc.documentElement;
      if (root.namespaceURI !== SVG_NS || root.localName !== "svg" || doc.getElementsByTagName("parsererror").length) {
        throw new Error("the server's answer is not an SVG diagram");
      }
      pruneSVG(root);
      box.append(document.importNode(root, true));
    } catch (e) {
      if (e instanceof APIError && e.status === 401) throw e;
      box.append(el("p", { class: "muted" }, "The state diagram could not be shown: " + e.message));
    }
    return box;
  }

  // showTypes lists the saga types, or shows one: its state diagram, states
  // and steps.
  async function showTypes(name) {
    const view = $("view");
    if (!name) {
      view.replaceChildren(el("h2", {}, "Saga types"),
        el("ul", { id: "types" }, types.map((t) => el("li", {}, el("a", { href: "#/types/" + encodeURIComponent(t.name) }, t.name)))));
      return;
    }
    const t = types.find((x) => x.name === name);
    if (!t) throw new Error("no saga type " + name);
    view.replaceChildren(
      el("h2", {}, "Saga type ", el("span", { class: "mono", id: "type-name" }, t.name)),
      el("div", { class: "card" }, el("h3", {}, "State diagram"), await diagramView(t.name),
        el("details", {}, el("summary", {}, "Mermaid state diagram source"), el("pre", { id: "mermaid" }, t.mermaid))),
      el("div", { class: "card" }, el("h3", {}, "Steps"),
        el("ol", { id: "steps" }, t.steps.map((st) => el("li", {}, st.name + " (" + st.role + ")" +
          (st.command ? " sends " + short(st.command) : " waits for an event") +
          (st.timeout ? ", timeout " + st.timeout + ": " + st.on_timeout : "")))),
        el("p", {}, el("a", { href: "#/sagas?type=" + encodeURIComponent(t.name) }, "Its sagas"))));
  }

  // ---- one saga -----------------------------------------------------------

  async function showSaga(id) {
    const { params } = parseHash();
    const q = params.get("type") ? "?type=" + encodeURIComponent(params.get("type")) : "";
    const tl = await api("sagas/" + encodeURIComponent(id) + q);
    const s = tl.saga;
    const view = $("view");
    const facts = el("dl", { class: "grid" },
      [["Type", el("a", { href: "#/types/" + encodeURIComponent(s.type) }, s.type)], ["Business key", s.business_key], ["State", s.state], ["Version", s.version],
        ["Attempt", s.attempt], ["Created", fmtTime(s.created_at)], ["Updated", fmtTime(s.updated_at)],
        ["Timeout at", fmtTime(s.timeout_at)], ["Deadline at", fmtTime(s.deadline_at)],
        ["Last error", s.last_error], ["Review reason", s.review_reason], ["Stuck", s.stuck_reason]]
        .filter(([, v]) => v !== undefined && v !== "")
        .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const states = el("ol", { class: "states", id: "states" },
      tl.states.map((st) => el("li", { class: [st.current ? "current" : "", st.visited ? "visited" : ""].join(" ").trim() || null, "data-state": st.name, title: st.kind }, st.name)));
    const pos = tl.position;
    const next = el("ul", {}, (pos.next || []).map((n) => el("li", {}, n.trigger + " → " + n.to + (n.emits && n.emits.length ? " (sends " + n.emits.map(short).join(", ") + ")" : ""))));
    const events = el("tbody", { id: "events" }, tl.events.map(eventRow));
    const diagram = await diagramView(s.type, s.state, tl.states.filter((st) => st.visited).map((st) => st.name));
    view.replaceChildren(
      el("h2", {}, "Saga ", el("span", { class: "mono", id: "saga-id" }, s.id)),
      el("div", { class: "card" }, facts),
      el("div", { class: "card", id: "position" },
        el("h3", {}, "Where it is"), states,
        el("p", { id: "position-summary" }, pos.summary),
        pos.next && pos.next.length ? [el("h3", {}, "What can happen next"), next] : "",
        el("h3", {}, "State diagram"), diagram,
        el("details", {}, el("summary", {}, "Mermaid state diagram source"), el("pre", { id: "mermaid" }, tl.mermaid))),
      canRepair() ? actions(s) : "",
      el("h3", {}, "Timeline ", el("span", { class: "muted" },
        `${tl.counts.transitions} transitions, ${tl.counts.messages_out} sent, ${tl.counts.messages_in} received, ${tl.counts.retries} retries, ${tl.counts.parked} parked`)),
      tl.truncated ? el("p", { class: "warning", id: "timeline-truncated" },
        "Cut: this saga has more than 1000 transitions, sent messages or parked messages; only the newest 1000 of each are shown.") : "",
      el("table", { id: "timeline" }, el("thead", {}, el("tr", {}, ["When", "Kind", "What", "Cause / detail", ""].map((h) => el("th", {}, h)))), events),
      tl.data ? el("div", { class: "card" }, el("h3", {}, "Saga data ", el("span", { class: "muted" }, tl.data.redacted && tl.data.redacted.length ? "(redacted: " + tl.data.redacted.join(", ") + ")" : "")),
        tl.data.json ? el("pre", { id: "saga-data" }, JSON.stringify(tl.data.json, null, 2)) : el("p", { class: "muted" }, tl.data.note)) : "");
  }

  function eventRow(e) {
    let detail = [];
    if (e.kind === "transition") {
      detail = [e.message_id ? "message " + e.message_id : "", e.causation_id ? " caused by " + e.causation_id : "", e.operator ? "operator " + e.operator : "", e.note ? el("div", { class: "muted" }, e.note) : ""];
    } else if (e.kind === "message") {
      detail = [e.message_id, e.published_at ? " published " + fmtTime(e.published_at) : " not yet published", e.body ? bodyView(e.body) : ""];
    } else if (e.kind === "parked") {
      detail = [e.queue + ": " + e.reason, e.body ? bodyView(e.body) : ""];
    }
    let extra = "";
    if (e.kind === "parked") {
      extra = replayControl({ id: e.parked_id, replayed_at: e.replayed_at, replayed_by: e.replayed_by,
        replay_reason: e.replay_reason, replay_forced: e.replay_forced });
    }
    return el("tr", { class: "event kind-" + e.kind },
      el("td", {}, fmtTime(e.at)),
      el("td", {}, e.kind + (e.direction ? " (" + e.direction + ")" : "")),
      el("td", {}, e.summary),
      el("td", { class: "reason" }, detail),
      el("td", {}, extra));
  }

  function bodyView(b) {
    const label = "body (" + b.size + " bytes" + (b.redacted && b.redacted.length ? ", redacted: " + b.redacted.join(", ") : "") + ")";
    return el("details", {}, el("summary", {}, label),
      b.json ? el("pre", { class: "body" }, JSON.stringify(b.json, null, 2)) : el("p", { class: "muted" }, b.note || ""));
  }

  // actions renders the repair form of one saga: action, reason, and the
  // version the operator is looking at (the server refuses if it moved on).
  function actions(s) {
    const reason = el("input", { type: "text", id: "action-reason", placeholder: "why (required)", required: true });
    const to = el("select", { id: "action-to" }, ["COMPLETED", "FAILED", "CANCELLED"].map((n) => el("option", { value: n }, n)));
    const out = el("span", { class: "result", id: "action-result" });
    const run = (action) => async (ev) => {
      ev.preventDefault();
      if (!reason.value.trim()) { out.textContent = "A reason is required."; return; }
      try {
        const body = { expected_version: s.version, reason: reason.value, type: s.type };
        if (action === "resolve") body.to = to.value;
        const res = await api("sagas/" + encodeURIComponent(s.id) + "/" + action, { method: "POST", body });
        out.replaceChildren(el("span", { class: "badge applied" }, res.outcome), " now " + res.saga.state + " v" + res.saga.version);
        setTimeout(route, 600);
      } catch (e) {
        out.replaceChildren(el("span", { class: "badge error" }, (e.body && e.body.code) || "error"), " ", e.message);
      }
    };
    return el("div", { class: "card", id: "actions" }, el("h3", {}, "Repair (decided on version " + s.version + ")"),
      el("form", { class: "inline", onsubmit: (ev) => ev.preventDefault() },
        el("label", {}, "Reason", reason),
        el("button", { id: "act-retry", onclick: run("retry") }, "Retry step"),
        el("button", { id: "act-compensate", onclick: run("compensate") }, "Compensate"),
        el("button", { id: "act-cancel", class: "danger", onclick: run("cancel") }, "Cancel"),
        el("label", {}, "Resolve to", to),
        el("button", { id: "act-resolve", onclick: run("resolve") }, "Resolve"),
        out));
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
      $("token").value = "";
      me = null;
      route();
    });
    window.addEventListener("hashchange", route);
    route();
  });
})();
