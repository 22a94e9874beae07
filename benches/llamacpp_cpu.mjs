// llama.cpp on the CPU through node-llama-cpp (its prebuilt binaries): next-token probabilities
// for fixed ids, prefill and decode speed of one GGUF file. Prints one JSON object.
//
//   npm i -E node-llama-cpp@3.21.1          (in a folder outside the repository, or an ignored one)
//   NODE_PATH=THAT/node_modules node benches/llamacpp_cpu.mjs --model F.gguf --ids 1,2,3 \
//       [--prompt-len 512] [--decode 32] [--threads N] [--reps 2]
//
// benches/llamacpp_cpu.py runs it next to onepass; see docs/benchmarks/llamacpp-cpu.md.

import { createRequire } from "node:module";
import path from "node:path";

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, a, i, all) => {
    if (a.startsWith("--")) acc.push([a.slice(2), all[i + 1]]);
    return acc;
  }, []),
);
if (!args.model || !args.ids) {
  console.error("usage: node llamacpp_cpu.mjs --model F.gguf --ids 1,2,3 [--prompt-len N] [--decode N] [--threads N] [--reps N]");
  process.exit(2);
}
const promptLen = Number(args["prompt-len"] ?? 512);
const decode = Number(args.decode ?? 32);
const threads = Number(args.threads ?? 0);
const reps = Number(args.reps ?? 2);
const ids = args.ids.split(",").map(Number);

// Resolve node-llama-cpp from NODE_PATH (an ES module import does not read NODE_PATH itself).
const require = createRequire(path.join(process.env.NODE_PATH ?? process.cwd(), "x.js"));
let entry;
try {
  entry = require.resolve("node-llama-cpp");
} catch {
  console.error("node-llama-cpp not found: run `npm i -E node-llama-cpp@3.21.1` in a folder and set NODE_PATH=FOLDER/node_modules");
  process.exit(2);
}
const { getLlama, LlamaLogLevel } = await import(entry);

const llama = await getLlama({ gpu: false, logLevel: process.env.LLAMA_LOG ? LlamaLogLevel.debug : LlamaLogLevel.error, maxThreads: threads });
const model = await llama.loadModel({ modelPath: args.model, gpuLayers: 0 });
const contextSize = Math.max(promptLen + decode + 16, ids.length + 16, 1024);
const context = await model.createContext({
  contextSize,
  batchSize: Math.max(promptLen, ids.length, 512),
  threads,
  sequences: 1,
});
const seq = context.getSequence();
const fullDistribution = { temperature: 1, topK: 0, topP: 1, minP: 0 };

// Parity: the next-token distribution after `ids`.
const input = ids.map((t, i) =>
  i === ids.length - 1 ? [t, { generateNext: { probabilities: true, options: fullDistribution } }] : t,
);
const res = await seq.controlledEvaluate(input);
const probs = res[ids.length - 1]?.next?.probabilities;
if (!probs) {
  console.error("llama.cpp returned no probabilities");
  process.exit(1);
}
const dense = {};
for (const [tok, p] of probs) dense[tok] = p;
await seq.clearHistory();

// Speed: prefill promptLen fixed pseudo-random ids (the same formula as `onepass bench`), then
// decode greedily one token at a time. Best of `reps`.
const vocabGuess = Number(args.vocab ?? 248320);
const prompt = Array.from({ length: promptLen }, (_, i) => Number((BigInt(i) * 2654435761n + 12345n) % BigInt(vocabGuess)));
let bestPrefill = Infinity;
let bestDecode = Infinity;
for (let r = 0; r < reps; r++) {
  await seq.clearHistory();
  const t0 = performance.now();
  const out = await seq.controlledEvaluate(
    prompt.map((t, i) => (i === promptLen - 1 ? [t, { generateNext: { token: true, options: { temperature: 0 } } }] : t)),
  );
  bestPrefill = Math.min(bestPrefill, (performance.now() - t0) / 1000);
  let next = out[promptLen - 1].next.token;
  const t1 = performance.now();
  for (let k = 0; k < decode; k++) {
    const o = await seq.controlledEvaluate([[next, { generateNext: { token: true, options: { temperature: 0 } } }]]);
    next = o[0].next.token;
  }
  bestDecode = Math.min(bestDecode, (performance.now() - t1) / 1000);
}

console.log(
  JSON.stringify({
    engine: "llama.cpp via node-llama-cpp",
    node_llama_cpp: require(path.join(path.dirname(entry), "..", "package.json")).version,
    model: args.model,
    threads: context.currentThreads ?? threads,
    ids_len: ids.length,
    probs_entries: probs.size,
    probs: dense,
    prefill: { tokens: promptLen, seconds: bestPrefill, tokens_per_s: promptLen / bestPrefill },
    decode: { tokens: decode, seconds: bestDecode, tokens_per_s: decode / bestDecode },
  }),
);
await context.dispose();
await model.dispose();
await llama.dispose();
