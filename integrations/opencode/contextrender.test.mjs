// node --test contextrender.test.mjs   (needs a running server: CONTEXTRENDER_URL)
import { test } from "node:test"
import assert from "node:assert/strict"
import { writeFileSync } from "node:fs"
import { ContextRenderPlugin } from "./contextrender.js"

const URL = process.env.CONTEXTRENDER_URL
const BUDGET = Number(process.env.CR_TEST_BUDGET || 800)
const SID = `ses_test${process.env.CR_TEST_SALT || ""}`
const FILLER = Array.from({ length: 120 }, (_, i) => `w${i}`).join(" ")
const { toOpenAI } = ContextRenderPlugin.internals

function userMessage(id, text) {
  return {
    info: { id, sessionID: SID, role: "user", time: { created: 0 }, agent: "build" },
    parts: [{ id: `${id}_p0`, sessionID: SID, messageID: id, type: "text", text }],
  }
}

function assistantMessage(id, turn, steps = 1) {
  const parts = []
  for (let s = 0; s < steps; s++) {
    const k = `${turn}_${s}`
    parts.push({ id: `${id}_s${s}`, type: "step-start" })
    parts.push({ id: `${id}_t${s}`, type: "text", text: `Reading src/mod_${k}.py for REC_${k}.` })
    parts.push({
      id: `${id}_tool${s}`, sessionID: SID, messageID: id, type: "tool", callID: `call_${k}`, tool: "read",
      state: {
        status: "completed", input: { filePath: `src/mod_${k}.py`, ref: turn ? `REC_next_${turn - 1}_0` : "REC_start" },
        output: `def handler_${k}():\n    return lookup("REC_next_${k}")\n${FILLER}`, title: "read", metadata: {},
        time: { start: 0, end: 1 },
      },
    })
    parts.push({ id: `${id}_f${s}`, type: "step-finish", tokens: {} })
  }
  return { info: { id, sessionID: SID, role: "assistant", parentID: "msg_u0", time: { created: 0 } }, parts }
}

function session(turns) {
  const msgs = [userMessage("msg_u0", "Fix the failing handler; start at REC_start.")]
  for (let t = 0; t < turns; t++) msgs.push(assistantMessage(`msg_a${t}`, t, t % 3 === 2 ? 2 : 1))
  return msgs
}

async function hook(options = {}) {
  const hooks = await ContextRenderPlugin({ directory: ".", worktree: "." }, { url: URL, budget: BUDGET, ...options })
  return hooks["experimental.chat.messages.transform"]
}

test("only the plugin is exported", async () => {
  const mod = await import("./contextrender.js")
  assert.deepEqual(Object.keys(mod), ["ContextRenderPlugin"])
})

test("multi-step assistant messages become one assistant message per step", () => {
  const conv = toOpenAI(session(3))
  const roles = conv.openai.map((m) => m.role)
  // user, then per step an assistant message with one call and its result; turn 2 has two steps
  assert.deepEqual(roles, ["user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant", "tool"])
  assert.equal(conv.openai[1].tool_calls[0].id, "call_0_0")
  assert.equal(conv.openai[1].tool_calls[0].function.name, "read")
  assert.ok(conv.openai[2].content.includes("REC_next_0_0"))
})

test("transform replaces the history in place with the rendered one", { skip: !URL }, async () => {
  const fn = await hook()
  const messages = session(10)
  const before = structuredClone(messages)
  const output = { messages }
  await fn({}, output)
  assert.equal(output.messages, messages, "the same array object must be mutated")
  assert.notDeepEqual(messages, before, "the full history exceeds B, so something changed")
  // the task message is kept verbatim, first
  assert.deepEqual(messages[0], before[0])
  const tools = messages.flatMap((m) => m.parts.filter((p) => p.type === "tool"))
  const omitted = tools.filter((p) => p.state.output.includes("[omitted]"))
  assert.ok(omitted.length > 0, "some results are replaced by markers")
  assert.ok(tools.length > omitted.length, "some results are shown in full")
  // every kept tool part is opencode's own object or a copy differing only in its output
  for (const p of tools) {
    const orig = before.flatMap((m) => m.parts).find((q) => q.id === p.id)
    assert.deepEqual({ ...p, state: { ...p.state, output: "" } }, { ...orig, state: { ...orig.state, output: "" } })
  }
  if (process.env.CR_TEST_OUT) writeFileSync(process.env.CR_TEST_OUT, JSON.stringify(toOpenAI(messages).openai))
})

test("the next step syncs onto the same session (no fork)", { skip: !URL }, async () => {
  const fn = await hook()
  const grown = session(11) // the same history plus one more turn, as opencode sends it next step
  await fn({}, { messages: grown })
  const res = await fetch(`${URL}/sessions`)
  const ids = (await res.json()).sessions
  assert.ok(ids.includes(`opencode-${SID}`))
  assert.ok(!ids.includes(`opencode-${SID}~1`), `unexpected fork: ${ids}`)
  const info = await (await fetch(`${URL}/sessions/opencode-${SID}`)).json()
  assert.equal(info.messages, toOpenAI(session(11)).openai.length)
})

test("fails open when the server is unreachable", async () => {
  const fn = await hook({ url: "http://127.0.0.1:9", timeoutMs: 2000 })
  const messages = session(4)
  const before = structuredClone(messages)
  const warn = console.warn
  let warned = 0
  console.warn = () => { warned++ }
  try {
    await fn({}, { messages })
    await fn({}, { messages })
  } finally {
    console.warn = warn
  }
  assert.deepEqual(messages, before)
  assert.equal(warned, 1)
})
