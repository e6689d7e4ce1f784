// Ages that keep counting between pushes: "in flight 12 s" on an effect row. The server renders the
// age at push time; this only advances it (no state, no requests).
(function () {
  function tick() {
    var now = Date.now();
    document.querySelectorAll(".age[data-since]").forEach(function (el) {
      var since = Date.parse(el.getAttribute("data-since"));
      if (isNaN(since)) return;
      var s = Math.max(0, Math.round((now - since) / 1000));
      el.textContent = "in flight " + (s < 120 ? s + " s" : Math.floor(s / 60) + " min");
    });
  }
  setInterval(tick, 1000);
})();
