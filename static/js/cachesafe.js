// Dark mode: follow the system unless the reader chose, and remember the choice.
(function () {
  const root = document.documentElement;
  const saved = localStorage.getItem("cachesafe-theme");
  if (saved) root.dataset.theme = saved;
  document.addEventListener("click", function (event) {
    const button = event.target.closest("[data-theme-toggle]");
    if (!button) return;
    const dark = root.dataset.theme === "dark" ||
      (root.dataset.theme === "auto" && matchMedia("(prefers-color-scheme: dark)").matches);
    root.dataset.theme = dark ? "light" : "dark";
    localStorage.setItem("cachesafe-theme", root.dataset.theme);
  });
})();
