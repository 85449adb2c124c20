// GuestBench's baseline: appended to a function's code and run by node. A line on stdin is one
// call: its own time (ms) on stdout; "r": the result as JSON; "h": serve main over HTTP (the port).
require('readline').createInterface({ input: process.stdin }).on('line', (l) => {
    if (l === 'r') return console.log(JSON.stringify(main({})));
    if (l === 'h') {
        const srv = require('http').createServer((q, a) => {
            q.resume();
            q.on('end', () => {
                const b = JSON.stringify(main({}));
                a.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(b) });
                a.end(b);
            });
        });
        srv.on('connection', (c) => c.setNoDelay(true));
        return srv.listen(0, '127.0.0.1', () => console.log(srv.address().port));
    }
    const s = process.hrtime.bigint();
    main({});
    console.log(Number(process.hrtime.bigint() - s) / 1e6);
});
