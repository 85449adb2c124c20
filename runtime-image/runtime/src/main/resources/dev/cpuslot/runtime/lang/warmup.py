import json as _json
def _fib(n):
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)
def _warm():
    items = [{'id': i, 'name': 'item%d' % (i * 7919 % 200), 'price': (i * 37) % 1000 / 10} for i in range(200)]
    doc = _json.loads(_json.dumps({'items': items}))
    doc['items'].sort(key=lambda x: (x['price'], x['name']))
    return _fib(12) + len('|'.join('%s:%.2f' % (x['name'].upper(), x['price']) for x in doc['items'][:20]))
