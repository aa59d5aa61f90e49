// The visualizer in a real browser: Debian's chromium, driven by playwright-core (never a
// downloaded browser), against a running `minfer viz`. Run from tests/viz_browser.rs
// (`cargo test --release --test viz_browser`), which sets MINFER_BIN, MODEL and OUT_DIR.
//
// 1. A 5-token `MINFER_TRACE` file (written by `minfer run`) loads in the page: every graph node
//    is drawn, five steps can be stepped through, a clicked node shows the file's statistics.
// 2. A prompt run from the page streams live: nodes get data, the steps and their per-node
//    statistics equal the CLI's trace of the same greedy run, the details show a histogram.
//    The screenshot of this state is saved to a path printed at the end.
// 3. A trace with a NaN in one node: the banner names it, the node and its layer turn red.
import { spawn, spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { chromium } from "playwright-core";

const BIN = process.env.MINFER_BIN;
const MODEL = process.env.MODEL;
const OUT = process.env.OUT_DIR;
if (!BIN || !MODEL || !OUT) throw new Error("set MINFER_BIN, MODEL and OUT_DIR");
const PROMPT = "Write a haiku about Rust.";
const traces = join(OUT, "traces");
mkdirSync(traces, { recursive: true });

let failures = 0;
function check(ok, what) {
  console.log(`${ok ? "ok  " : "FAIL"} ${what}`);
  if (!ok) failures++;
}

// ---- the CLI's trace of a greedy 5-token run, and a copy with a NaN ----
const tracePath = join(traces, "run5.json");
const cli = spawnSync(BIN, ["run", "-m", MODEL, "--raw", "-p", PROMPT, "-n", "5", "--temp", "0", "--json"], {
  env: { ...process.env, MINFER_TRACE: tracePath },
  encoding: "utf8",
});
if (cli.status !== 0) throw new Error(`minfer run failed: ${cli.stderr}`);
const trace = JSON.parse(readFileSync(tracePath, "utf8"));
const cliSteps = trace.phases.flatMap((p) => p.steps);
check(cliSteps.length === 5, `the CLI trace has 5 steps (${cliSteps.length})`);

const nanTrace = JSON.parse(JSON.stringify(trace));
const decode = nanTrace.phases[nanTrace.phases.length - 1];
const poisonName = "ffn_down-5";
const poisonId = decode.graph.nodes.find((n) => n.name === poisonName).id;
const poisoned = decode.steps[1].nodes.find((n) => n.id === poisonId);
poisoned.stats.nan = 3;
poisoned.values[0] = null;
writeFileSync(join(traces, "nan.json"), JSON.stringify(nanTrace));
writeFileSync(join(traces, "empty.json"), JSON.stringify({ format: "minfer-trace", version: 1, model: "m", prompt: "", max_values: 1, phases: [] }));
writeFileSync(join(traces, "broken.json"), JSON.stringify({ format: "minfer-trace", version: 1, phases: [{ kind: "decode", steps: [] }] }));

// ---- the server ----
const server = spawn(BIN, ["viz", "-m", MODEL, "--port", "0", "--trace-dir", traces], { stdio: ["ignore", "ignore", "pipe"] });
const base = await new Promise((resolve, reject) => {
  let err = "";
  const timer = setTimeout(() => reject(new Error(`minfer viz did not start: ${err}`)), 120000);
  server.stderr.on("data", (d) => {
    err += d;
    const m = err.match(/on (http:\/\/[0-9.:]+)\//);
    if (m) {
      clearTimeout(timer);
      resolve(m[1]);
    }
  });
  server.on("exit", (code) => reject(new Error(`minfer viz exited (${code}): ${err}`)));
});
console.log(`minfer viz at ${base}`);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } });
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(e.message));
  const count = (sel) => page.locator(sel).count();
  const doneOrError = (ms) => page.waitForSelector('#status[data-state="done"], #status[data-state="error"]', { timeout: ms });

  // 1. The saved trace.
  await page.goto(`${base}/?trace=run5.json`);
  await doneOrError(30000);
  check((await page.getAttribute("#status", "data-state")) === "done", `the trace loads: ${await page.textContent("#status")}`);
  const prefillNodes = trace.phases[0].graph.nodes.length;
  check((await count("#graph .node")) === prefillNodes, `all ${prefillNodes} nodes of the first phase are drawn`);
  const withData = await count("#graph .node.has-data");
  check(withData === cliSteps[0].nodes.length, `the nodes captured in step 1 show data (${withData} of ${cliSteps[0].nodes.length})`);
  check((await page.getAttribute("#step-range", "max")) === "4", "five steps to step through");
  await page.click("#next");
  check((await page.textContent("#step-label")).includes("decode"), `the next step is a decode: ${await page.textContent("#step-label")}`);
  await page.click("#expand-all");
  await page.click('#graph .node[data-name="attn_norm-3"]');
  const rmsText = await page.textContent("#details table.stats tr:nth-child(4) td:nth-child(2)");
  const want = cliSteps[1].nodes.find((n) => n.id === trace.phases[1].graph.nodes.find((g) => g.name === "attn_norm-3").id).stats.rms;
  // The page shows 4 decimals (3 significant digits in exponent form below 1e-3).
  check(Math.abs(Number(rmsText) - want) <= 1e-4 + 1e-3 * Math.abs(want), `the details show the file's rms of attn_norm-3 in step 2 (${rmsText} vs ${want})`);
  check((await count("#details .histogram rect.bar")) > 0, "the details draw a histogram");
  await page.click('.band[data-band="L7"] .band-head');
  check((await count('.band[data-band="L7"].collapsed')) === 1, "a layer collapses");
  await page.click('.band[data-band="L7"] .band-head');
  check((await count('.band[data-band="L7"].collapsed')) === 0, "and expands again");

  // 2. A live run of the same prompt.
  await page.goto(base);
  await page.waitForSelector("#graph .node", { timeout: 30000 });
  await page.waitForFunction(() => window.vizState.connected, null, { timeout: 30000 });
  check((await count("#graph .node.has-data")) === 0, "before a run, the graph is drawn without data");
  await page.fill("#prompt", PROMPT);
  await page.fill("#max-tokens", "5");
  await page.click("#run");
  await doneOrError(180000);
  check((await page.getAttribute("#status", "data-state")) === "done", `the live run ends: ${await page.textContent("#status")}`);
  const live = await page.evaluate(() =>
    window.vizState.phases.flatMap((p) =>
      p.steps.map((s) => ({ input: s.input, top: s.logits_top.map((l) => l.id), nodes: [...s.nodes.values()].map((n) => [n.id, n.stats.rms, n.stats.nan]) })),
    ),
  );
  check(live.length === 5, `five steps arrived live (${live.length})`);
  const same = live.length === cliSteps.length && live.every((s, i) =>
    JSON.stringify(s.input) === JSON.stringify(cliSteps[i].input) &&
    s.top[0] === cliSteps[i].logits_top[0].id &&
    s.nodes.length === cliSteps[i].nodes.length &&
    s.nodes.every(([id, rms], k) => id === cliSteps[i].nodes[k].id && Math.abs(rms - cliSteps[i].nodes[k].stats.rms) <= 1e-5 * Math.max(1, rms)));
  check(same, "the live steps equal the CLI's trace: inputs, predictions, every node's rms");
  check((await count("#graph .node.has-data")) > 300, `the last step's nodes show data (${await count("#graph .node.has-data")})`);
  check(((await page.textContent("#output")) || "").length > 0, `the generated text is shown: ${JSON.stringify(await page.textContent("#output"))}`);
  await page.click('#graph .node[data-name="attn_norm-0"]');
  check((await count("#details table.stats")) === 1 && (await count("#details .histogram rect.bar")) > 0, "a clicked node shows its live statistics and histogram");
  check((await count("#details .sparkline circle")) === 5, "the sparkline has a point per step");
  const shot = join(OUT, "viz.png");
  await page.screenshot({ path: shot });

  // 3. A NaN is highlighted.
  await page.goto(`${base}/?trace=nan.json`);
  await doneOrError(30000);
  check(await page.isVisible("#nan-banner"), `the NaN banner shows: ${await page.textContent("#nan-banner")}`);
  check((await page.textContent("#nan-banner")).includes(poisonName), "it names the node");
  await page.click("#nan-banner button");
  check((await count(`#graph .node.nan[data-name="${poisonName}"]`)) === 1, "the node is drawn red in its step");
  check((await count('.band[data-band="L5"].nan')) === 1, "its layer is marked");
  check((await count("#graph .node.nan")) === 1, "no other node is");

  // 4. Odd files: no steps at all, a phase without its graph.
  await page.goto(`${base}/?trace=empty.json`);
  await doneOrError(30000);
  check((await page.textContent("#status")).includes("0 steps"), `an empty trace loads: ${await page.textContent("#status")}`);
  await page.goto(`${base}/?trace=broken.json`);
  await doneOrError(30000);
  check((await page.textContent("#status")).includes("phase 0 has no graph"), `a phase without a graph is refused: ${await page.textContent("#status")}`);
  check(pageErrors.length === 0, `no script errors (${pageErrors.join("; ")})`);
  console.log(`screenshot: ${shot}`);
} finally {
  await browser.close();
  server.kill();
}
if (failures) {
  console.log(`${failures} check(s) failed`);
  process.exit(1);
}
console.log("browser test: all checks passed");
