// Tabs: one per event kind; the choice survives reloads through the URL fragment.
(function () {
  function show(kind) {
    document.querySelectorAll('.tabs button').forEach(function (b) {
      b.classList.toggle('active', b.dataset.tab === kind);
    });
    document.querySelectorAll('.tab').forEach(function (t) {
      t.classList.toggle('active', t.id === 'tab-' + kind);
    });
  }
  var buttons = document.querySelectorAll('.tabs button');
  buttons.forEach(function (b) {
    b.addEventListener('click', function () {
      history.replaceState(null, '', '#' + b.dataset.tab);
      show(b.dataset.tab);
    });
  });
  if (buttons.length) {
    var want = location.hash.slice(1);
    var known = Array.prototype.some.call(buttons, function (b) { return b.dataset.tab === want; });
    show(known ? want : buttons[0].dataset.tab);
  }
  // Live pages (attach) refresh their list of windows.
  var refresh = document.body.dataset.refresh;
  if (refresh) { setTimeout(function () { location.reload(); }, Number(refresh) * 1000); }
})();
