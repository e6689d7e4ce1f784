/* Console habits: copy any id, the theme toggle, and keyboard shortcuts
   ("/" search, j/k move in a list, Enter open, "?" help, Esc close). No framework. */
(function () {
  "use strict";

  // --- copy ids: <button class="copy" data-copy="…"> (console/templates/console/_id.html) -------------------------
  function copy(text, button) {
    var done = function () {
      button.classList.add("copied");
      button.setAttribute("title", "copied");
      setTimeout(function () { button.classList.remove("copied"); button.setAttribute("title", "copy " + text); }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(done, function () { fallback(text); done(); });
    } else { fallback(text); done(); }
  }
  function fallback(text) {
    var area = document.createElement("textarea");
    area.value = text; area.setAttribute("readonly", ""); area.style.position = "fixed"; area.style.opacity = "0";
    document.body.appendChild(area); area.select();
    try { document.execCommand("copy"); } catch (e) { /* nothing more to try */ }
    document.body.removeChild(area);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button.copy[data-copy]");
    if (!button) return;
    event.preventDefault(); event.stopPropagation(); // a copy button inside a link must not follow it
    copy(button.dataset.copy, button);
  }, true);

  // --- theme toggle (theme.js applied the stored or system theme before paint) --------------------
  function setTheme(theme) {
    document.documentElement.dataset.theme = theme;
    try { localStorage.setItem("cp-theme", theme); } catch (e) { /* not remembered */ }
  }
  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("[data-theme-toggle]")) {
      setTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark");
    }
  });
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function (e) {
      var stored = null;
      try { stored = localStorage.getItem("cp-theme"); } catch (err) { /* ignore */ }
      if (!stored) document.documentElement.dataset.theme = e.matches ? "dark" : "light";
    });
  }

  // --- keyboard shortcuts --------------------------------------------------------------------------
  function typing(el) {
    return el && (el.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(el.tagName));
  }
  function rows() {
    return Array.prototype.slice.call(document.querySelectorAll("table[data-keys] tbody tr[data-href]"));
  }
  // The selection is a row's id (a run), not a position: a live push that redraws the selected row
  // or puts a new one above it must not move it onto another run (Enter would open the wrong one).
  var current = -1, selectedId = null;
  function mark(row) {
    rows().forEach(function (r) { if (r !== row) { r.classList.remove("selected"); r.removeAttribute("aria-selected"); } });
    row.classList.add("selected"); row.setAttribute("aria-selected", "true");
  }
  function select(index) {
    var list = rows();
    if (!list.length) return;
    index = Math.max(0, Math.min(list.length - 1, index));
    var row = list[index];
    mark(row);
    row.scrollIntoView({ block: "nearest" });
    current = index; selectedId = row.id || null;
  }
  // After a swap: the selected row again, found by its id, without scrolling the page under the
  // person. A row a push removed takes the selection with it; a redraw the person asked for (a
  // filter, a page) keeps the position when the row is not on the new page.
  function reselect(live) {
    var row = selectedId && document.getElementById(selectedId);
    if (row && rows().indexOf(row) >= 0) { if (!row.classList.contains("selected")) mark(row); current = rows().indexOf(row); return; }
    if (!live && current >= 0) { select(Math.min(current, rows().length - 1)); return; }
    if (live && selectedId) { current = -1; selectedId = null; }
  }
  function selectedIndex() {
    var list = rows();
    for (var i = 0; i < list.length; i++) if (list[i].classList.contains("selected")) return i;
    return -1;
  }
  function help(show) {
    var box = document.getElementById("shortcuts");
    if (!box) return;
    if (show === undefined) show = box.hidden;
    box.hidden = !show;
  }
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape") { help(false); if (typing(document.activeElement)) document.activeElement.blur(); return; }
    if (typing(event.target)) return;
    var key = event.key;
    if (key === "/") {
      var search = document.querySelector("[data-search]");
      event.preventDefault();
      if (search) { search.focus(); search.select(); }
      else { window.location.assign("/#search"); } // pages without a search box: the run list's
    } else if (key === "j" || key === "k") {
      var at = selectedIndex();
      select(at < 0 ? 0 : at + (key === "j" ? 1 : -1));
      event.preventDefault();
    } else if (key === "Enter") {
      var list = rows(), i = selectedIndex();
      if (i >= 0 && list[i]) { event.preventDefault(); window.location.assign(list[i].dataset.href); }
    } else if (key === "?") {
      event.preventDefault(); help();
    }
  });
  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("[data-help]")) help();
  });
  if (window.location.hash === "#search") {
    var box = document.querySelector("[data-search]");
    if (box) box.focus();
  }
  // A click on a row's empty space opens it too; links and buttons inside keep their own meaning.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("table[data-keys] tbody tr[data-href]");
    if (!row || event.target.closest("a, button, input, label, details")) return;
    window.location.assign(row.dataset.href);
  });
  // htmx wires swapped-in content (its triggers: a dialog option's "change" that re-previews) only
  // when it settles, ~20 ms after the content shows. Mark each form once it is wired, so that a
  // test (or anything scripted) can wait for it instead of changing an option nobody listens to yet.
  document.addEventListener("htmx:load", function (event) {
    var el = event.target;
    if (!el || !el.querySelectorAll) return;
    if (el.matches && el.matches("form")) el.setAttribute("data-wired", "");
    el.querySelectorAll("form").forEach(function (form) { form.setAttribute("data-wired", ""); });
  });
  // An open dialog holds still under live pushes: nothing a push sends targets it. When the run
  // header a push redrew has moved past the basis the preview was drawn on, the dialog says so in
  // place (console/run_moved.py's ``moved`` is the same rule, for pages without a run header).
  function parse(text) { try { return JSON.parse(text || "null"); } catch (e) { return null; } }
  function n(count, what) { return count + " " + what + (count === 1 ? "" : "s"); }
  function runMoved(before, now) {
    if (!before || !now || !(now.head > before.head)) return [];
    var parts = [], d;
    if ((d = now.effects - before.effects) > 0) parts.push(n(d, "new effect"));
    if ((d = before.unresolved - now.unresolved) > 0) parts.push(n(d, "effect") + " settled");
    if ((d = now.checkpoints - before.checkpoints) > 0) parts.push(n(d, "new checkpoint"));
    if (now.state !== before.state) parts.push("state " + before.state + " \u2192 " + now.state);
    return parts.length ? parts : [n(now.head - before.head, "new event")];
  }
  // The reconcile dialog's basis is its effect's status: when the ledger row a push redrew shows
  // another one, the dialog says so in place (the record is re-checked by the service anyway).
  function reconcileMoved() {
    var form = document.querySelector("#dialog form[data-effect]"), note = document.getElementById("reconcile-note");
    if (!form || !note) return;
    var row = document.getElementById("effect-" + form.dataset.effect);
    var status = row && row.querySelector(".st");
    var now = status && status.textContent.trim();
    if (!now || now === form.dataset.status) return;
    note.querySelector("[data-moved]").textContent = now;
    note.hidden = false;
  }
  document.addEventListener("htmx:wsAfterMessage", function () {
    var header = document.getElementById("run-header"), preview = document.getElementById("preview");
    var note = document.getElementById("preview-note");
    reconcileMoved();
    if (!header || !preview || !note) return;
    var parts = runMoved(parse(preview.dataset.basis), parse(header.dataset.basis));
    if (!parts.length) return;
    note.querySelector("[data-moved]").textContent = parts.join(", ");
    note.hidden = false;
  });
  // A pushed list entry (a timeline line, a ledger row) goes where a reload would draw it: one the
  // page already shows is replaced in place (the receipt's out-of-band redraw and the socket's push
  // can both carry the same new line, and a line's status changes), a new one is placed by its
  // data-key (newest first, the server's sort) rather than on top: pushes do not arrive in commit
  // order. What the page shows stays what a reload would show (docs/operator/console.md).
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var target = event.detail.target, fragment = event.detail.fragment;
    if (!target || !fragment || !/^(timeline-list|effects-body)$/.test(target.id)) return;
    Array.prototype.slice.call(fragment.children).forEach(function (fresh) {
      var old = fresh.id && document.getElementById(fresh.id);
      if (old && old.parentNode === target) {
        fresh.querySelectorAll("[hx-preserve][id]").forEach(function (keep) {
          var opened = old.querySelector("#" + CSS.escape(keep.id));
          if (opened) keep.replaceWith(opened); // what the operator unfolded stays unfolded
        });
        old.replaceWith(fresh);
      } else {
        var key = fresh.getAttribute("data-key") || "", before = null;
        for (var row = target.firstElementChild; row; row = row.nextElementSibling) {
          var at = row.getAttribute("data-key");
          if (at === null ? /-older$/.test(row.id) : at < key) { before = row; break; }
        }
        target.insertBefore(fresh, before);
      }
      htmx.process(fresh);
    });
    event.detail.shouldSwap = false; // placed, each one
  });
  document.addEventListener("htmx:afterSwap", function () { if (current >= 0) reselect(false); });
  document.addEventListener("htmx:wsAfterMessage", function () { if (selectedId) reselect(true); });
  // What the person unfolded stays unfolded when the region holding it is redrawn (the Workers
  // page refreshes itself, pushes redraw rows): a fold is known by its row (the nearest element with
  // an id or a data-worker), its place in that row and its summary, and is opened again after the swap.
  var unfolded = {};
  function foldKey(d) {
    var anchor = d.parentElement && d.parentElement.closest("[id], [data-worker]");
    var within = anchor ? anchor.querySelectorAll("details") : document.querySelectorAll("details");
    var summary = d.querySelector("summary");
    return (anchor ? anchor.id || "worker:" + anchor.getAttribute("data-worker") : "") + "|" +
      Array.prototype.indexOf.call(within, d) + "|" + (summary ? summary.textContent.trim() : "");
  }
  function noteFolds(event) {
    var target = event.detail && event.detail.target;
    if (!target || !target.querySelectorAll) return;
    var at = Date.now();
    target.querySelectorAll("details[open]").forEach(function (d) { unfolded[foldKey(d)] = at; });
  }
  function reopen() {
    var keys = Object.keys(unfolded), now = Date.now();
    if (!keys.length) return;
    document.querySelectorAll("details:not([open])").forEach(function (d) {
      var key = foldKey(d);
      if (unfolded[key]) { d.open = true; delete unfolded[key]; }
    });
    // a fold whose row left with the swap is forgotten (a later one alike must not open by itself)
    keys.forEach(function (key) { if (unfolded[key] && now - unfolded[key] > 2000) delete unfolded[key]; });
  }
  // A redrawn region's parts marked data-keep-if-same (the run page's action buttons) stay the very
  // elements the person is pointing at when their new drawing is the same: a push that lands between
  // a click's press and release would otherwise detach the button, and the click would be lost.
  document.addEventListener("htmx:oobBeforeSwap", function (event) {
    var fragment = event.detail.fragment;
    if (!fragment || !fragment.querySelectorAll) return;
    fragment.querySelectorAll("[data-keep-if-same][id]").forEach(function (fresh) {
      var old = document.getElementById(fresh.id);
      if (old && old.outerHTML === fresh.outerHTML) fresh.replaceWith(old);
    });
  });
  document.addEventListener("htmx:beforeSwap", noteFolds);
  document.addEventListener("htmx:oobBeforeSwap", noteFolds);
  document.addEventListener("htmx:afterSwap", reopen);
  document.addEventListener("htmx:oobAfterSwap", reopen);
  document.addEventListener("htmx:afterSettle", reopen);
})();

// A request a person started that got no usable answer says so in place, never silently: an
// operator who clicked "Pause…" during a database blip must know what the click did. A refusal that
// certainly did nothing (503 with X-Controlplane-Draining: the database gate, a draining process) is
// sent again for a GET, a few times, as the SDK does; a POST is never re-sent by the page. An answer
// that is no page of ours (a JSON refusal from before Django, a 5xx page) is not drawn into the dialog:
// its sentence is shown in #notice instead. No answer at all to a POST may mean it was recorded.
(function () {
  "use strict";
  var BACKOFF_MS = [500, 1000, 2000, 3000]; // ~6.5 s: past the refusal memory (DB_DOWN_MEMORY_S, 5 s)
  function label(elt) {
    var named = elt && (elt.matches && elt.matches("form") ? elt.querySelector("[type=submit]") : elt);
    var text = named && named.textContent ? named.textContent.trim().replace(/\s+/g, " ") : "";
    return text ? "“" + text.slice(0, 40) + "”" : "The request";
  }
  function personal(detail) {
    var cause = detail.requestConfig && detail.requestConfig.triggeringEvent;
    return !!cause && /^(click|submit|change|input|keydown|keyup)$/.test(cause.type);
  }
  function tell(text) {
    var box = document.getElementById("notice");
    if (!box) return;
    box.querySelector("[data-notice-text]").textContent = text;
    box.hidden = false;
  }
  function clear() {
    var box = document.getElementById("notice");
    if (box && !box.hidden) box.hidden = true;
  }
  function sentence(xhr) {
    try {
      var body = JSON.parse(xhr.responseText);
      if (body && body.detail) return String(body.detail);
    } catch (e) { /* not JSON: a page */ }
    return "the console answered " + xhr.status;
  }
  // The resends of one GET, by its path: the button that asked may have been redrawn meanwhile (a
  // push), so what is known of the asking (a person, their button's words) is kept here.
  var resending = {};
  function asked(d) {
    var cfg = d.requestConfig || {}, known = resending[cfg.path];
    return known || { tries: 0, byPerson: personal(d), label: label(cfg.elt) };
  }
  document.addEventListener("htmx:beforeSwap", function (event) {
    var d = event.detail, xhr = d.xhr, cfg = d.requestConfig || {}, ask = asked(d);
    delete resending[cfg.path];
    if (!xhr || xhr.status < 400) { if (ask.byPerson) clear(); return; }
    var json = /json/.test(xhr.getResponseHeader("content-type") || "");
    if (xhr.status < 500 && !json) return; // a 4xx page of ours: the dialog's own refusal, drawn in place
    d.shouldSwap = false;
    var didNothing = xhr.status === 503 && xhr.getResponseHeader("x-controlplane-draining") === "1";
    if (didNothing && cfg.verb === "get" && ask.tries < BACKOFF_MS.length) {
      resending[cfg.path] = ask;
      setTimeout(function () {
        var source = cfg.elt && document.body.contains(cfg.elt) ? cfg.elt : d.target;
        htmx.ajax("get", cfg.path, { source: source, target: d.target });
      }, BACKOFF_MS[ask.tries++]);
      return;
    }
    if (!ask.byPerson) return; // a page's own refresh: its liveness dot tells when it falls behind
    if (didNothing) {
      tell(ask.label + " was not done: the console could not reach its database just now, and did " +
        "nothing. Try again in a moment.");
    } else if (cfg.verb === "get") {
      tell(ask.label + " did not open: " + sentence(xhr) + ". Nothing was changed. Try again.");
    } else {
      tell(ask.label + " got an error answer (" + sentence(xhr) + "). It may have been recorded: " +
        "check the run's interventions and history before trying again.");
    }
  });
  function noAnswer(event) {
    var d = event.detail, cfg = d.requestConfig || {}, ask = asked(d);
    delete resending[cfg.path];
    if (!ask.byPerson) return;
    if (cfg.verb === "get") {
      tell(ask.label + " got no answer from the console. Nothing was changed. Try again.");
    } else {
      tell(ask.label + " got no answer from the console: it may or may not have been recorded. " +
        "Check the run's interventions and history before trying again.");
    }
  }
  document.addEventListener("htmx:sendError", noAnswer);
  document.addEventListener("htmx:timeout", noAnswer);
  document.addEventListener("click", function (event) {
    if (event.target.closest && event.target.closest("[data-notice-close]")) clear();
  });
})();

// A notification's link (/runs/<run>/?approval=<id>) opens the run page on that approval: its row is
// marked by the server (data-linked-approval) and scrolled to here, also after the login redirects
// lost the #fragment. The link grants nothing: the buttons are the viewer's own rights.
document.addEventListener("DOMContentLoaded", function () {
  var linked = document.querySelector("[data-linked-approval]");
  if (!linked) return;
  linked.scrollIntoView({ block: "center" });
  linked.setAttribute("tabindex", "-1");
  linked.focus({ preventScroll: true });
});
