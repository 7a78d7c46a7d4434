// A loopback-only proxy that adds `Authorization: Bearer <token>` to every request and passes
// everything else through unchanged (method, path, headers including Host and Origin, body,
// status, response headers, streamed bodies). The conformance suite cannot send a bearer token
// itself; agentjail's /mcp refuses every request without one (401).
//
// Usage: node proxy.mjs UPSTREAM_URL TOKEN_FILE   (prints "PROXY http://127.0.0.1:PORT")
import http from "node:http";
import { readFileSync } from "node:fs";

const [upstreamArg, tokenFile] = process.argv.slice(2);
if (!upstreamArg || !tokenFile) {
  console.error("usage: node proxy.mjs UPSTREAM_URL TOKEN_FILE");
  process.exit(2);
}
const upstream = new URL(upstreamArg);
if (!["127.0.0.1", "localhost", "[::1]"].includes(upstream.hostname)) {
  console.error(`refusing a non-loopback upstream: ${upstream.hostname}`);
  process.exit(2);
}
const token = readFileSync(tokenFile, "utf8").trim();

const server = http.createServer((req, res) => {
  const headers = { ...req.headers, authorization: `Bearer ${token}` };
  const up = http.request(
    { host: upstream.hostname.replace(/^\[|\]$/g, ""), port: upstream.port, method: req.method, path: req.url, headers },
    (r) => {
      res.writeHead(r.statusCode ?? 502, r.headers);
      r.pipe(res);
    },
  );
  up.on("error", (e) => {
    if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
    res.end(`proxy: ${e.message}`);
  });
  req.pipe(up);
  res.on("close", () => up.destroy());
});
server.listen(0, "127.0.0.1", () => {
  console.log(`PROXY http://127.0.0.1:${server.address().port}`);
});
