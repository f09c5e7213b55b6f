// Rialto dashboard. Pages work without this script; it adds the live
// event stream to the events page (Server-Sent Events through /ui/events/stream,
// which carries the session's token on the server side).
(function () {
  "use strict";
  var table = document.getElementById("events");
  if (!table || !window.EventSource || !table.dataset.stream) {
    return;
  }
  var tbody = table.tBodies[0];
  var status = document.getElementById("stream-status");
  var fresh = 0;
  var classes = {
    ready: "ok", active: "ok", up: "ok", available: "ok", feasible: "ok",
    suspect: "warn", reserved: "warn", releasing: "warn", requested: "warn",
    down: "bad", failed: "bad", lost: "bad", infeasible: "bad", unavailable: "bad"
  };
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    if (cls) {
      td.className = cls;
    }
    td.textContent = text;
    tr.appendChild(td);
    return td;
  }
  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }
  var src;
  function open() {
    src = new EventSource(table.dataset.stream);
    src.onopen = onopen;
    src.onerror = onerror;
    src.onmessage = onmessage;
  }
  function onopen() {
    say(fresh ? "(live; " + fresh + " new)" : "(live)");
    table.setAttribute("data-live", "1");
  }
  function onerror() {
    say("(reconnecting…)");
    table.removeAttribute("data-live");
  }
  function onmessage(m) {
    var ev;
    try {
      ev = JSON.parse(m.data);
    } catch (e) {
      return;
    }
    var tr = document.createElement("tr");
    tr.className = "new";
    tr.setAttribute("data-id", String(ev.id));
    cell(tr, String(ev.id), "num");
    cell(tr, String(ev.at).replace("T", " ").replace(/\.\d+Z$/, "Z"));
    cell(tr, ev.type);
    var subj = cell(tr, "");
    if (/^lease-/.test(ev.subject)) {
      var a = document.createElement("a");
      a.href = "/ui/leases/" + encodeURIComponent(ev.subject);
      a.textContent = ev.subject;
      subj.appendChild(a);
    } else {
      subj.textContent = ev.subject;
    }
    var st = document.createElement("span");
    st.className = "st " + (classes[ev.state] || "idle");
    st.textContent = ev.state;
    cell(tr, "").appendChild(st);
    cell(tr, ev.message);
    tbody.insertBefore(tr, tbody.firstChild);
    while (tbody.rows.length > 500) {
      tbody.deleteRow(tbody.rows.length - 1);
    }
    var none = document.getElementById("no-events");
    if (none) {
      none.remove();
    }
    fresh++;
    say("(live; " + fresh + " new)");
  }
  // Open the stream once the page has loaded: a stream opened earlier
  // keeps the page "loading" in some browsers.
  if (document.readyState === "complete") {
    setTimeout(open, 0);
  } else {
    window.addEventListener("load", function () { setTimeout(open, 0); });
  }
})();
