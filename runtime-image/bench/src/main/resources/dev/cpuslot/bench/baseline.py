# GuestBench's baseline: appended to a function's code and run by python3. A line on stdin is one
# call: its own time (ms) on stdout; "r": the result as JSON; "h": serve main over HTTP (the port).
import sys as __sys, time as __time, json as __json
def __serve():
    import http.server, threading, json as j  # (no __ name in a class: it would be mangled)
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = 'HTTP/1.1'
        disable_nagle_algorithm = True
        def do_POST(self):
            self.rfile.read(int(self.headers.get('Content-Length', 0)))
            b = j.dumps(main({})).encode()
            self.send_response(200)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(b)))
            self.end_headers()
            self.wfile.write(b)
        def log_message(self, *a):
            pass
    s = http.server.HTTPServer(('127.0.0.1', 0), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s.server_address[1]
for __l in __sys.stdin:
    if __l.strip() == 'r':
        print(__json.dumps(main({})), flush=True)
        continue
    if __l.strip() == 'h':
        print(__serve(), flush=True)
        continue
    __s = __time.perf_counter_ns()
    main({})
    print((__time.perf_counter_ns() - __s) / 1e6, flush=True)
