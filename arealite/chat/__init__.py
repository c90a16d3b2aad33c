"""An OpenAI-compatible chat client over the rollout client, for training agents (see client.py)."""

from arealite.chat.client import ChatClient, ChatObject, chat_completion
from arealite.chat.record import CompletionRecord, conversation_tokens, conversation_trajectory, episode_trajectory
from arealite.chat.template import ParsedToolCall, continuation_ids, parse_tool_calls, render_prompt, reply_text

__all__ = [
    "ChatClient",
    "ChatObject",
    "CompletionRecord",
    "ParsedToolCall",
    "chat_completion",
    "continuation_ids",
    "conversation_tokens",
    "conversation_trajectory",
    "episode_trajectory",
    "parse_tool_calls",
    "render_prompt",
    "reply_text",
]
