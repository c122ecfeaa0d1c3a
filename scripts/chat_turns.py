#!/usr/bin/env python3
"""Multi-turn chats against an OpenAI-compatible server, for benchmarks.

chat_turns.py BASE_URL CONVERSATIONS TURNS

Each conversation sends TURNS requests to BASE_URL/v1/chat/completions, one
after the other; each carries the whole history so far (user messages and
the assistant's replies) plus a new user message, greedy, 16 tokens.
"""
import json
import sys
import urllib.request


def chat(base, messages):
    body = json.dumps({"model": "", "messages": messages, "max_tokens": 16,
                       "temperature": 0}).encode()
    request = urllib.request.Request(base + "/v1/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)["choices"][0]["message"]["content"]


def main():
    base, conversations, turns = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    for c in range(conversations):
        messages = [{"role": "system", "content": "You are a storyteller for children. " * 4}]
        for t in range(turns):
            messages.append({"role": "user",
                             "content": f"Conversation {c}, turn {t}: what did the dog do next?"})
            messages.append({"role": "assistant", "content": chat(base, messages)})


if __name__ == "__main__":
    main()
