// The host Node's WHATWG `URL` reads in each URL: one JSON string a line on stdin, one JSON object
// a line on stdout, in order: {"host": "<hostname>"} or {"error": "<why it does not parse>"}.
// Read by tests/interceptor_core/builtins/test_urls_differential.py; one process serves every URL.
import { createInterface } from "node:readline";

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  let answer;
  try {
    answer = { host: new URL(JSON.parse(line)).hostname };
  } catch (error) {
    answer = { error: String(error.code ?? error.message) };
  }
  process.stdout.write(JSON.stringify(answer) + "\n");
}
