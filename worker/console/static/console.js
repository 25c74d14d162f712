// What the console does with a script; every page works without it.
"use strict";

// "Select all" for the dead-letter table; without this script every row is still selectable one by one.
function selectAll() {
  const all = document.getElementById("select-all");
  if (!all) return;
  const rows = Array.from(document.querySelectorAll("input.select-row"));
  all.hidden = false;
  all.addEventListener("change", () => rows.forEach((box) => { box.checked = all.checked; }));
}

// The auto-refresh a person may turn on (refresh.html): off unless chosen, and remembered for this
// page in this tab. A page that reloads itself unasked loses a screen reader's place.
function autoRefresh() {
  const box = document.getElementById("auto-refresh");
  if (!box) return;
  const key = "webhook-console-auto-refresh:" + location.pathname;
  const seconds = Number(box.dataset.seconds);
  let timer = null;
  const follow = () => {
    clearTimeout(timer);
    timer = box.checked ? setTimeout(() => location.reload(), seconds * 1000) : null;
  };
  box.closest(".auto-refresh").hidden = false;
  box.checked = sessionStorage.getItem(key) === "on";
  box.addEventListener("change", () => {
    if (box.checked) sessionStorage.setItem(key, "on");
    else sessionStorage.removeItem(key);
    follow();
  });
  follow();
}

document.addEventListener("DOMContentLoaded", () => {
  selectAll();
  autoRefresh();
});
