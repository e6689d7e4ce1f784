// Copy buttons of {% copyable_id %}: one delegated listener, so ids swapped in by htmx work too.
document.addEventListener("click", function (event) {
  var button = event.target.closest("button.copy[data-copy]");
  if (!button) return;
  var text = button.getAttribute("data-copy");
  var done = function () {
    button.classList.add("copied");
    setTimeout(function () { button.classList.remove("copied"); }, 1200);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(done);
  } else {
    var field = document.createElement("textarea");
    field.value = text;
    document.body.appendChild(field);
    field.select();
    document.execCommand("copy");
    field.remove();
    done();
  }
});
