// Serves the built page (dist/), the generated Perses dashboards
// (charts/cpuslot/dashboards/perses/) under dashboards/, and proxies
// prometheus/* to the Prometheus given at run time: the browser talks to one
// origin, so Prometheus needs no CORS setting.
//
//   node serve.mjs --prometheus http://127.0.0.1:9090 [--port 8090]
//   then open http://127.0.0.1:8090/?dashboard=node (or runtime)
import http from 'node:http';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const here = path.dirname(fileURLToPath(import.meta.url));
export const dashboardsDir = path.resolve(here, '../../../charts/cpuslot/dashboards/perses');
const distDir = path.join(here, 'dist');

const types = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript',
  '.css': 'text/css',
  '.json': 'application/json',
  '.woff': 'font/woff',
  '.woff2': 'font/woff2',
  '.svg': 'image/svg+xml',
};

function sendFile(res, root, rel) {
  const file = path.resolve(root, '.' + path.posix.normalize('/' + rel));
  if (!file.startsWith(root + path.sep)) {
    res.writeHead(403).end();
    return;
  }
  fs.readFile(file, (err, body) => {
    if (err) {
      res.writeHead(404, { 'content-type': 'text/plain' }).end(`not found: ${rel}\n`);
      return;
    }
    res.writeHead(200, { 'content-type': types[path.extname(file)] ?? 'application/octet-stream' }).end(body);
  });
}

function proxy(req, res, base, rest) {
  const target = new URL(base.replace(/\/$/, '') + rest);
  const up = http.request(
    target,
    { method: req.method, headers: { ...req.headers, host: target.host } },
    (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    },
  );
  up.on('error', (e) => res.writeHead(502, { 'content-type': 'text/plain' }).end(`prometheus at ${base}: ${e.message}\n`));
  req.pipe(up);
}

// startServer listens on 127.0.0.1:port (0: any free port) and resolves to
// the page's base URL.
export function startServer({ prometheus, port = 0 }) {
  if (!fs.existsSync(path.join(distDir, 'index.html'))) {
    throw new Error(`${distDir}/index.html missing: build the page first (hack/dashboard-view.sh)`);
  }
  if (!/^https?:\/\//.test(prometheus ?? '')) {
    throw new Error(`--prometheus must be an http(s) URL, got ${JSON.stringify(prometheus)}`);
  }
  const server = http.createServer((req, res) => {
    const url = new URL(req.url, 'http://page');
    if (url.pathname.startsWith('/prometheus/')) {
      proxy(req, res, prometheus, url.pathname.slice('/prometheus'.length) + url.search);
    } else if (url.pathname.startsWith('/dashboards/')) {
      sendFile(res, dashboardsDir, url.pathname.slice('/dashboards/'.length));
    } else {
      sendFile(res, distDir, url.pathname === '/' ? 'index.html' : url.pathname.slice(1));
    }
  });
  return new Promise((resolve, reject) => {
    server.on('error', reject);
    server.listen(port, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}/`, server }));
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { values } = parseArgs({ options: { prometheus: { type: 'string' }, port: { type: 'string', default: '8090' } } });
  const { url } = await startServer({ prometheus: values.prometheus, port: Number(values.port) });
  console.log(`serving ${url}?dashboard=node and ${url}?dashboard=runtime, queries to ${values.prometheus}`);
}
