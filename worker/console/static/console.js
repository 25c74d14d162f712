// "Select all" for the dead-letter table; without this script every row is still selectable one by one.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  const all = document.getElementById("select-all");
  if (!all) return;
  const rows = Array.from(document.querySelectorAll("input.select-row"));
  all.hidden = false;
  all.addEventListener("change", () => rows.forEach((box) => { box.checked = all.checked; }));
});
