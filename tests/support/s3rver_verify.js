#!/usr/bin/env node
'use strict';
// s3rver 3.7.1 with real SigV4 verification, on loopback, HTTP and HTTPS in one
// process. s3rver itself only checks that the access key exists (a wrong
// secret gets 200); this wrapper recomputes every header signature and answers
// 403 SignatureDoesNotMatch when it differs, like S3.
//
//   node --openssl-legacy-provider s3rver_verify.js --dir DIR --state FILE
//        [--cert cert.pem --key key.pem] [--http-port N] [--https-port N]
//        [--credentials AK:SECRET[,AK2:SECRET2]]
// Writes {"http_port":..,"https_port":..,"pid":..} to FILE once listening.
// (--openssl-legacy-provider: without it s3rver answers 500 to paginated listings.)

const crypto = require('crypto');
const fs = require('fs');
const http = require('http');
const https = require('https');
const path = require('path');

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
if (!args.dir || !args.state) {
  console.error('usage: s3rver_verify.js --dir DIR --state FILE [--cert C --key K] [--credentials AK:SK,...]');
  process.exit(2);
}
const s3rverPath = process.env.S3RVER_MODULE || path.join(__dirname, '..', '..', '.tools', 'node_modules', 's3rver');
const S3rver = require(s3rverPath);

const credentials = {};
for (const pair of (args.credentials || 'S3RVER:S3RVER').split(',')) {
  const i = pair.indexOf(':');
  credentials[pair.slice(0, i)] = pair.slice(i + 1);
}

const rfc3986 = s => encodeURIComponent(s).replace(/[!'()*]/g, c => '%' + c.charCodeAt(0).toString(16).toUpperCase());
const decode = s => { try { return decodeURIComponent(s); } catch (e) { return s; } };
const hmac = (key, data) => crypto.createHmac('sha256', key).update(data, 'utf8').digest();
const sha256 = data => crypto.createHash('sha256').update(data, 'utf8').digest('hex');
const xmlEscape = s => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

// Returns null when the request is anonymous or correctly signed, else an S3 error.
function verify(req) {
  const auth = req.headers['authorization'];
  if (!auth) return null;
  const m = /^AWS4-HMAC-SHA256 Credential=([^/]+)\/(\d{8})\/([^/]+)\/([^/]+)\/aws4_request, ?SignedHeaders=([a-z0-9;-]+), ?Signature=([0-9a-f]{64})$/.exec(auth);
  if (!m) return { status: 400, code: 'AuthorizationHeaderMalformed', message: 'The authorization header is malformed.' };
  const [, accessKey, date, region, service, signedHeaders, signature] = m;
  const secret = credentials[accessKey];
  if (secret === undefined)
    return { status: 403, code: 'InvalidAccessKeyId', message: 'The AWS Access Key Id you provided does not exist in our records.' };
  const amzDate = req.headers['x-amz-date'] || '';
  if (!amzDate.startsWith(date))
    return { status: 403, code: 'SignatureDoesNotMatch', message: 'x-amz-date does not match the credential scope date.' };
  const payload = req.headers['x-amz-content-sha256'];
  if (!payload) return { status: 400, code: 'InvalidRequest', message: 'Missing required header for this request: x-amz-content-sha256' };
  const names = signedHeaders.split(';');
  if (!names.includes('host')) return { status: 403, code: 'SignatureDoesNotMatch', message: 'host is not signed.' };

  const q = req.url.indexOf('?');
  const rawPath = q < 0 ? req.url : req.url.slice(0, q);
  const rawQuery = q < 0 ? '' : req.url.slice(q + 1);
  const canonicalUri = rawPath.split('/').map(seg => rfc3986(decode(seg))).join('/');
  const canonicalQuery = rawQuery.split('&').filter(p => p.length).map(p => {
    const i = p.indexOf('=');
    const k = i < 0 ? p : p.slice(0, i), v = i < 0 ? '' : p.slice(i + 1);
    return [rfc3986(decode(k)), rfc3986(decode(v))];
  }).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0))
    .map(([k, v]) => k + '=' + v).join('&');
  const canonicalHeaders = names.map(n => {
    const v = req.headers[n];
    return n + ':' + String(v === undefined ? '' : v).trim().replace(/\s+/g, ' ') + '\n';
  }).join('');
  const canonicalRequest = [req.method, canonicalUri, canonicalQuery, canonicalHeaders, signedHeaders, payload].join('\n');
  const scope = `${date}/${region}/${service}/aws4_request`;
  const stringToSign = ['AWS4-HMAC-SHA256', amzDate, scope, sha256(canonicalRequest)].join('\n');
  const key = hmac(hmac(hmac(hmac('AWS4' + secret, date), region), service), 'aws4_request');
  const expected = hmac(key, stringToSign).toString('hex');
  if (expected !== signature)
    return {
      status: 403, code: 'SignatureDoesNotMatch',
      message: 'The request signature we calculated does not match the signature you provided. Check your key and signing method.',
      extra: { AWSAccessKeyId: accessKey, StringToSign: stringToSign, CanonicalRequest: canonicalRequest },
    };
  return null;
}

const app = new S3rver({ directory: args.dir, silent: true, configureBuckets: [] });
const handle = app.callback();
function onRequest(req, res) {
  const err = verify(req);
  if (!err) return handle(req, res);
  let body = '';
  if (req.method !== 'HEAD') {
    body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + err.code + '</Code><Message>' + xmlEscape(err.message) + '</Message>';
    for (const [k, v] of Object.entries(err.extra || {})) body += `<${k}>${xmlEscape(v)}</${k}>`;
    body += '<RequestId>sluice-verify</RequestId></Error>';
  }
  // A request body we will not read: close the connection after answering.
  const closing = req.headers['content-length'] && req.headers['content-length'] !== '0';
  res.writeHead(err.status, {
    'Content-Type': 'application/xml',
    'Content-Length': Buffer.byteLength(body),
    ...(closing ? { Connection: 'close' } : {}),
  });
  res.end(body);
}

const servers = [http.createServer(onRequest)];
if (args.cert && args.key)
  servers.push(https.createServer({ cert: fs.readFileSync(args.cert), key: fs.readFileSync(args.key) }, onRequest));
const ports = [Number(args['http-port'] || 0), Number(args['https-port'] || 0)];
Promise.all(servers.map((s, i) => new Promise((resolve, reject) => {
  s.keepAliveTimeout = 30000;
  s.on('error', reject);
  s.listen(ports[i], '127.0.0.1', () => resolve(s.address().port));
}))).then(bound => {
  const state = { http_port: bound[0], https_port: bound[1] || null, pid: process.pid };
  fs.writeFileSync(args.state + '.tmp', JSON.stringify(state));
  fs.renameSync(args.state + '.tmp', args.state);
}, err => {
  console.error('s3rver_verify: listen failed:', err.message);
  process.exit(1);
});
const stop = () => { for (const s of servers) s.close(); process.exit(0); };
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
