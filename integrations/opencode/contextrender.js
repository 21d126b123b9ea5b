/**
 * ContextRender for opencode (docs/method.md §9): before every model call, the session's
 * messages are sent to a ContextRender server and replaced by the history it
 * renders under the budget B.
 *
 * Hook: "experimental.chat.messages.transform" (input, output) — opencode
 * passes a clone of the session as output.messages ({info, parts}[]) and uses
 * that same array afterwards, so the array is changed in place (splice);
 * reassigning output.messages would have no effect.
 *
 * Mapping to the server's OpenAI format: a user message -> one user message
 * (its text parts); an assistant message -> one assistant message per step
 * (parts split at "step-start"), its text as content and its tool parts as
 * tool_calls (callID, tool, JSON of state.input), each followed by a tool
 * message with the tool's output (or error). Back from the render: dropped
 * messages and steps are removed, an omitted result's tool part gets the
 * marker as its output, everything else is opencode's own objects.
 *
 * Settings (plugin options or environment): url / CONTEXTRENDER_URL
 * (default http://127.0.0.1:8765), budget / CONTEXTRENDER_BUDGET (6000),
 * method / CONTEXTRENDER_METHOD (contextrender), timeoutMs /
 * CONTEXTRENDER_TIMEOUT_MS (30000). If the server cannot be reached the
 * messages go to the model unchanged (one warning per process).
 *
 * This file is self-contained (opencode loads plugin files on their own) and
 * exports only the plugin: opencode calls every export of a plugin module.
 */

const DEFAULT_URL = "http://127.0.0.1:8765"
const DROPPED_RESULT = "[omitted]"

function settings(options) {
  const o = options || {}
  const env = (typeof process !== "undefined" && process.env) || {}
  return {
    url: String(o.url || env.CONTEXTRENDER_URL || DEFAULT_URL).replace(/\/+$/, ""),
    budget: Number(o.budget || env.CONTEXTRENDER_BUDGET || 6000),
    method: String(o.method || env.CONTEXTRENDER_METHOD || "contextrender"),
    timeoutMs: Number(o.timeoutMs || env.CONTEXTRENDER_TIMEOUT_MS || 30000),
    overrides: o.overrides || undefined,
  }
}

function sessionKey(sessionID) {
  // The server accepts [A-Za-z0-9._:~@+=-]{1,200}.
  return ("opencode-" + String(sessionID).replace(/[^A-Za-z0-9._:@+=-]/g, "_")).slice(0, 200)
}

function isText(p) {
  return p && p.type === "text" && typeof p.text === "string" && !p.ignored
}

function toolOutput(part) {
  const st = part.state || {}
  if (st.status === "completed") {
    return st.time && st.time.compacted ? "[Old tool result content cleared]" : String(st.output ?? "")
  }
  if (st.status === "error") return String(st.error ?? "")
  return "[Tool execution was interrupted]"
}

/** opencode messages -> {openai: OpenAI messages, origins: where each came from}. */
function toOpenAI(messages) {
  const openai = []
  const origins = []
  messages.forEach((m, mi) => {
    const role = m && m.info && m.info.role
    const parts = Array.isArray(m && m.parts) ? m.parts : []
    if (role === "user") {
      openai.push({ role: "user", content: parts.filter(isText).map((p) => p.text).join("\n") })
      origins.push({ kind: "user", msg: mi })
      return
    }
    if (role !== "assistant") return
    const steps = []
    let cur = []
    parts.forEach((p, pi) => {
      if (p && p.type === "step-start" && cur.length) {
        steps.push(cur)
        cur = []
      }
      cur.push(pi)
    })
    if (cur.length) steps.push(cur)
    for (const step of steps) {
      const text = step.map((pi) => parts[pi]).filter(isText).map((p) => p.text).join("\n")
      const tools = step.filter((pi) => parts[pi] && parts[pi].type === "tool" && parts[pi].callID)
      if (!text && !tools.length) continue
      const msg = { role: "assistant", content: text }
      if (tools.length) {
        msg.tool_calls = tools.map((pi) => ({
          id: String(parts[pi].callID),
          type: "function",
          function: { name: String(parts[pi].tool), arguments: JSON.stringify((parts[pi].state || {}).input ?? {}) },
        }))
      }
      openai.push(msg)
      origins.push({ kind: "assistant", msg: mi, parts: step })
      for (const pi of tools) {
        openai.push({ role: "tool", tool_call_id: String(parts[pi].callID), content: toolOutput(parts[pi]) })
        origins.push({ kind: "tool", msg: mi, part: pi })
      }
    }
  })
  return { openai, origins }
}

function withOutput(part, text) {
  const state = { ...(part.state || {}) }
  if (state.status === "error") state.error = text
  else {
    state.status = "completed"
    state.output = text
  }
  if (state.time && state.time.compacted) state.time = { ...state.time, compacted: undefined }
  return { ...part, state }
}

function withText(message, text) {
  let done = false
  const parts = []
  for (const p of message.parts) {
    if (!isText(p)) parts.push(p)
    else if (!done) {
      parts.push({ ...p, text })
      done = true
    }
  }
  return { ...message, parts }
}

function inserted(template, r, k) {
  const info = template ? template.info : {}
  const id = `${info.id || "msg"}_cr${k}`
  return {
    info: { ...info, id, role: "user" },
    parts: [{ id: `${id}_p`, sessionID: info.sessionID, messageID: id, type: "text", text: r.content || "", synthetic: true }],
  }
}

/** The render applied to opencode's messages: a new array of (mostly the same) message objects. */
function applyRender(messages, conv, result) {
  const kept = new Map()
  const insertsBefore = new Map()
  let pending = []
  result.layout.forEach((seq, k) => {
    const r = result.messages[k]
    if (seq === null || seq === undefined) {
      pending.push(r)
      return
    }
    kept.set(seq, r)
    if (pending.length) {
      insertsBefore.set(seq, pending)
      pending = []
    }
  })
  const seqsOf = new Map()
  conv.origins.forEach((o, seq) => {
    if (!seqsOf.has(o.msg)) seqsOf.set(o.msg, [])
    seqsOf.get(o.msg).push(seq)
  })
  const template = messages.find((m) => m && m.info && m.info.role === "user")
  let nInserted = 0
  const out = []
  messages.forEach((m, mi) => {
    const seqs = seqsOf.get(mi) || []
    for (const s of seqs) {
      for (const r of insertsBefore.get(s) || []) out.push(inserted(template, r, nInserted++))
    }
    if (!seqs.length) {
      out.push(m) // nothing of it is in the graph (e.g. reasoning only): leave it
      return
    }
    if (m.info.role === "user") {
      const r = kept.get(seqs[0])
      if (!r) return
      const text = r.content ?? ""
      out.push(text === conv.openai[seqs[0]].content ? m : withText(m, text))
      return
    }
    const drop = new Set()
    const replace = new Map()
    let anyKept = false
    for (const s of seqs) {
      const o = conv.origins[s]
      if (o.kind === "assistant") {
        if (kept.has(s)) anyKept = true
        else o.parts.forEach((pi) => drop.add(pi))
      } else if (o.kind === "tool") {
        const r = kept.get(s)
        if (!r) replace.set(o.part, DROPPED_RESULT)
        else if ((r.content ?? "") !== conv.openai[s].content) replace.set(o.part, r.content ?? "")
      }
    }
    if (!anyKept) return
    if (!drop.size && !replace.size) {
      out.push(m)
      return
    }
    const parts = []
    m.parts.forEach((p, pi) => {
      if (drop.has(pi)) return
      parts.push(replace.has(pi) ? withOutput(p, replace.get(pi)) : p)
    })
    out.push({ ...m, parts })
  })
  for (const r of pending) out.push(inserted(template, r, nInserted++))
  return out
}

async function render(messages, sessionID, cfg) {
  const conv = toOpenAI(messages)
  if (!conv.openai.length) return null
  const body = { messages: conv.openai, budget: cfg.budget, method: cfg.method, on_conflict: "fork" }
  if (cfg.overrides) body.overrides = cfg.overrides
  const ctl = new AbortController()
  const timer = setTimeout(() => ctl.abort(), cfg.timeoutMs)
  let res
  try {
    res = await fetch(`${cfg.url}/sessions/${encodeURIComponent(sessionKey(sessionID))}/render`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify(body),
      signal: ctl.signal,
    })
  } finally {
    clearTimeout(timer)
  }
  const data = await res.json().catch(() => ({}))
  if (!res.ok) throw new Error(`server answered ${res.status}: ${data.detail || res.statusText}`)
  return { messages: applyRender(messages, conv, data), result: data }
}

export const ContextRenderPlugin = async (_input, options) => {
  const cfg = settings(options)
  let warned = false
  return {
    "experimental.chat.messages.transform": async (_hookInput, output) => {
      const messages = output && output.messages
      if (!Array.isArray(messages) || !messages.length) return
      const first = messages.find((m) => m && m.info && m.info.sessionID)
      if (!first) return
      try {
        const rendered = await render(messages, first.info.sessionID, cfg)
        if (rendered) messages.splice(0, messages.length, ...rendered.messages)
      } catch (err) {
        if (!warned) {
          warned = true
          console.warn(`[contextrender] render failed; sending opencode's messages unchanged: ${err && err.message}`)
        }
      }
    },
  }
}

// For tests and tooling; not a module export, so opencode does not treat it as a plugin.
ContextRenderPlugin.internals = { settings, sessionKey, toOpenAI, applyRender, render }
