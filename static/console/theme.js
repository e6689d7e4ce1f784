/* Before first paint: the stored theme (toggle), else the system's (prefers-color-scheme). */
(function () {
  var stored = null;
  try { stored = localStorage.getItem("cp-theme"); } catch (e) { /* storage off: follow the system */ }
  var dark = window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = stored === "dark" || stored === "light" ? stored : (dark ? "dark" : "light");
})();
