#!/usr/bin/env node
'use strict';
// A fault-injecting HTTP proxy for the S3 tests, loopback only.
//
//   node fault_proxy.js --upstream http://127.0.0.1:PORT --fault MODE
//        [--every N] [--match range|all] [--stall-ms MS]
//
// Prints "PORT <n>" on stdout once listening; exits when stdin closes (so it
// never outlives the test that started it) or on SIGTERM.
// Of the matching requests (default: GETs with a Range header), the 1st,
// (N+1)th, (2N+1)th... get the fault, the others are forwarded untouched:
//   none          forward everything
//   503           answer 503 SlowDown
//   drop          close the connection without a response
//   reset         reset the connection (RST) without a response
//   truncate      forward the headers and half the body, then close
//   stall         forward the headers and half the body, then send nothing for
//                 --stall-ms (default 60000) before closing
//   stall-header  send nothing at all for --stall-ms, then close
//   body          answer --status (default 200) with --body (application/xml):
//                 a canned response, e.g. malformed XML for the client's parser
//   delay         wait --stall-ms, then forward untouched (a distant server)
// With --log FILE, every request (matching or not) is appended to FILE as one
// JSON line {"method", "path", "range", "inflight"} before it is answered, so
// a client that got its response finds its request in the log; "inflight"
// counts the requests the proxy held when this one came, itself included.
const http = require('http');
const fs = require('fs');

const args = { every: '1', match: 'range', 'stall-ms': '60000', fault: 'none' };
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
const upstream = new URL(args.upstream);
const every = Math.max(1, Number(args.every));
const stallMs = Number(args['stall-ms']);
const agent = new http.Agent({ keepAlive: true, maxSockets: 64 });
let matched = 0;
const timers = new Set();
const later = (ms, f) => { const t = setTimeout(() => { timers.delete(t); f(); }, ms); timers.add(t); };

function forward(req, res, cut) {
  const up = http.request({
    host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers, agent,
  }, ures => {
    res.writeHead(ures.statusCode, ures.headers);
    if (!cut) return ures.pipe(res);
    const length = Number(ures.headers['content-length'] || 0);
    const half = Math.floor(length / 2);
    let sent = 0, done = false;
    ures.on('data', chunk => {
      if (done) return;
      if (sent + chunk.length < half) { sent += chunk.length; res.write(chunk); return; }
      done = true;
      res.write(chunk.subarray(0, half - sent), () => {
        ures.destroy();
        if (cut === 'truncate') res.socket.destroy();
        else later(stallMs, () => res.socket && res.socket.destroy());
      });
    });
    ures.on('end', () => { if (!done) res.end(); });
  });
  up.on('error', () => res.socket && res.socket.destroy());
  req.pipe(up);
}

let inflight = 0;
const server = http.createServer((req, res) => {
  ++inflight;
  res.on('close', () => --inflight);
  if (args.log) {
    const line = JSON.stringify({ method: req.method, path: req.url, range: req.headers.range || '', inflight });
    fs.appendFileSync(args.log, line + '\n');
  }
  const eligible = args.match === 'all' || (req.method === 'GET' && req.headers.range);
  const fault = eligible && args.fault !== 'none' && (matched++ % every === 0) ? args.fault : 'none';
  switch (fault) {
    case '503': {
      req.resume();
      const body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>' +
        '<Message>Please reduce your request rate.</Message></Error>';
      res.writeHead(503, { 'Content-Type': 'application/xml', 'Content-Length': Buffer.byteLength(body) });
      return res.end(body);
    }
    case 'body': {
      req.resume();
      const body = args.body || '';
      res.writeHead(Number(args.status || 200),
                    { 'Content-Type': 'application/xml', 'Content-Length': Buffer.byteLength(body) });
      return res.end(body);
    }
    case 'drop': return req.socket.destroy();
    case 'reset': return req.socket.resetAndDestroy ? req.socket.resetAndDestroy() : req.socket.destroy();
    case 'stall-header': return later(stallMs, () => req.socket.destroy());
    case 'truncate': case 'stall': return forward(req, res, fault);
    case 'delay': return later(stallMs, () => forward(req, res, null));
    default: return forward(req, res, null);
  }
});
server.keepAliveTimeout = 30000;
server.listen(0, '127.0.0.1', () => process.stdout.write(`PORT ${server.address().port}\n`));
const stop = () => { for (const t of timers) clearTimeout(t); process.exit(0); };
process.stdin.on('end', stop);
process.stdin.on('error', stop);
process.stdin.resume();
process.on('SIGTERM', stop);
