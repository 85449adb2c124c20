# GuestBench's baseline: appended to a function's code and run by python3. Without arguments a line on
# stdin is one call: its own time (ms) on stdout; "r": the result as JSON. With "http": main served
# as an action container serves it, POST /run {"value": ...} answered with main(value) as JSON (and
# POST /init with ok: the code is loaded), by http.server, single-threaded; "listening on :PORT" once it listens.
import sys as __sys, time as __time, json as __json
def __serve():
    import http.server, json as j  # (no __ name in a class: it would be mangled)
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        disable_nagle_algorithm = True
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get('Content-Length', 0)))
            status = 200
            try:
                if self.path == '/init':  # the code is in already
                    b = {'ok': True}
                elif self.path != '/run':
                    status, b = 404, {'error': 'POST /init or /run only'}
                else:
                    b = main(j.loads(body)['value'])
            except Exception as e:
                status, b = 502, {'error': repr(e)}
            b = j.dumps(b).encode()
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(b)))
            self.end_headers()
            self.wfile.write(b)
        def log_message(self, *a):
            pass
    s = http.server.HTTPServer(('127.0.0.1', 0), H)
    print('listening on :%d' % s.server_address[1], flush=True)
    s.serve_forever()
if __sys.argv[1:] == ['http']:
    __serve()
for __l in __sys.stdin:
    if __l.strip() == 'r':
        print(__json.dumps(main({})), flush=True)
        continue
    __s = __time.perf_counter_ns()
    main({})
    print((__time.perf_counter_ns() - __s) / 1e6, flush=True)
