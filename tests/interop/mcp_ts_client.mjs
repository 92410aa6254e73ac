// An MCP client built with the official TypeScript SDK (@modelcontextprotocol/sdk), for
// silpgate's /mcp endpoint.
//
// Usage: node mcp_ts_client.mjs NODE_MODULES URL
//
// NODE_MODULES is where tests/run.sh installed the SDK. Lists the tools (which is when the SDK
// learns their output schemas), calls each once with good arguments and once with bad ones,
// and prints one JSON object: {"tools": [names], "ok": {name: structuredContent}, "errors":
// {name: {"isError": bool, "text": text, "meta": _meta}}}. A call the SDK throws on is
// recorded as {"thrown": message} instead: what a TypeScript client would see.

import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [modules, url] = process.argv.slice(2);
const sdk = (path) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", path)).href);
const { Client } = await sdk("client/index.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");

const client = new Client({ name: "silpgate-interop", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url)));
const out = { tools: [], ok: {}, errors: {} };
const listed = await client.listTools();
out.tools = listed.tools.map((tool) => tool.name);

const call = async (name, args) => {
  try {
    return await client.callTool({ name, arguments: args });
  } catch (error) {
    return { thrown: String(error && error.message ? error.message : error) };
  }
};

const decoded = await call("silp_decode", { text: "cancel(order9)" });
out.ok.silp_decode = decoded.structuredContent ?? decoded;
const ir = decoded.structuredContent?.ir;
for (const [name, args] of [
  ["silp_compile", { ir, frontend: "json" }],
  ["silp_validate", { ir }],
  ["silp_hash", { ir: JSON.stringify(ir) }],
]) {
  const result = await call(name, args);
  out.ok[name] = result.structuredContent ?? result;
}

for (const [name, args] of [
  ["silp_decode", { text: "cancel(order9" }],
  ["silp_compile", { ir: { silp: "0.1" } }],
  ["silp_validate", { ir: '{"silp": ' }],
  ["silp_hash", { ir: 42 }],
]) {
  const result = await call(name, args);
  if (result.thrown !== undefined) {
    out.errors[name] = result;
    continue;
  }
  const text = (result.content ?? []).filter((c) => c.type === "text").map((c) => c.text).join(" ");
  out.errors[name] = { isError: result.isError === true, text, meta: result._meta ?? null };
}

await client.close();
process.stdout.write(JSON.stringify(out) + "\n");
