// Sluice admin: small progressive enhancements (no inline script; the CSP allows only files
// from this server). Times are shown in the browser's time zone, copy buttons copy, and
// datetime-local inputs travel with the browser's UTC offset.
(function () {
  "use strict";

  function localTimes(root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      if (el.dataset.localised) return;
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) return;
      el.textContent = d.toLocaleString();
      el.title = el.getAttribute("datetime") + " (UTC)";
      el.dataset.localised = "1";
    });
  }

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function prefillDates(root) {
    root.querySelectorAll("input[type=datetime-local][data-utc]").forEach(function (el) {
      var v = el.getAttribute("data-utc");
      if (!v || el.value) return;
      var d = new Date(v);
      if (isNaN(d.getTime())) return;
      el.value = d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) +
        "T" + pad(d.getHours()) + ":" + pad(d.getMinutes());
    });
    root.querySelectorAll("form[data-tz] input[name=tz_offset]").forEach(function (el) {
      el.value = String(new Date().getTimezoneOffset());
    });
  }

  function enhance(root) {
    localTimes(root);
    prefillDates(root);
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("[data-copy]");
    if (!btn) return;
    var field = document.querySelector(btn.getAttribute("data-copy"));
    if (!field) return;
    field.select();
    var done = function () { btn.textContent = "Copied"; setTimeout(function () { btn.textContent = "Copy"; }, 2000); };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(field.value).then(done, function () { document.execCommand("copy"); done(); });
    } else {
      document.execCommand("copy");
      done();
    }
  });

  document.addEventListener("DOMContentLoaded", function () { enhance(document); });
  document.addEventListener("htmx:afterSettle", function (ev) { enhance(ev.target || document); });
  // Keep the UTC offset right even if the form was rendered before a zone change.
  document.addEventListener("htmx:configRequest", function (ev) {
    var offset = String(new Date().getTimezoneOffset());
    var fd = ev.detail.formData;
    if (fd && fd.has && fd.has("tz_offset")) {
      fd.set("tz_offset", offset);
    } else if (ev.detail.parameters && ev.detail.parameters.tz_offset !== undefined) {
      ev.detail.parameters.tz_offset = offset;
    }
  });
  // Forms marked data-reset are emptied after a successful submit.
  document.addEventListener("htmx:afterRequest", function (ev) {
    var form = ev.detail.elt;
    if (ev.detail.successful && form && form.matches && form.matches("form[data-reset]")) HTMLFormElement.prototype.reset.call(form);
  });
})();
