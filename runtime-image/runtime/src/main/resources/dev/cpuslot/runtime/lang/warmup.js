(function () {
  function fib(n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }
  return function () {
    var items = [];
    for (var i = 0; i < 200; i++) items.push({ id: i, name: 'item' + (i * 7919 % 200), price: (i * 37) % 1000 / 10 });
    var doc = JSON.parse(JSON.stringify({ items: items }));
    doc.items.sort(function (a, b) { return a.price - b.price || (a.name < b.name ? -1 : a.name > b.name ? 1 : 0); });
    return fib(15) + doc.items.slice(0, 20).map(function (x) { return x.name.toUpperCase() + ':' + x.price.toFixed(2); }).join('|').length;
  };
})()
