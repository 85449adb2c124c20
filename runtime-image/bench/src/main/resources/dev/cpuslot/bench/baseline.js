// GuestBench's baseline: appended to a function's code and run by node. Without arguments a line on
// stdin is one call: its own time (ms) on stdout; "r": the result as JSON. With "http": main served
// as an action container serves it, POST /run {"value": ...} answered with main(value) as JSON (and
// POST /init with ok: the code is loaded), by node's http module; "listening on :PORT" once it listens.
if (process.argv[2] === 'http') {
    const srv = require('http').createServer((q, a) => {
        const body = [];
        q.on('data', (c) => body.push(c));
        q.on('end', () => {
            let status = 200, b;
            try {
                if (q.method === 'POST' && q.url === '/init') b = JSON.stringify({ ok: true }); // the code is in already
                else if (q.method !== 'POST' || q.url !== '/run') status = 404, b = JSON.stringify({ error: 'POST /init or /run only' });
                else b = JSON.stringify(main(JSON.parse(Buffer.concat(body).toString()).value));
            } catch (e) {
                status = 502, b = JSON.stringify({ error: String(e) });
            }
            a.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(b) });
            a.end(b);
        });
    });
    srv.on('connection', (c) => c.setNoDelay(true));
    srv.listen(0, '127.0.0.1', () => console.log('listening on :' + srv.address().port));
} else {
    require('readline').createInterface({ input: process.stdin }).on('line', (l) => {
        if (l === 'r') return console.log(JSON.stringify(main({})));
        const s = process.hrtime.bigint();
        main({});
        console.log(Number(process.hrtime.bigint() - s) / 1e6);
    });
}
