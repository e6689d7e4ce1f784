/* The "live" indicator tells the truth: green only while this page hears the server. The server sends
   every open socket a heartbeat (an HTML comment, every LIVE_HEARTBEAT_S = 1 s, core/live.py) through
   the same path as its pushes; any frame counts as heard. Silent for STALE_S, or a closed socket, and
   the page says in words that it is not live (docs/concepts/architecture.md, "Live pages").
   No state, no requests. */
(function () {
  "use strict";
  // Two and a half missed heartbeats: red within about 3 s of the last push path that worked (issue
  // 18: the dot turns red "when pushes are not arriving"), with slack for a busy machine's jitter.
  var STALE_S = 3.5;
  var heard = new WeakMap(); // socket element -> last time a frame (or the open) was heard

  function status() {
    var el = document.getElementById("live-status");
    if (!el) {
      var host = document.querySelector(".topbar .who") || document.body;
      el = document.createElement("span");
      el.id = "live-status";
      el.className = "live-status";
      el.setAttribute("role", "status");
      el.setAttribute("aria-live", "polite");
      host.insertBefore(el, host.firstChild);
    }
    return el;
  }
  function show(socketElt, words, stale) {
    socketElt.classList.toggle("ws-stale", stale);
    var el = status();
    el.classList.toggle("stale", stale);
    el.dataset.live = stale ? "no" : "yes";
    if (el.textContent !== words) el.textContent = words;
  }
  function check() {
    var now = Date.now();
    document.querySelectorAll("[ws-connect]").forEach(function (socketElt) {
      var at = heard.get(socketElt);
      if (!socketElt.classList.contains("ws-open")) {
        show(socketElt, "not live: the connection to the server is closed, reconnecting; this page may be out of date", true);
      } else if (at === undefined || now - at > STALE_S * 1000) {
        var quiet = at === undefined ? "" : " for " + Math.round((now - at) / 1000) + " s";
        show(socketElt, "not live: nothing heard from the server" + quiet + "; this page may be out of date (reload it)", true);
      } else {
        show(socketElt, "live", false);
      }
    });
  }
  function hear(event) {
    var socketElt = event.target && event.target.closest && event.target.closest("[ws-connect]");
    if (socketElt) heard.set(socketElt, Date.now());
  }
  document.addEventListener("htmx:wsOpen", function (event) { hear(event); setTimeout(check, 0); });
  document.addEventListener("htmx:wsBeforeMessage", hear);
  document.addEventListener("htmx:wsClose", function () { setTimeout(check, 0); });
  setInterval(check, 500);
})();
