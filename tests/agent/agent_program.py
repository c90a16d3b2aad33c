"""An agent program as users write them: the official `openai` package, `OpenAI()` configured by
its environment only, a tool loop. What it does is picked by the task's `mode`:

- solve: ask with the calculator listed, run its calls, ask again; print `reward=<0|1>`
  (the answer compared with the task's); with AGENT_LOG set, append the logprobs of every token
  it received there (the test compares them with the trained trajectory);
- http_reward: solve, then POST the reward to AREALITE_REWARD_URL instead of printing it;
- hang: start a child process and sleep (the workflow must kill both at its timeout);
- crash: exit 3 after one completion; silent: one completion and no reward.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

from openai import OpenAI

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def solve(client: OpenAI, task: dict) -> float:
    messages, received = list(task["messages"]), []
    for _ in range(3):
        completion = client.chat.completions.create(
            model="policy", messages=messages, tools=[CALCULATOR], logprobs=True, max_tokens=96
        )
        choice = completion.choices[0]
        received += [t.logprob for t in choice.logprobs.content]
        messages.append(choice.message.model_dump(exclude_none=True))
        if not choice.message.tool_calls:
            if os.environ.get("AGENT_LOG"):  # one line per program: the logprobs of every token it received
                with open(os.environ["AGENT_LOG"], "a") as f:
                    f.write(json.dumps({"turns": len(messages) - len(task["messages"]), "logprobs": received}) + "\n")
            return float((choice.message.content or "").strip() == task["answer"])
        for call in choice.message.tool_calls:
            expression = json.loads(call.function.arguments)["expression"]
            a, b = expression.split("*")
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(int(a) * int(b))})
    return 0.0


def main() -> None:
    task = json.loads(sys.stdin.read())
    client = OpenAI()
    mode = task.get("mode", "solve")
    if mode == "hang":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(task["pid_file"], "w") as f:
            f.write(str(child.pid))
        time.sleep(600)
    if mode in ("crash", "silent"):
        client.chat.completions.create(model="policy", messages=task["messages"], max_tokens=4)
        if mode == "crash":
            sys.exit(3)
        return
    reward = solve(client, task)
    if mode == "http_reward":
        body = json.dumps({"reward": reward + 0.5}).encode()
        request = urllib.request.Request(os.environ["AREALITE_REWARD_URL"], body, {"Content-Type": "application/json"})
        urllib.request.urlopen(request).read()
        print("done")
    else:
        print(f"reward={reward}")


if __name__ == "__main__":
    main()
