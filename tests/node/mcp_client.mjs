// An independent MCP client (the TypeScript SDK) for the tests of `capsulectl mcp`.
//
// node mcp_client.mjs CALLS COMMAND [ARG...]
//
// Starts COMMAND as an MCP server on stdio (with this process's environment),
// lists its tools, makes each call of CALLS (a JSON list of {"name", "arguments"}),
// and prints one JSON document: {"server", "tools", "results"}. The SDK's client
// checks each result's structured content against the tool's output schema.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [calls, command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: "ignore" });
const client = new Client({ name: "capsuled-tests-node", version: "1.0.0" });
await client.connect(transport);
const { tools } = await client.listTools();
const results = [];
for (const call of JSON.parse(calls)) {
  results.push(await client.callTool(call));
}
const server = client.getServerVersion();
await client.close();
process.stdout.write(JSON.stringify({ server, tools, results }) + "\n");
