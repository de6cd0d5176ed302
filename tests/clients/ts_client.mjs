// The TypeScript SDK's client (v1) against corral: one submit-wait-read loop and a
// refusal, over stdio (`corral mcp`) or streamable HTTP. The SDK checks every result's
// structuredContent against the tool's outputSchema, so a schema that says one thing
// while corral answers another fails here. Prints one JSON object.
// Usage: node ts_client.mjs stdio|http WORKDIR   (CORRAL_TOKEN, CORRAL_URL in the environment)
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [transportName, workdir] = process.argv.slice(2);
const url = process.env.CORRAL_URL;
const transport = transportName === "stdio"
  ? new StdioClientTransport({ command: process.env.CORRAL_PYTHON, args: ["-m", "corral.entry", "mcp"],
                               env: { ...process.env } })
  : new StreamableHTTPClientTransport(new URL(`${url}/mcp`), {
      requestInit: { headers: { Authorization: `Bearer ${process.env.CORRAL_TOKEN}` } } });
const client = new Client({ name: "corral-test", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const text = (r) => r.content.map((c) => c.text ?? "").join("\n");
const sub = await client.callTool({ name: "submit_job", arguments: { command: "echo ts-sdk-output", workdir } });
const jobId = sub.structuredContent.job_id;
const waited = await client.callTool({ name: "wait_for_job", arguments: { job_id: jobId, timeout_s: 60 } });
const page = await client.callTool({ name: "job_output", arguments: { job_id: jobId } });
const plan = await client.callTool({ name: "plan_job", arguments: { command: "true", memory: "4G", walltime: "30m", workdir } });
const refused = await client.callTool({ name: "submit_job", arguments: { command: "true", cpus: 2, workdir } });
console.log(JSON.stringify({ tools, state: waited.structuredContent.state, page: page.structuredContent,
                             plan: plan.structuredContent, refused: { isError: refused.isError, text: text(refused) } }));
await client.close();
