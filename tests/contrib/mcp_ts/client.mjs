// The TypeScript SDK's own client, as an agent host runs it (tests/contrib/test_mcp_cancel.py):
// callTool with { timeout: 1000 } on a 3 s tool, which makes the SDK send notifications/cancelled,
// then the host's retry with the same key. Prints one JSON line: what each call got.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, key] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: "Bearer alice" } },
});
const client = new Client({ name: "idemkey-test-host", version: "1.0.0" });
await client.connect(transport);
const call = { name: "charge_slowly", arguments: { amount: 100, idempotency_key: key } };
let first;
try {
  first = { result: await client.callTool(call, undefined, { timeout: 1000 }) };
} catch (error) {
  first = { error: String(error) };
}
const retry = await client.callTool(call);
console.log(JSON.stringify({ first, retry }));
await client.close();
