"""Issue 20, hybrid models: how much of each agent turn a hybrid model prefills again.

    python benchmarks/kv_hybrid.py [--threads 2] [--turns 20]

20 agent-shaped turns (a ~2,500-token system prompt with a tool list, then per turn a tool
result or a user message and a short answer) on the tiny LFM2 fixture (tests/support/hybrid.py:
attention beside short convolutions, whose state cannot be cut back) through a real
``localrun serve``. Per turn: prompt tokens prefilled (prompt_tokens - cached_tokens) ÷ the
prompt; target ≤ 5 % for every turn after the first. Beside it the same conversation on
llama-server (the vendored build, its default context checkpoints), when that binary is there
and runs the architecture: what it prefilled per turn (``timings.prompt_n``).

``run(threads)`` returns the numbers as a dict (benchmarks/bench_kv_disk.py calls it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, stop, wait_ready  # noqa: E402

TARGET = 0.05
LLAMA_SERVER = (
    Path(os.environ.get("LOCALRUN_TEST_CACHE", Path.home() / ".cache" / "localrun-test"))
    / "llama.cpp-0.3.36"
    / "build-native"
    / "bin"
    / "llama-server"
)
TOOLS = [
    ("read_file", "Read a file of the workspace and return its text; path is relative to the root."),
    ("write_file", "Write the given text to a file of the workspace, replacing what it held."),
    ("run", "Run a shell command in the workspace and return what it printed and its exit status."),
    ("search", "Search the workspace for a word and return every line where it is found."),
]


def system_prompt() -> str:
    tools = "\n".join(
        json.dumps({"name": n, "description": d, "parameters": {"path": "string", "text": "string"}}) for n, d in TOOLS
    )
    rules = "You are a careful coding agent. Read before you write, run the tests after each change. " * 40
    return f"{rules}\n# Tools\n{tools}\n" * 2


def turn_message(k: int) -> tuple[str, str]:
    if k % 2:
        return "user", f"tool result {k}: the test printed hello world and the time is now {k} ok"
    return "user", f"step {k}: please read the file and then run the tests again and say what you see"


def conversation(chat, turns: int) -> list[dict]:
    """Each turn's request: the conversation so far, greedy, 16 tokens; ``chat`` returns
    (answer text, prompt tokens, tokens prefilled)."""
    messages = [{"role": "system", "content": system_prompt()}]
    rows = []
    for k in range(turns):
        role, text = turn_message(k)
        messages.append({"role": role, "content": text})
        answer, prompt, prefilled = chat(messages)
        rows.append({"turn": k + 1, "prompt": prompt, "prefilled": prefilled})
        messages.append({"role": "assistant", "content": answer})
    return rows


def _post(url: str, body: dict) -> dict:
    import httpx

    r = httpx.post(url, json=body, timeout=600)
    r.raise_for_status()
    return r.json()


def localrun_turns(model: Path, threads: int, turns: int, work: Path) -> list[dict]:
    home = work / "home"
    env = {**os.environ, "LOCALRUN_HOME": str(home), "HF_HOME": str(home / "hf"), "PYTHONPATH": str(ROOT)}
    env.update(LOCALRUN_RUNTIME__THREADS=str(threads), LOCALRUN_RUNTIME__FORCE="llama.cpp")
    code = (
        "import sys; from localrun.modelstore.store import ModelStore; from localrun.settings import Settings; "
        "ModelStore(Settings()).import_path(sys.argv[1], name='lfm2')"
    )
    subprocess.run([sys.executable, "-c", code, str(model)], env=env, check=True, cwd=ROOT)
    port = free_port()
    args = ["localrun", "serve", "--port", str(port), "--no-default-model", "--ctx", "8192", "--parallel", "1"]
    with open(work / "localrun.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", *args], env=env, cwd=ROOT, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{url}/health")

        def chat(messages):
            body = {"model": "lfm2", "messages": messages, "max_tokens": 16, "temperature": 0}
            out = _post(f"{url}/v1/chat/completions", body)
            usage = out["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            return (
                out["choices"][0]["message"]["content"] or "",
                usage["prompt_tokens"],
                usage["prompt_tokens"] - cached,
            )

        return conversation(chat, turns)
    finally:
        stop(proc)


def llama_server_turns(model: Path, threads: int, turns: int, work: Path) -> list[dict] | str:
    """The same conversation on llama-server, or why it could not run."""
    if not LLAMA_SERVER.exists():
        return f"no llama-server at {LLAMA_SERVER}"
    port = free_port()
    args = [str(LLAMA_SERVER), "-m", str(model), "--port", str(port), "-c", "8192", "-np", "1", "-t", str(threads)]
    with open(work / "llama-server.log", "wb") as log:
        proc = subprocess.Popen(
            args, stdout=log, stderr=log, env={**os.environ, "LD_LIBRARY_PATH": str(LLAMA_SERVER.parent)}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_ready(proc, f"{url}/health", timeout=120)
        except RuntimeError as exc:
            tail = (work / "llama-server.log").read_text(errors="replace")[-400:]
            return f"llama-server did not start ({exc}): {tail}"

        def chat(messages):
            body = {"model": "lfm2", "messages": messages, "max_tokens": 16, "temperature": 0, "cache_prompt": True}
            out = _post(f"{url}/v1/chat/completions", body)
            timings = out.get("timings") or {}
            prompt = out["usage"]["prompt_tokens"]
            return out["choices"][0]["message"]["content"] or "", prompt, int(timings.get("prompt_n", prompt))

        return conversation(chat, turns)
    finally:
        stop(proc)


def _summary(rows: list[dict]) -> dict:
    later = [r["prefilled"] / r["prompt"] for r in rows[1:]]
    return {
        "turns": rows,
        "worst_later_fraction": round(max(later), 4) if later else None,
        "mean_later_fraction": round(sum(later) / len(later), 4) if later else None,
    }


def run(threads: int = 2, turns: int = 20) -> dict:
    from tests.support.hybrid import lfm2_path

    model = lfm2_path()
    with tempfile.TemporaryDirectory(prefix="kv-hybrid-") as tmp:
        work = Path(tmp)
        ours = _summary(localrun_turns(model, threads, turns, work))
        theirs = llama_server_turns(model, threads, turns, work)
    result = {"model": model.name, "threads": threads, "target": TARGET, "localrun": ours}
    result["meets_target"] = ours["worst_later_fraction"] is not None and ours["worst_later_fraction"] <= TARGET
    result["llama_server"] = _summary(theirs) if isinstance(theirs, list) else {"skipped": theirs}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=20)
    a = parser.parse_args()
    result = run(a.threads, a.turns)
    print(f"{result['model']}, {result['threads']} threads: prompt tokens prefilled per turn")
    server = result["llama_server"]
    theirs = {r["turn"]: r for r in server.get("turns", [])}
    print(f"{'turn':>4} {'prompt':>7} {'localrun':>9} {'%':>6} {'llama-server':>13}")
    for row in result["localrun"]["turns"]:
        other = theirs.get(row["turn"])
        print(
            f"{row['turn']:>4} {row['prompt']:>7} {row['prefilled']:>9} {100 * row['prefilled'] / row['prompt']:>5.1f}%"
            + (f" {other['prefilled']:>13}" if other else "")
        )
    ours = result["localrun"]
    print(
        f"localrun after turn 1: worst {100 * ours['worst_later_fraction']:.1f}%, mean "
        f"{100 * ours['mean_later_fraction']:.1f}% of the prompt (target <= {100 * TARGET:.0f}%): "
        + ("met" if result["meets_target"] else "NOT met")
    )
    if "skipped" in server:
        print(f"llama-server: {server['skipped']}")
    else:
        print(
            f"llama-server after turn 1: worst {100 * server['worst_later_fraction']:.1f}%, "
            f"mean {100 * server['mean_later_fraction']:.1f}%"
        )


if __name__ == "__main__":
    main()
