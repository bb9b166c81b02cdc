// Dark mode: follow the system unless the reader chose, and remember the choice.
(function () {
  const root = document.documentElement;
  const saved = localStorage.getItem("cachesafe-theme");
  if (saved) root.dataset.theme = saved;

  function isDark() {
    return root.dataset.theme === "dark" ||
      (root.dataset.theme === "auto" && matchMedia("(prefers-color-scheme: dark)").matches);
  }
  function syncToggle() {
    document.querySelectorAll("[data-theme-toggle]").forEach(function (b) {
      b.setAttribute("aria-pressed", String(isDark()));
    });
  }
  document.addEventListener("DOMContentLoaded", syncToggle);

  document.addEventListener("click", function (event) {
    const toggle = event.target.closest("[data-theme-toggle]");
    if (toggle) {
      root.dataset.theme = isDark() ? "light" : "dark";
      localStorage.setItem("cachesafe-theme", root.dataset.theme);
      syncToggle();
      return;
    }
    // Copy a link: the input stays selectable for browsers without clipboard access.
    const copy = event.target.closest("[data-copy]");
    if (copy) {
      const input = document.querySelector(copy.dataset.copy);
      const status = copy.parentElement.querySelector(".copied");
      input.select();
      const done = function () { if (status) status.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(input.value).then(done, function () {
          document.execCommand("copy"); done();
        });
      } else {
        document.execCommand("copy"); done();
      }
      return;
    }
    // Jump to the divergence: scroll both sides so the first difference is in view.
    const jump = event.target.closest("[data-jump]");
    if (jump) {
      ["before", "after"].forEach(function (side) {
        const mark = document.getElementById(jump.dataset.jump + "-" + side);
        if (mark) mark.scrollIntoView({ block: "center", inline: "nearest" });
      });
      const after = document.getElementById(jump.dataset.jump + "-after");
      if (after) { after.setAttribute("tabindex", "-1"); after.focus({ preventScroll: true }); }
      history.replaceState(null, "", "#" + jump.dataset.jump + "-after");
      event.preventDefault();
    }
  });

  // Shareable catalog links: drop empty filters and the default sort from what htmx sends.
  document.addEventListener("htmx:configRequest", function (event) {
    const params = event.detail.parameters;
    if (!params || event.detail.verb !== "get") return;
    const keys = [];
    for (const key of params.keys()) keys.push(key);
    keys.forEach(function (key) {
      const value = params.get(key);
      if (value === "" || (key === "sort" && value === "downloads")) params.delete(key);
    });
  });
})();
