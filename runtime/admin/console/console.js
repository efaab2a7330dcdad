// Saga console: a small single-page client of the admin API (/api/...).
// Everything is built with DOM calls and textContent, never innerHTML, so no
// value from the API is ever interpreted as markup. The one exception is the
// state diagram, an SVG the server draws: it is parsed as an XML document
// (DOMParser, which runs nothing), pruned to an allowlist of SVG elements
// and attributes, and only then adopted into the page (see diagramView).
//
// Repairs are safe by construction: only the repairs the state machine
// allows in the saga's state are offered (the timeline's actions), each
// opens a confirmation that names its effect and asks for the reason, and
// only the confirmation's button runs it (Enter never does).
"use strict";

(function () {
  const TOKEN_KEY = "saga-admin-token";
  const TZ_KEY = "saga-console-tz";
  const LIVE_KEY = "saga-console-live";
  const LIVE_EVERY = 5000;
  const $ = (id) => document.getElementById(id);
  let me = null; // {name, role}
  let types = []; // GET api/types
  let liveTimer = null;

  // el builds an element: el("td", {class: "mono"}, "text", child, ...).
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    append(e, children);
    return e;
  }

  // append adds children (nested arrays flattened, null/false skipped).
  function append(parent, children) {
    for (const c of [children].flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      parent.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return parent;
  }

  // fill replaces parent's children.
  function fill(parent, ...children) {
    parent.replaceChildren();
    return append(parent, children);
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

  // call calls the admin API with the given token. With opts.text it
  // returns the body of a successful answer as text.
  async function call(tok, path, opts) {
    opts = opts || {};
    const headers = { "Authorization": "Bearer " + tok, "Accept": opts.text ? "*/*" : "application/json" };
    let body;
    if (opts.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(opts.body);
    }
    const res = await fetch("api/" + path, { method: opts.method || "GET", headers, body });
    if (opts.text && res.ok) return res.text();
    let data = null;
    try { data = await res.json(); } catch (e) { data = null; }
    if (!res.ok) throw new APIError(res.status, data);
    return data;
  }

  // api calls the admin API with the session's token. A 401 forgets the
  // token and shows the sign-in form, saying why.
  async function api(path, opts) {
    try {
      return await call(token(), path, opts);
    } catch (e) {
      if (e instanceof APIError && e.status === 401) {
        sessionStorage.removeItem(TOKEN_KEY);
        me = null;
        loginMessage("Your token is no longer accepted (it may have been rotated): sign in again.");
        route();
      }
      throw e;
    }
  }

  // ---- time ------------------------------------------------------------

  const utc = () => localStorage.getItem(TZ_KEY) !== "local";

  function pad(n) { return String(n).padStart(2, "0"); }

  function absolute(d, inUTC) {
    if (inUTC) return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
      pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + " local";
  }

  function relative(d) {
    const s = Math.round((d.getTime() - Date.now()) / 1000);
    const a = Math.abs(s);
    let text;
    if (a < 5) return "just now";
    if (a < 90) text = a + " s";
    else if (a < 90 * 60) text = Math.round(a / 60) + " min";
    else if (a < 36 * 3600) text = Math.round(a / 3600) + " h";
    else text = Math.round(a / 86400) + " d";
    return s < 0 ? text + " ago" : "in " + text;
  }

  // when renders a time: relative, then absolute in the chosen zone; the
  // other zone in the tooltip.
  function when(t) {
    if (!t) return "";
    const d = new Date(t);
    return el("time", { datetime: d.toISOString(), title: absolute(d, !utc()) },
      el("span", { class: "rel" }, relative(d)), " · ", absolute(d, utc()));
  }

  function setTZButton() { $("tz-toggle").textContent = utc() ? "UTC" : "Local time"; }

  // ---- routing -------------------------------------------------------------

  const short = (name) => (name ? name.slice(name.lastIndexOf(".") + 1) : "");
  const canRepair = () => me && me.role === "repair";

  function parseHash() {
    const h = location.hash.replace(/^#\/?/, "");
    const i = h.indexOf("?");
    const path = i < 0 ? h : h.slice(0, i);
    return { parts: (path || "sagas").split("/").map(decodeURIComponent), params: new URLSearchParams(i < 0 ? "" : h.slice(i + 1)) };
  }

  function loginMessage(msg) {
    const box = $("login-error");
    box.textContent = msg || "";
    box.hidden = !msg;
  }

  // flash re-renders the view with a message on top saying what the last
  // repair did (it stays until the next view is rendered).
  let flashed = null;
  function flash(...nodes) {
    flashed = nodes;
    route();
  }

  // route renders the view the location's hash names. Views render into a
  // detached section that replaces the shown one only if no later route
  // started meanwhile (a slow answer never overwrites a newer view).
  // body[data-route] says which view is shown (tests wait for it).
  let generation = 0;
  async function route() {
    const mine = ++generation;
    document.body.dataset.route = "";
    showError("");
    if (!token()) {
      $("login").hidden = false;
      for (const id of ["nav", "search-form", "tools"]) $(id).hidden = true;
      $("view").replaceChildren();
      $("who").replaceChildren();
      $("token").focus();
      document.body.dataset.route = "sign-in";
      return;
    }
    $("login").hidden = true;
    for (const id of ["nav", "search-form", "tools"]) $(id).hidden = false;
    try {
      if (!me) {
        me = (await api("whoami")).principal;
        types = await api("types");
        fill($("who"),
          el("span", { id: "who-name" }, me.name + " (" + me.role + ")"),
          el("button", { type: "button", class: "secondary", id: "logout", onclick: logout }, "Sign out"));
      }
      const hash = location.hash;
      const { parts, params } = parseHash();
      for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.getAttribute("href") === hash);
      const view = document.createElement("section");
      let after;
      if (parts[0] === "saga" && parts[1]) after = await showSaga(view, parts[1], params);
      else if (parts[0] === "types") await showTypes(view, parts[1]);
      else if (parts[0] === "parked") await showParked(view, params);
      else if (parts[0] === "search") await showSearch(view, params);
      else if (parts[0] === "log") await showLog(view, params);
      else await showSagas(view, params);
      if (mine !== generation) return;
      $("view").replaceChildren(...view.childNodes);
      if (flashed) {
        $("view").prepend(el("div", { class: "card flash", id: "flash", role: "status" }, flashed));
        flashed = null;
      }
      if (after) after();
      $("refreshed").textContent = "updated " + absolute(new Date(), utc()).slice(11);
      document.body.dataset.route = hash || "#/sagas";
    } catch (e) {
      if (mine !== generation) return;
      if (!(e instanceof APIError && e.status === 401)) showError(e.message);
      document.body.dataset.route = token() ? "error" : "sign-in";
    }
  }

  function logout() {
    sessionStorage.removeItem(TOKEN_KEY);
    me = null;
    location.hash = "#/sagas";
    route();
  }

  // signIn checks a token with the server before keeping it: a wrong one
  // is refused with a word, not silently.
  async function signIn(tok) {
    loginMessage("");
    $("login-submit").disabled = true;
    try {
      const who = await call(tok, "whoami");
      sessionStorage.setItem(TOKEN_KEY, tok);
      me = null;
      $("token").value = "";
      await route();
      return who;
    } catch (e) {
      if (e instanceof APIError && e.status === 401) loginMessage("That token was not accepted. Check it and try again.");
      else if (e instanceof APIError && e.status === 429) loginMessage("Too many failed sign-ins from this address: " + e.message);
      else loginMessage("Sign-in failed: " + e.message);
    } finally {
      $("login-submit").disabled = false;
    }
  }

  // live re-renders the current view every few seconds while nothing is
  // being edited or confirmed.
  function setLive(on) {
    localStorage.setItem(LIVE_KEY, on ? "on" : "off");
    $("live").checked = on;
    clearInterval(liveTimer);
    liveTimer = null;
    if (!on) return;
    liveTimer = setInterval(() => {
      // Not while a repair is being confirmed or previewed, or a field edited.
      if (!token() || $("confirm").open || $("bulk-panel")) return;
      const a = document.activeElement;
      if (a && a !== document.body && a.closest("#view") && /^(INPUT|SELECT|TEXTAREA)$/.test(a.tagName)) return;
      route();
    }, LIVE_EVERY);
  }

  // ---- confirmation --------------------------------------------------------

  // confirmRepair opens the confirmation dialog: the effect in words, a
  // required reason, and the only button that runs the repair. Enter in
  // the reason field does nothing. It resolves with the reason, or null
  // when the operator goes back.
  function confirmRepair(title, effect, okLabel, danger, extra) {
    const dlg = $("confirm"), reason = $("confirm-reason"), ok = $("confirm-ok");
    $("confirm-title").textContent = title;
    $("confirm-effect").textContent = effect;
    fill($("confirm-extra"), extra || "");
    reason.value = "";
    ok.textContent = okLabel;
    ok.className = danger ? "danger" : "";
    ok.disabled = true;
    return new Promise((resolve) => {
      const done = (v) => {
        reason.removeEventListener("input", onInput);
        reason.removeEventListener("keydown", onKey);
        ok.removeEventListener("click", onOK);
        $("confirm-cancel").removeEventListener("click", onBack);
        dlg.removeEventListener("close", onClose);
        if (dlg.open) dlg.close();
        resolve(v);
      };
      const onInput = () => { ok.disabled = !reason.value.trim(); };
      const onKey = (ev) => { if (ev.key === "Enter") ev.preventDefault(); };
      const onOK = () => { if (reason.value.trim()) done(reason.value.trim()); };
      const onBack = () => done(null);
      const onClose = () => done(null);
      reason.addEventListener("input", onInput);
      reason.addEventListener("keydown", onKey);
      ok.addEventListener("click", onOK);
      $("confirm-cancel").addEventListener("click", onBack);
      dlg.addEventListener("close", onClose);
      dlg.showModal();
      reason.focus();
    });
  }

  function outcomeBadge(outcome) {
    return el("span", { class: "badge " + outcome }, outcome.replace(/_/g, " "));
  }

  // ---- counts --------------------------------------------------------------

  async function countsView(params) {
    const stats = await api("stats");
    return el("div", { class: "counts", id: "counts" },
      stats.types.map((t) => el("div", { class: "card type-counts", "data-type": t.type },
        el("div", {}, el("b", {}, short(t.type)), " ", el("span", { class: "muted" }, t.total + " sagas"),
          t.stuck ? [" · ", el("a", { class: "chip stuck", href: "#/sagas?stuck=true&type=" + encodeURIComponent(t.type) }, el("b", {}, t.stuck), "stuck")] : ""),
        el("div", { class: "chips" }, t.states.map((s) => el("a", {
          class: "chip state-count" + (s.count ? "" : " zero") + (s.state === "MANUAL_REVIEW" && s.count ? " review" : ""),
          "data-state": s.state, title: s.kind + (s.stuck ? ", " + s.stuck + " stuck" : ""),
          href: "#/sagas?type=" + encodeURIComponent(t.type) + "&state=" + encodeURIComponent(s.state),
        }, s.state, el("b", {}, s.count)))))),
      el("div", { class: "card", id: "parked-count" },
        el("div", {}, el("b", {}, "Parked messages"), " ",
          el("a", { href: "#/parked", class: "chip" + (stats.parked.open ? " review" : " zero") }, el("b", {}, stats.parked.open), "open")),
        el("div", { class: "chips" }, Object.entries(stats.parked.by_queue).map(([q, n]) =>
          el("a", { class: "chip", href: "#/parked?queue=" + encodeURIComponent(q) }, q, el("b", {}, n))))));
  }

  // ---- saga list -------------------------------------------------------------

  // datetime-local values are local times; the API takes RFC 3339.
  const toISO = (v) => (v ? new Date(v).toISOString() : "");
  const fromISO = (v) => {
    if (!v) return "";
    const d = new Date(v);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + "T" + pad(d.getHours()) + ":" + pad(d.getMinutes());
  };

  async function showSagas(view, params) {
    const typeSel = el("select", { id: "f-type", name: "type" }, el("option", { value: "" }, "all types"),
      types.map((t) => el("option", { value: t.name, selected: params.get("type") === t.name }, t.name)));
    const stateSel = el("select", { id: "f-state", name: "state" });
    const fillStates = () => {
      const names = [];
      for (const t of types) {
        if (typeSel.value && t.name !== typeSel.value) continue;
        for (const s of t.states) if (!names.includes(s.name)) names.push(s.name);
      }
      fill(stateSel, el("option", { value: "" }, "any state"),
        names.map((n) => el("option", { value: n, selected: params.get("state") === n }, n)));
    };
    fillStates();
    typeSel.addEventListener("change", fillStates);
    const stuck = el("input", { type: "checkbox", id: "f-stuck", checked: params.get("stuck") === "true" });
    const review = el("input", { type: "checkbox", id: "f-review", checked: params.get("review") === "true" });
    const key = el("input", { type: "text", id: "f-key", placeholder: "business key starts with", value: params.get("key_prefix") || "" });
    const from = el("input", { type: "datetime-local", id: "f-from", value: fromISO(params.get("created_after")) });
    const to = el("input", { type: "datetime-local", id: "f-to", value: fromISO(params.get("created_before")) });
    const sort = el("select", { id: "f-sort" }, el("option", { value: "newest" }, "newest first"),
      el("option", { value: "oldest", selected: params.get("sort") === "oldest" }, "oldest first"));
    const form = el("form", { class: "filters card", id: "saga-filters", onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (typeSel.value) q.set("type", typeSel.value);
      if (stateSel.value) q.set("state", stateSel.value);
      if (key.value) q.set("key_prefix", key.value);
      if (from.value) q.set("created_after", toISO(from.value));
      if (to.value) q.set("created_before", toISO(to.value));
      if (sort.value === "oldest") q.set("sort", "oldest");
      if (stuck.checked) q.set("stuck", "true");
      if (review.checked) q.set("review", "true");
      location.hash = "#/sagas" + (q.toString() ? "?" + q : "");
    } },
    el("label", {}, "Type", typeSel), el("label", {}, "State", stateSel), el("label", {}, "Business key", key),
    el("label", {}, "Created from", from), el("label", {}, "Created until", to), el("label", {}, "Order", sort),
    el("label", { class: "check" }, stuck, "stuck"), el("label", { class: "check" }, review, "manual review"),
    el("button", { type: "submit", id: "f-apply" }, "Apply"));

    const title = params.get("stuck") === "true" ? "Stuck sagas" : params.get("review") === "true" ? "Sagas in manual review" : "Sagas";
    const tbody = el("tbody", { id: "saga-rows" });
    const table = el("table", { id: "saga-table" },
      el("colgroup", {}, [9, 23, 14, 15, 5, 14, 20].map((w) => el("col", { class: "w" + w }))),
      el("thead", {}, el("tr", {}, ["Type", "Saga", "Business key", "State", "Ver.", "Updated", "Attention"].map((h) => el("th", {}, h)))),
      tbody);
    const more = el("div", { class: "more" });
    const counts = await countsView(params);
    const filter = {};
    for (const k of ["type", "state", "key_prefix", "created_after", "created_before"]) if (params.get(k)) filter[k] = params.get(k);
    for (const k of ["stuck", "review"]) if (params.get(k) === "true") filter[k] = true;
    const bulkBox = el("div", { id: "bulk" });
    const bulkButton = canRepair() ? el("div", { class: "inline" },
      el("button", { type: "button", class: "secondary", id: "bulk-repair", onclick: () => sagaBulkPanel(bulkBox, filter) }, "Repair matching…")) : "";
    fill(view, el("h2", {}, title), counts, form, bulkButton, bulkBox, table, more);

    const q = new URLSearchParams();
    for (const k of ["type", "state", "key_prefix", "stuck", "review", "created_after", "created_before", "sort"]) if (params.get(k)) q.set(k, params.get(k));
    const load = async (cursor) => {
      if (cursor) q.set("cursor", cursor);
      const page = await api("sagas?" + q);
      for (const s of page.items) tbody.append(sagaRow(s));
      if (!tbody.children.length) tbody.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No sagas match.")));
      fill(more, page.next_cursor ? el("button", { type: "button", class: "secondary", id: "load-more", onclick: () => load(page.next_cursor).catch((e) => showError(e.message)) }, "Load more") : "");
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
      el("td", { class: "mono" }, el("a", { href: "#/saga/" + encodeURIComponent(s.id) + "?type=" + encodeURIComponent(s.type), class: "saga-link" }, s.id)),
      el("td", {}, s.business_key),
      el("td", { class: "state" }, s.state),
      el("td", {}, s.version),
      el("td", {}, when(s.updated_at)),
      el("td", { class: "reason" }, attention));
  }

  // sagaBulkPanel previews a repair of every saga the list's filter selects
  // (a dry run: per saga, the state it would reach and what it would send,
  // as its state machine decides), then runs it once confirmed.
  function sagaBulkPanel(box, filter) {
    const title = "Repair every matching saga";
    if (!Object.keys(filter).length) {
      fill(box, el("div", { class: "card bulk", id: "bulk-panel" }, el("h3", {}, title),
        el("p", { class: "warning" }, "Choose at least one filter first (type, state, business key, window, stuck or manual review): a bulk repair never takes every saga.")));
      return;
    }
    const action = el("select", { id: "bulk-action" }, [["retry", "retry"], ["compensate", "compensate"], ["cancel", "cancel"],
      ["resolve:COMPLETED", "resolve as COMPLETED"], ["resolve:FAILED", "resolve as FAILED"], ["resolve:CANCELLED", "resolve as CANCELLED"]]
      .map(([v, l]) => el("option", { value: v }, l)));
    const reason = el("input", { type: "text", id: "bulk-reason", placeholder: "why (required)" });
    const out = el("div", { id: "bulk-preview" });
    const request = (dryRun) => {
      const [name, to] = action.value.split(":");
      const body = { filter, reason: reason.value.trim(), dry_run: dryRun };
      if (to) body.to = to;
      return api("bulk/sagas/" + name, { method: "POST", body });
    };
    const preview = async () => {
      if (!reason.value.trim()) { fill(out, el("p", { class: "warning" }, "A reason is required.")); return; }
      const res = await request(true);
      const n = res.items.filter((it) => it.outcome === "would_apply").length;
      const rows = res.items.map((it) => el("tr", { class: "bulk-item", "data-id": it.saga_id },
        el("td", {}, el("a", { class: "mono", href: "#/saga/" + encodeURIComponent(it.saga_id) + "?type=" + encodeURIComponent(it.type) }, it.saga_id),
          el("div", {}, it.business_key)),
        el("td", {}, it.state), el("td", {}, outcomeBadge(it.outcome)),
        el("td", { class: "bulk-to" }, it.to || ""), el("td", {}, (it.sends || []).join(", ")),
        el("td", {}, it.effect || it.error || "")));
      const run = el("button", { type: "button", id: "bulk-run", class: "danger", disabled: n === 0 }, "Apply to " + n + "…");
      run.addEventListener("click", async () => {
        const r = await confirmRepair(title, action.options[action.selectedIndex].textContent + " " + n + " saga(s) as previewed above, each in its own transaction at the version listed (one that moved meanwhile is left alone).",
          "Apply to " + n, true);
        if (r === null) return;
        reason.value = r;
        try {
          const done = await request(false);
          box.replaceChildren();
          flash(el("span", { id: "bulk-done" }, action.value.split(":")[0] + " done: ", Object.entries(done.counts).map(([k, v]) => [outcomeBadge(k), " " + v + " "])));
        } catch (e) {
          fill(out, el("p", { class: "bad" }, e.message));
        }
      });
      fill(out, el("table", { id: "bulk-table" },
        el("colgroup", {}, [24, 14, 11, 14, 11, 26].map((w) => el("col", { class: "w" + w }))),
        el("thead", {}, el("tr", {}, ["Saga", "State", "Would", "Reaches", "Sends", "What"].map((h) => el("th", {}, h)))), el("tbody", {}, rows)),
        res.truncated ? el("p", { class: "warning" }, "More match than shown: the repair takes at most " + res.items.length + ".") : "",
        el("div", { class: "inline more" }, run));
    };
    fill(box, el("div", { class: "card bulk", id: "bulk-panel" },
      el("h3", {}, title),
      el("p", { class: "muted" }, "Filter: " + Object.entries(filter).map(([k, v]) => k + " = " + v).join(", ")),
      el("div", { class: "inline" }, el("label", {}, "Repair", action), el("label", {}, "Reason", reason),
        el("button", { type: "button", id: "bulk-preview-button", onclick: () => preview().catch((e) => showError(e.message)) }, "Preview"),
        el("button", { type: "button", class: "secondary", id: "bulk-close", onclick: () => box.replaceChildren() }, "Close")),
      out));
    reason.addEventListener("keydown", (ev) => { if (ev.key === "Enter") ev.preventDefault(); });
  }

  // ---- parked messages ----------------------------------------------------

  const parkedFilterKeys = ["saga_type", "saga_id", "queue", "message_type", "reason", "older_than", "newer_than"];

  async function showParked(view, params) {
    const includeClosed = params.get("include_replayed") === "true";
    const input = (id, name, placeholder) => el("input", { type: "text", id, placeholder, value: params.get(name) || "" });
    const queue = input("p-queue", "queue", "queue");
    const sagaType = el("select", { id: "p-saga-type" }, el("option", { value: "" }, "any saga type"),
      types.map((t) => el("option", { value: t.name, selected: params.get("saga_type") === t.name }, t.name)));
    const msgType = input("p-message-type", "message_type", "full name");
    const reason = input("p-reason", "reason", "reason contains");
    const age = el("select", { id: "p-age" }, [["", "any age"], ["5m", "older than 5 min"], ["1h", "older than 1 h"], ["24h", "older than 1 day"]]
      .map(([v, l]) => el("option", { value: v, selected: (params.get("older_than") || "") === v }, l)));
    const closed = el("input", { type: "checkbox", id: "p-closed", checked: includeClosed });
    const filter = () => {
      const f = {};
      if (queue.value) f.queue = queue.value;
      if (sagaType.value) f.saga_type = sagaType.value;
      if (msgType.value) f.message_type = msgType.value;
      if (reason.value) f.reason = reason.value;
      if (age.value) f.older_than = age.value;
      if (params.get("saga_id")) f.saga_id = params.get("saga_id");
      return f;
    };
    const form = el("form", { class: "filters card", id: "parked-filters", onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams(filter());
      if (closed.checked) q.set("include_replayed", "true");
      location.hash = "#/parked" + (q.toString() ? "?" + q : "");
    } },
    el("label", {}, "Queue", queue), el("label", {}, "Saga type", sagaType), el("label", {}, "Message type", msgType),
    el("label", {}, "Reason", reason), el("label", {}, "Age", age),
    el("label", { class: "check" }, closed, "replayed and dismissed too"),
    el("button", { type: "submit", id: "p-apply" }, "Apply"));

    const tbody = el("tbody", { id: "parked-rows" });
    const table = el("table", { id: "parked-table" },
      el("colgroup", {}, [4, 16, 20, 11, 10, 24, 15].map((w) => el("col", { class: "w" + w }))),
      el("thead", {}, el("tr", {}, ["#", "Message", "Saga", "Standing", "Failed", "Reason", ""].map((h) => el("th", {}, h)))),
      tbody);
    const more = el("div", { class: "more" });
    const bulkBox = el("div", { id: "bulk" });
    const current = {};
    for (const k of parkedFilterKeys) if (params.get(k)) current[k] = params.get(k);
    const bulkButtons = canRepair() && !includeClosed ? el("div", { class: "inline" },
      el("button", { type: "button", class: "secondary", id: "bulk-replay", onclick: () => bulkPanel(bulkBox, "replay", current) }, "Replay matching…"),
      el("button", { type: "button", class: "secondary", id: "bulk-dismiss", onclick: () => bulkPanel(bulkBox, "dismiss", current) }, "Dismiss matching…")) : "";
    fill(view, el("h2", {}, "Parked messages"), form, bulkButtons, bulkBox, table, more);
    const q = new URLSearchParams(current);
    if (includeClosed) q.set("include_replayed", "true");
    const load = async (cursor) => {
      if (cursor) q.set("cursor", cursor);
      const page = await api("parked?" + q);
      for (const p of page.items) tbody.append(parkedRow(p));
      if (!tbody.children.length) tbody.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "No parked messages match.")));
      fill(more, page.next_cursor ? el("button", { type: "button", class: "secondary", onclick: () => load(page.next_cursor).catch((e) => showError(e.message)) }, "Load more") : "");
    };
    await load("");
  }

  function standingView(p) {
    if (p.replayed_at) return el("span", { class: "badge replayed", title: p.replay_reason || "" }, "replayed by " + p.replayed_by + (p.replay_forced ? " (forced)" : ""));
    if (p.dismissed_at) return el("span", { class: "badge dismissed", title: p.dismiss_reason || "" }, "dismissed by " + p.dismissed_by);
    if (!p.standing) return el("span", { class: "muted small" }, p.standing_note || "");
    return el("span", {}, el("span", { class: "badge standing " + p.standing, title: p.standing_note }, p.standing),
      el("div", { class: "muted small" }, p.standing_note));
  }

  function parkedRow(p) {
    const saga = p.saga_id && p.saga_type
      ? el("a", { class: "mono", href: "#/saga/" + encodeURIComponent(p.saga_id) + "?type=" + encodeURIComponent(p.saga_type) }, p.saga_id)
      : el("span", { class: "mono" }, p.saga_id || "no saga");
    return el("tr", { class: "parked-row", "data-id": p.id, "data-standing": p.standing || "" },
      el("td", {}, p.id),
      el("td", {}, short(p.message_type), el("div", { class: "mono muted small" }, p.message_id), el("div", { class: "mono small" }, p.queue)),
      el("td", {}, saga, p.business_key ? el("div", {}, p.business_key) : "",
        el("div", { class: "muted small" }, [p.saga_state, p.step ? "step " + p.step : "", p.linked_by ? "linked by " + p.linked_by : ""].filter(Boolean).join(" · "))),
      el("td", {}, standingView(p)),
      el("td", {}, el("span", { class: "badge " + p.class }, p.class), el("div", { class: "small" }, p.attempts + " attempt(s)"), when(p.parked_at)),
      el("td", { class: "reason" }, p.reason),
      el("td", {}, parkedActions(p)));
  }

  // parkedActions are the repairs of one open parked copy: replay while it
  // is current (or its standing is unknown), dismiss when it no longer
  // applies (forced, with a warning, when it is current).
  function parkedActions(p) {
    if (p.replayed_at || p.dismissed_at) return "";
    if (!canRepair()) return el("span", { class: "muted" }, "read-only");
    const out = el("span", { class: "result parked-result" });
    const replay = async () => {
      const reason = await confirmRepair("Replay parked message " + p.id,
        "Replay puts " + short(p.message_type) + " " + p.message_id + " back into the outbox with its own message id, to " +
        (p.exchange || "its exchange") + " / " + (p.routing_key || "its routing key") + "; " +
        (p.standing_note ? "check now: " + p.standing_note + "." : "its consumer decides its effect."), "Replay", false);
      if (reason === null) return;
      try {
        const res = await api("parked/" + p.id + "/replay", { method: "POST", body: { reason } });
        flash(outcomeBadge(res.outcome), " parked message " + p.id + ": " + res.check.explanation);
      } catch (e) {
        fill(out, el("span", { class: "badge refused" }, (e.body && e.body.code) || "error"), " ", e.message);
      }
    };
    const dismiss = async () => {
      const force = p.standing === "current";
      const reason = await confirmRepair("Dismiss parked message " + p.id,
        force ? "This copy is CURRENT: its saga waits for it (" + p.standing_note + "). Dismissing closes it without replaying; the saga waits until its step's timeout."
          : "Dismiss closes this copy without replaying it (" + (p.standing_note || "it can not be checked") + "); who and why are recorded on it and in its saga's audit trail.",
        force ? "Dismiss the current copy" : "Dismiss", force);
      if (reason === null) return;
      try {
        const res = await api("parked/" + p.id + "/dismiss", { method: "POST", body: { reason, force } });
        flash(outcomeBadge(res.outcome), " parked message " + p.id + ": " + res.explanation);
      } catch (e) {
        fill(out, el("span", { class: "badge refused" }, (e.body && e.body.code) || "error"), " ", e.message);
      }
    };
    const buttons = [];
    if (p.standing !== "superseded") buttons.push(el("button", { type: "button", class: "replay-button", "data-id": p.id, onclick: replay }, "Replay…"));
    buttons.push(el("button", { type: "button", class: "secondary dismiss-button", "data-id": p.id, onclick: dismiss }, "Dismiss…"));
    return el("div", { class: "inline" }, buttons, out);
  }

  // bulkPanel previews a bulk replay or dismissal of the parked messages
  // the filter selects (a dry run: per item, what would happen), then runs
  // it once confirmed.
  function bulkPanel(box, verb, filter) {
    const title = verb === "replay" ? "Replay every matching parked message" : "Dismiss every matching parked message that no longer applies";
    if (!Object.keys(filter).length) {
      fill(box, el("div", { class: "card bulk", id: "bulk-panel" }, el("h3", {}, title),
        el("p", { class: "warning" }, "Choose at least one filter first (queue, saga type, message type or reason): a bulk action never takes every parked message.")));
      return;
    }
    const reason = el("input", { type: "text", id: "bulk-reason", placeholder: "why (required)" });
    const out = el("div", { id: "bulk-preview" });
    const close = () => box.replaceChildren();
    const preview = async () => {
      if (!reason.value.trim()) { fill(out, el("p", { class: "warning" }, "A reason is required.")); return; }
      const res = await api("bulk/parked/" + verb, { method: "POST", body: { filter, reason: reason.value.trim(), dry_run: true } });
      const n = res.items.filter((it) => it.outcome === "would_replay" || it.outcome === "would_dismiss").length;
      const rows = res.items.map((it) => {
        const p = it.parked;
        const why = verb === "replay" ? it.check.explanation : it.explanation;
        return el("tr", { class: "bulk-item", "data-id": p.id },
          el("td", {}, p.id), el("td", {}, short(p.message_type), el("div", { class: "mono small muted" }, p.message_id)),
          el("td", { class: "mono" }, p.saga_id || ""), el("td", {}, outcomeBadge(it.outcome)), el("td", {}, why));
      });
      const run = el("button", { type: "button", id: "bulk-run", class: verb === "dismiss" ? "danger" : "", disabled: n === 0 }, (verb === "replay" ? "Replay " : "Dismiss ") + n + "…");
      run.addEventListener("click", async () => {
        const r = await confirmRepair(title, (verb === "replay" ? "Replays " : "Dismisses ") + n + " parked message(s) as previewed above, one by one" +
          (verb === "replay" ? ", oldest first, each checked against its saga again." : "; current copies are left open."), verb === "replay" ? "Replay " + n : "Dismiss " + n, verb === "dismiss");
        if (r === null) return;
        try {
          const done = await api("bulk/parked/" + verb, { method: "POST", body: { filter, reason: r } });
          close();
          flash(el("span", { id: "bulk-done" }, verb + " done: ", Object.entries(done.counts).map(([k, v]) => [outcomeBadge(k), " " + v + " "])));
        } catch (e) {
          fill(out, el("p", { class: "bad" }, e.message));
        }
      });
      fill(out, el("table", { id: "bulk-table" },
        el("colgroup", {}, [6, 22, 26, 12, 34].map((w) => el("col", { class: "w" + w }))),
        el("thead", {}, el("tr", {}, ["#", "Message", "Saga", "Would", "Why"].map((h) => el("th", {}, h)))), el("tbody", {}, rows)),
        res.truncated ? el("p", { class: "warning" }, "More match than shown: the action takes at most " + res.items.length + ".") : "",
        el("div", { class: "inline more" }, run));
    };
    fill(box, el("div", { class: "card bulk", id: "bulk-panel" },
      el("h3", {}, title),
      el("p", { class: "muted" }, "Filter: " + Object.entries(filter).map(([k, v]) => k + " = " + v).join(", ")),
      el("div", { class: "inline" }, el("label", {}, "Reason", reason),
        el("button", { type: "button", id: "bulk-preview-button", onclick: () => preview().catch((e) => showError(e.message)) }, "Preview"),
        el("button", { type: "button", class: "secondary", id: "bulk-close", onclick: close }, "Close")),
      out));
    reason.addEventListener("keydown", (ev) => { if (ev.key === "Enter") ev.preventDefault(); });
    reason.focus();
  }

  // ---- search --------------------------------------------------------------

  async function showSearch(view, params) {
    const q = params.get("q") || "";
    $("q").value = q;
    const res = await api("search?q=" + encodeURIComponent(q));
    const rows = res.hits.map((h) => el("tr", { class: "search-hit" },
      el("td", {}, h.matched),
      el("td", { class: "mono" }, h.saga ? el("a", { href: "#/saga/" + encodeURIComponent(h.saga.id) + "?type=" + encodeURIComponent(h.saga.type) }, h.saga.id) : ""),
      el("td", {}, h.saga ? h.saga.business_key : ""),
      el("td", {}, h.saga ? h.saga.state : ""),
      el("td", {}, h.parked_id ? el("a", { href: "#/parked?" + new URLSearchParams(h.saga ? { saga_id: h.saga.id } : { message_type: h.message_type }) + "&include_replayed=true" }, "parked #" + h.parked_id) : "",
        h.message_id ? el("div", { class: "mono small muted" }, short(h.message_type) + " " + h.message_id) : "")));
    fill(view, el("h2", {}, "Search ", el("span", { class: "mono" }, q)),
      el("table", { id: "search-results" },
        el("colgroup", {}, [14, 28, 18, 16, 24].map((w) => el("col", { class: "w" + w }))),
        el("thead", {}, el("tr", {}, ["Matched", "Saga", "Business key", "State", "Message"].map((h) => el("th", {}, h)))),
        el("tbody", {}, rows.length ? rows : el("tr", {}, el("td", { colspan: 5, class: "muted" }, "Nothing matches: a saga id, a business key (or its start), a message id or a correlation id.")))),
      res.truncated ? el("p", { class: "warning" }, "More match than shown.") : "");
  }

  // ---- operator log -------------------------------------------------------------

  async function showLog(view, params) {
    const operator = el("input", { type: "text", id: "l-operator", placeholder: "operator", value: params.get("operator") || "" });
    const action = el("select", { id: "l-action" }, ["", "retry", "compensate", "cancel", "resolve", "replay", "dismiss"]
      .map((a) => el("option", { value: a, selected: (params.get("action") || "") === a }, a || "any action")));
    const form = el("form", { class: "filters card", onsubmit: (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (operator.value) q.set("operator", operator.value);
      if (action.value) q.set("action", action.value);
      location.hash = "#/log" + (q.toString() ? "?" + q : "");
    } }, el("label", {}, "Operator", operator), el("label", {}, "Action", action), el("button", { type: "submit" }, "Apply"));
    const tbody = el("tbody", { id: "log-rows" });
    const more = el("div", { class: "more" });
    fill(view, el("h2", {}, "Operator actions"), form,
      el("table", { id: "log-table" },
        el("colgroup", {}, [17, 9, 12, 24, 14, 24].map((w) => el("col", { class: "w" + w }))),
        el("thead", {}, el("tr", {}, ["When", "Who", "Action", "Saga", "State", "Why"].map((h) => el("th", {}, h)))), tbody),
      more);
    const q = new URLSearchParams();
    for (const k of ["operator", "action"]) if (params.get(k)) q.set(k, params.get(k));
    const load = async (cursor) => {
      if (cursor) q.set("cursor", cursor);
      const page = await api("operator-log?" + q);
      for (const a of page.items) {
        tbody.append(el("tr", { class: "log-row" },
          el("td", {}, when(a.at)), el("td", {}, a.operator), el("td", {}, a.action.replace(/^operator\./, "")),
          el("td", {}, el("a", { class: "mono", href: "#/saga/" + encodeURIComponent(a.saga_id) + "?type=" + encodeURIComponent(a.saga_type) }, a.saga_id),
            a.business_key ? el("div", {}, a.business_key) : "", el("div", { class: "muted small" }, short(a.saga_type))),
          el("td", {}, a.from === a.to ? a.to : a.from + " → " + a.to),
          el("td", { class: "reason" }, a.note)));
      }
      if (!tbody.children.length) tbody.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "No operator actions yet.")));
      fill(more, page.next_cursor ? el("button", { type: "button", class: "secondary", onclick: () => load(page.next_cursor).catch((e) => showError(e.message)) }, "Load more") : "");
    };
    await load("");
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

  // markOperator marks the arrows only operator actions take, their labels,
  // and the operator lines of other labels, so that they can be hidden.
  function markOperator(svg) {
    const pairs = new Set();
    for (const g of svg.querySelectorAll("g.edge.operator")) {
      g.classList.add("operator-edge");
      pairs.add(g.getAttribute("data-from") + "→" + g.getAttribute("data-to"));
    }
    for (const g of svg.querySelectorAll("g.label")) {
      if (pairs.has(g.getAttribute("data-from") + "→" + g.getAttribute("data-to"))) g.classList.add("operator-label");
      else for (const t of g.querySelectorAll("text")) if (/^operator\./.test(t.textContent)) t.classList.add("operator-line");
    }
  }

  // diagramView loads a saga type's state diagram (GET
  // api/types/{type}/diagram.svg, with the token like every call), the
  // current state highlighted and the visited ones marked when given. The
  // operator's arrows are hidden until asked for.
  async function diagramView(type, current, visited, fit) {
    const box = el("div", { class: "diagram hide-operator " + (fit ? "fit" : "zoom"), id: "diagram" });
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
      const svg = document.importNode(root, true);
      markOperator(svg);
      box.append(svg);
    } catch (e) {
      if (e instanceof APIError && e.status === 401) throw e;
      box.append(el("p", { class: "muted" }, "The state diagram could not be shown: " + e.message));
    }
    const opToggle = el("input", { type: "checkbox", id: "show-operator", onchange: () => box.classList.toggle("hide-operator", !opToggle.checked) });
    const size = el("button", { type: "button", class: "secondary", id: "diagram-size", onclick: () => {
      const nowFit = box.classList.toggle("fit");
      box.classList.toggle("zoom", !nowFit);
      size.textContent = nowFit ? "Actual size" : "Fit to width";
      if (!nowFit) centerDiagram(box);
    } }, fit ? "Actual size" : "Fit to width");
    const tools = el("div", { class: "diagram-tools" },
      el("label", { class: "check" }, opToggle, "show operator actions (retry, compensate, cancel, resolve)"), size);
    return { box, tools };
  }

  // centerDiagram scrolls a diagram shown at its size so that the current
  // state is in the middle.
  function centerDiagram(box) {
    const cur = box.querySelector("g.state.current");
    if (!cur || !box.classList.contains("zoom")) return;
    const b = box.getBoundingClientRect(), c = cur.getBoundingClientRect();
    box.scrollLeft += (c.left + c.width / 2) - (b.left + b.width / 2);
    box.scrollTop += (c.top + c.height / 2) - (b.top + b.height / 2);
  }

  // stepsTable is a definition's steps, the current one highlighted.
  function stepsTable(steps, currentStep) {
    return el("table", { id: "steps" },
      el("colgroup", {}, [5, 28, 17, 27, 23].map((w) => el("col", { class: "w" + w }))),
      el("thead", {}, el("tr", {}, ["#", "Step", "Role", "Sends / waits for", "Timeout"].map((h) => el("th", {}, h)))),
      el("tbody", {}, steps.map((st, i) => el("tr", { class: st.name === currentStep ? "current" : null, "data-step": st.name },
        el("td", {}, i + 1), el("td", {}, st.name), el("td", {}, st.role),
        el("td", {}, st.command ? short(st.command) : "event", el("div", { class: "muted small" }, (st.success_replies || []).map(short).join(", "))),
        el("td", {}, st.timeout ? st.timeout + " → " + st.on_timeout : "—", el("div", { class: "muted small" }, "max " + st.max_attempts + " attempt(s)"))))));
  }

  // showTypes lists the saga types, or shows one: its state diagram, states
  // and steps.
  async function showTypes(view, name) {
    if (!name) {
      fill(view, el("h2", {}, "Saga types"),
        el("ul", { id: "types" }, types.map((t) => el("li", {}, el("a", { href: "#/types/" + encodeURIComponent(t.name) }, t.name)))));
      return;
    }
    const t = types.find((x) => x.name === name);
    if (!t) throw new Error("no saga type " + name);
    const d = await diagramView(t.name, "", [], true);
    fill(view,
      el("h2", {}, "Saga type ", el("span", { class: "mono", id: "type-name" }, t.name)),
      el("div", { class: "card" }, el("h3", {}, "Steps"), stepsTable(t.steps, ""),
        el("p", {}, el("a", { href: "#/sagas?type=" + encodeURIComponent(t.name) }, "Its sagas"))),
      el("div", { class: "card" }, el("h3", {}, "State diagram"), d.tools, d.box,
        el("details", {}, el("summary", {}, "Mermaid state diagram source"), el("pre", { id: "mermaid" }, t.mermaid))));
  }

  // ---- one saga -----------------------------------------------------------

  async function showSaga(view, id, params) {
    const q = params.get("type") ? "?type=" + encodeURIComponent(params.get("type")) : "";
    const [tl, cbs] = await Promise.all([api("sagas/" + encodeURIComponent(id) + q), api("callbacks?saga=" + encodeURIComponent(id))]);
    const s = tl.saga;
    const facts = el("dl", { class: "grid", id: "facts" },
      [["Type", el("a", { href: "#/types/" + encodeURIComponent(s.type) }, s.type)], ["Business key", s.business_key], ["State", s.state], ["Version", s.version],
        ["Attempt", s.attempt], ["Created", when(s.created_at)], ["Updated", when(s.updated_at)],
        ["Timeout at", when(s.timeout_at)], ["Deadline at", when(s.deadline_at)],
        ["Last error", s.last_error], ["Review reason", s.review_reason], ["Stuck", s.stuck_reason],
        ["Cancel requested", tl.progress.cancel ? cancelText(tl.progress.cancel, s.state) : ""]]
        .filter(([, v]) => v !== undefined && v !== "")
        .map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const states = el("ol", { class: "states", id: "states" },
      tl.states.map((st) => el("li", { class: [st.current ? "current" : "", st.visited ? "visited" : ""].join(" ").trim() || null, "data-state": st.name, title: st.kind }, st.name)));
    const pos = tl.position;
    const next = el("ul", {}, (pos.next || []).map((n) => el("li", {}, (n.trigger.split(".").length > 2 ? short(n.trigger) : n.trigger) + " → " + n.to +
      (n.emits && n.emits.length ? " (sends " + n.emits.map(short).join(", ") + ")" : ""))));
    const events = el("tbody", { id: "events" }, tl.events.map(eventRow));
    const d = await diagramView(s.type, s.state, tl.states.filter((st) => st.visited).map((st) => st.name), false);
    const layout = el("div", { class: "saga-layout", id: "saga-layout" });
    const open = tl.events.filter((e) => e.kind === "parked" && !e.replayed_at && !e.dismissed_at);
    fill(layout,
      el("div", { id: "story" },
        el("div", { class: "card", id: "position" }, el("h3", {}, "Where it is"), el("p", { id: "position-summary" }, pos.summary),
          pos.members && pos.members.length ? membersList(pos) : "", facts),
        canRepair() ? actions(s, tl.actions) : "",
        open.length ? parkedCard(s, open) : "",
        cbs.callbacks.length ? callbacksCard(cbs.callbacks) : "",
        el("h3", {}, "Timeline ", el("span", { class: "muted" },
          `${tl.counts.transitions} transitions, ${tl.counts.messages_out} sent, ${tl.counts.messages_in} received, ${tl.counts.retries} retries, ${tl.counts.parked} parked`)),
        tl.truncated ? el("p", { class: "warning", id: "timeline-truncated" },
          "Cut: this saga has more than 1000 transitions, sent messages or parked messages; only the newest 1000 of each are shown.") : "",
        el("table", { id: "timeline" },
          el("colgroup", {}, [20, 12, 30, 38].map((w) => el("col", { class: "w" + w }))),
          el("thead", {}, el("tr", {}, ["When", "Kind", "What", "Cause / detail"].map((h) => el("th", {}, h)))), events),
        tl.data ? el("div", { class: "card" }, el("h3", {}, "Saga data ", el("span", { class: "muted" }, tl.data.redacted && tl.data.redacted.length ? "(redacted: " + tl.data.redacted.join(", ") + ")" : "")),
          tl.data.json ? el("pre", { id: "saga-data" }, JSON.stringify(tl.data.json, null, 2)) : el("p", { class: "muted" }, tl.data.note)) : ""),
      el("div", { id: "definition" },
        el("div", { class: "card" }, el("h3", {}, "Definition: ", el("a", { href: "#/types/" + encodeURIComponent(s.type) }, short(s.type))),
          stepsTable(tl.steps, pos.step), states,
          pos.next && pos.next.length ? el("details", {}, el("summary", {}, "What can happen next (" + pos.next.length + ")"), next) : ""),
        el("div", { class: "card" }, el("h3", {}, "State diagram"), d.tools, d.box,
          el("details", {}, el("summary", {}, "Mermaid state diagram source"), el("pre", { id: "mermaid" }, tl.mermaid)))));
    fill(view, el("h2", {}, "Saga ", el("span", { class: "mono", id: "saga-id" }, s.id), " ",
      el("span", { class: "badge" + (s.state === "MANUAL_REVIEW" ? " review" : s.stuck ? " stuck" : ""), id: "saga-state" }, s.state)), layout);
    return () => centerDiagram(d.box);
  }

  // cancelText says who asked to cancel the saga and why, and, in manual
  // review, what the request changes for the operator.
  function cancelText(c, state) {
    const text = "by " + (c.requested_by || "an unnamed requester") + (c.reason ? ": " + c.reason : "");
    return state === "MANUAL_REVIEW" ? text + " (recorded in review: compensate and the saga ends CANCELLED, answering a parent that asked)" : text;
  }

  // membersList lists the members of the parallel group the saga waits
  // on that have not answered yet: each one's attempt, timeout and pending
  // command.
  function membersList(pos) {
    return el("ul", { id: "group-members", class: "members" }, pos.members.map((m) =>
      el("li", { class: "group-member", "data-step": m.step },
        el("b", {}, m.step), ` (group ${pos.group}): attempt ${m.attempt} of ${m.max_attempts}, times out `, when(m.timeout_at),
        ` (then ${m.on_timeout}); waiting for the answer to `, el("span", { class: "mono" }, m.pending_message_id))));
  }

  // callbacksCard lists a saga's HTTP callbacks (its outcomes told to the
  // client) with their delivery status; a parked one can be replayed.
  function callbacksCard(list) {
    const rows = list.map((c) => {
      const out = el("span", { class: "result" });
      const replay = async () => {
        const reason = await confirmRepair("Replay callback " + c.id,
          "Replay makes this " + c.event + " callback due again with a fresh retry budget, to " + (c.url || "client " + c.client) +
          "; it keeps its id, so a receiver that did process it deduplicates.", "Replay", false);
        if (reason === null) return;
        try {
          const res = await api("callbacks/" + c.id + "/replay", { method: "POST", body: { reason } });
          flash(el("span", { class: "badge" }, res.callback.status), " callback " + c.id + " is due again");
        } catch (e) {
          fill(out, el("span", { class: "badge refused" }, (e.body && e.body.code) || "error"), " ", e.message);
        }
      };
      const detail = c.park_reason || c.last_error || (c.last_status ? "HTTP " + c.last_status : "");
      return el("tr", { class: "saga-callback", "data-id": c.id, "data-status": c.status },
        el("td", {}, c.event, el("div", { class: "mono small muted" }, c.id)),
        el("td", {}, el("span", { class: "badge" + (c.status === "parked" ? " review" : "") }, c.status),
          el("div", { class: "small" }, c.attempts + " attempt(s)"), when(c.delivered_at || c.parked_at || c.next_attempt_at)),
        el("td", { class: "small" }, c.url || "client " + c.client, detail ? el("div", { class: "muted" }, detail) : ""),
        el("td", {}, c.status === "parked" && canRepair()
          ? el("div", { class: "inline" }, el("button", { type: "button", class: "callback-replay", "data-id": c.id, onclick: replay }, "Replay…"), out) : ""));
    });
    return el("div", { class: "card", id: "saga-callbacks" }, el("h3", {}, "Callbacks"),
      el("table", {}, el("colgroup", {}, [30, 20, 34, 16].map((w) => el("col", { class: "w" + w }))), el("tbody", {}, rows)));
  }

  // parkedCard lists a saga's open parked copies with their standing and
  // repairs, and dismisses the superseded ones together.
  function parkedCard(s, open) {
    const superseded = open.filter((e) => e.standing === "superseded");
    const rows = open.map((e) => el("tr", { class: "saga-parked", "data-id": e.parked_id, "data-standing": e.standing || "" },
      el("td", {}, e.parked_id), el("td", {}, short(e.message_type), el("div", { class: "mono small muted" }, e.message_id)),
      el("td", {}, standingView(e)),
      el("td", {}, parkedActions({ id: e.parked_id, message_id: e.message_id, message_type: e.message_type, exchange: e.exchange,
        routing_key: e.routing_key, standing: e.standing, standing_note: e.standing_note }))));
    const all = canRepair() && superseded.length ? el("button", { type: "button", class: "secondary", id: "dismiss-superseded", onclick: async () => {
      const reason = await confirmRepair("Dismiss the superseded copies",
        "Dismisses " + superseded.length + " parked cop" + (superseded.length === 1 ? "y" : "ies") + " of this saga that no longer appl" +
        (superseded.length === 1 ? "ies" : "y") + " (" + superseded.map((e) => "#" + e.parked_id).join(", ") + "); the current copy, if any, stays open.", "Dismiss " + superseded.length, true);
      if (reason === null) return;
      try {
        const res = await api("bulk/parked/dismiss", { method: "POST", body: { filter: { saga_id: s.id }, reason } });
        flash("dismiss done: ", Object.entries(res.counts).map(([k, v]) => [outcomeBadge(k), " " + v + " "]));
      } catch (e) { showError(e.message); }
    } }, "Dismiss superseded (" + superseded.length + ")…") : "";
    return el("div", { class: "card", id: "saga-parked" }, el("h3", {}, "Parked copies ", all),
      el("table", {}, el("colgroup", {}, [6, 30, 34, 30].map((w) => el("col", { class: "w" + w }))), el("tbody", {}, rows)));
  }

  function eventRow(e) {
    let detail = [];
    if (e.kind === "transition") {
      detail = [e.message_id ? "message " + e.message_id : "", e.causation_id ? " caused by " + e.causation_id : "", e.operator ? "operator " + e.operator : "", e.note ? el("div", { class: "muted" }, e.note) : ""];
    } else if (e.kind === "message") {
      const published = e.outside ? "" : e.published_at ? [" published ", when(e.published_at)] : " not yet published";
      detail = [el("span", { class: "mono small" }, e.message_id), published, e.received_at ? [", applied ", when(e.received_at)] : "", e.body ? bodyView(e.body) : ""];
    } else if (e.kind === "parked") {
      detail = [e.queue + ": " + e.reason, e.standing ? el("div", {}, el("span", { class: "badge " + e.standing }, e.standing)) : "", e.body ? bodyView(e.body) : ""];
    }
    return el("tr", { class: "event kind-" + e.kind },
      el("td", {}, when(e.at)),
      el("td", {}, e.kind + (e.direction ? " (" + e.direction + ")" : "")),
      el("td", {}, e.summary),
      el("td", { class: "reason" }, detail));
  }

  function bodyView(b) {
    const label = "body (" + b.size + " bytes" + (b.redacted && b.redacted.length ? ", redacted: " + b.redacted.join(", ") : "") + ")";
    return el("details", {}, el("summary", {}, label),
      b.json ? el("pre", { class: "body" }, JSON.stringify(b.json, null, 2)) : el("p", { class: "muted" }, b.note || ""));
  }

  const ACTION_LABELS = { retry: "Retry step…", compensate: "Compensate…", cancel: "Cancel saga…", resolve: "Resolve as " };

  // actions offers the repairs the state machine allows now, each behind a
  // confirmation naming its effect; the version the operator looks at goes
  // with it (the server refuses if the saga moved on).
  function actions(s, views) {
    const allowed = (views || []).filter((a) => a.allowed);
    const out = el("div", { class: "result", id: "action-result" });
    const buttons = allowed.map((a) => {
      const label = a.action === "resolve" ? ACTION_LABELS.resolve + a.to + "…" : ACTION_LABELS[a.action];
      const danger = a.action === "cancel" || a.action === "compensate" || a.action === "resolve";
      return el("button", { type: "button", class: danger ? "danger" : "", id: "act-" + a.action + (a.to ? "-" + a.to.toLowerCase() : ""),
        onclick: async () => {
          const reason = await confirmRepair(label.replace("…", "") + ": saga " + s.business_key, a.effect,
            label.replace("…", "") + " (version " + s.version + ")", danger,
            el("p", { class: "muted small" }, "Decided on version " + s.version + " in state " + s.state + "; if the saga moves on first, the server refuses."));
          if (reason === null) return;
          try {
            const body = { expected_version: s.version, reason, type: s.type };
            if (a.to) body.to = a.to;
            const res = await api("sagas/" + encodeURIComponent(s.id) + "/" + a.action, { method: "POST", body });
            flash(outcomeBadge(res.outcome), " " + label.replace("…", "") + ": the saga is now " + res.saga.state + ", version " + res.saga.version);
          } catch (e) {
            fill(out, el("span", { class: "badge error" }, (e.body && e.body.code) || "error"), " ", e.message);
          }
        } }, label);
    });
    const refused = (views || []).filter((a) => !a.allowed && a.action !== "resolve").map((a) => a.action + ": " + a.refusal);
    return el("div", { class: "card", id: "actions" }, el("h3", {}, "Repair"),
      buttons.length ? el("div", { class: "repairs" }, buttons) : el("p", { class: "muted", id: "no-repairs" }, "No repair applies in state " + s.state + "."),
      refused.length && buttons.length ? el("details", {}, el("summary", {}, "Not offered here"), el("ul", {}, refused.map((r) => el("li", {}, r)))) : "",
      out);
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const tok = $("token").value.trim();
      if (tok) signIn(tok);
    });
    $("search-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const q = $("q").value.trim();
      if (q) location.hash = "#/search?q=" + encodeURIComponent(q);
    });
    $("tz-toggle").addEventListener("click", () => {
      localStorage.setItem(TZ_KEY, utc() ? "local" : "utc");
      setTZButton();
      route();
    });
    $("live").addEventListener("change", () => setLive($("live").checked));
    setTZButton();
    setLive(localStorage.getItem(LIVE_KEY) === "on");
    window.addEventListener("hashchange", route);
    route();
  });
})();
