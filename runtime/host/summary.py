"""Summarising a long thread: the older part of its conversation, told back in a few lines by the model.

A thread's runs continue its conversation by reference, so its storage stays linear; but the prompt is
bounded by the model's context. The history window (`history_window`) drops older messages from each
request; a bundle's `conversation.summarise` keeps their gist instead: when the conversation a new run
continues has more than `after` messages, the host asks the bundle's model for a summary of all but the
newest `keep`, and records it in the run's `run.started` (`summary`, `summarised`). The kernel then starts
from the summary plus the kept messages, and the thread's later runs continue from that, so a summary is
made once per `after - keep` messages, not per run. The summary is an input (a model's answer), so it is
recorded, never made again by a replay or a recovery.

A failed summary call is not a failed run: the run continues the whole conversation (the window still
bounds each request), and the next run tries again.
"""

from __future__ import annotations

import logging

from runtime import history, kernel
from runtime.host.served import AgentRuntime
from runtime.types import Message

log = logging.getLogger("runtime.host")


def transcript(messages: tuple[Message, ...]) -> str:
    """The messages as plain text, whatever the model family: `role: content`, calls and results named."""
    lines = []
    for m in messages:
        text = m.content
        if m.tool_calls:
            text += "".join(f"\n[calls {c.name}({c.arguments})]" for c in m.tool_calls)
        who = f"tool {m.name}" if m.role == "tool" else m.role
        lines.append(f"{who}: {text}")
    return "\n".join(lines)


async def summarise(agent: AgentRuntime, conv: kernel.Conversation) -> tuple[str | None, int]:
    """(summary, how many leading messages it replaces) for a conversation past the bundle's
    `conversation.summarise.after`; (None, 0) when none is due or the model could not make one."""
    spec = agent.bundle.spec.conversation.summarise
    if spec is None or len(conv.messages) <= spec.after:
        return None, 0
    cut = history.summary_cut(conv.messages, spec.keep)
    if cut == 0:
        return None, 0
    prompt = [{"role": "user", "content": f"{transcript(conv.messages[:cut])}\n\n{spec.prompt}"}]
    try:
        completion = await agent.client.complete(prompt, **dict(agent.config.sampling))
    except Exception as e:  # the run goes on without a summary (see the module docstring)
        log.warning("summarising thread run %s failed (%s): the run continues the whole conversation",
                    conv.run_id, e)
        return None, 0
    text = completion.text.strip()
    return (text, cut) if text else (None, 0)


__all__ = ["summarise", "transcript"]
