// An MCP client not written in Python: the official TypeScript SDK starts `sa mcp serve` over stdio, lists
// its tools, calls one and prints what it got as one JSON line (tests/mcp/test_mcp_serve.py reads it).
//   node node_client.mjs TOOL INPUT COMMAND [ARGS...]
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [tool, input, command, ...args] = process.argv.slice(2);
const transport = new StdioClientTransport({ command, args, env: { ...process.env }, stderr: "inherit" });
const client = new Client({ name: "node-test-client", version: "1.0.0" });
await client.connect(transport);
const listed = await client.listTools();
const result = await client.callTool({ name: tool, arguments: { input } });
console.log(JSON.stringify({ tools: listed.tools.map((t) => ({ name: t.name, description: t.description })), result }));
await client.close();
