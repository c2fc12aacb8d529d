"""Tool calls side by side: localrun and llama-server (``--jinja``) on the same GGUF and the
same 207 BFCL-shaped cases (benchmarks/tool_cases.py), SmolLM2 135M Instruct and Gemma 3 270M.

For each answer (OpenAI chat completions, ``tool_choice: auto``, sampled at ``--temperature``
with a seed per case): the calls that *started* (parsed calls, plus call markers left in the
text: a call the server could not parse, and for localrun a 500 ``invalid_model_output``,
which is a call that broke its schema), those whose arguments validate against their schema
(jsonschema), whether the right functions were called, whether an irrelevant question got no
call, and the seconds the case took. Plus the time and memory to compile a 200-tool grammar.

    .venv/bin/python benchmarks/bench_tools.py --cases 40 --threads 2

Needs llama-server (scripts/build-llama-server --native builds it; ``--llama-server PATH``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import free_port, gemma_path, stop, wait_ready  # noqa: E402
from benchmarks.tool_cases import Case, cases  # noqa: E402

MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", '{"name"', "```tool_code", "<function=")


def smol_path() -> Path:
    from localrun.modelstore.builtins import chat_model_path

    path = chat_model_path()
    if path is None:
        raise SystemExit("SmolLM2 is not in the cache: run scripts/dev setup")
    return path


def llama_server_binary(given: str | None) -> str:
    if given:
        return given
    out = subprocess.run([str(ROOT / "scripts" / "build-llama-server"), "--native"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"no llama-server: {out.stderr[-500:]}")
    return str(Path(out.stdout.strip().splitlines()[-1]) / "llama-server")


class Server:
    def __init__(self, name: str, args: list[str], env: dict[str, str], health: str) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(tempfile.gettempdir()) / f"bench-tools-{name}-{self.port}.log", "wb")  # noqa: SIM115
        args = [a.replace("{port}", str(self.port)) for a in args]
        self.proc = subprocess.Popen(args, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_ready(self.proc, self.url + health, timeout=300)

    def close(self) -> None:
        stop(self.proc)
        self.log.close()


def start_localrun(models: dict[str, Path], threads: int, home: Path, tool_fallback: str | None = None) -> Server:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCALRUN_")}
    if tool_fallback:  # templates without tool syntax: call_or_reply (the default) or tagged
        env["LOCALRUN_RUNTIME__TOOL_FALLBACK"] = tool_fallback
    env.update(
        LOCALRUN_HOME=str(home),
        PYTHONPATH=str(ROOT),
        LOCALRUN_RUNTIME__THREADS=str(threads),
        LOCALRUN_RUNTIME__CONTEXT_LENGTH="4096",
        LOCALRUN_RUNTIME__PARALLEL="1",
        LOCALRUN_RUNTIME__SPECULATIVE="off",
    )
    for name, path in models.items():
        cmd = [sys.executable, "-m", "localrun", "import", str(path), "--name", name]
        subprocess.run(cmd, env=env, check=True, capture_output=True)
    args = [sys.executable, "-m", "localrun", "serve", "--no-default-model", "--port", "{port}"]
    return Server("localrun", args, env, "/health")


def start_llama_server(binary: str, name: str, path: Path, threads: int) -> Server:
    args = [binary, "-m", str(path), "--port", "{port}", "-c", "4096", "-np", "1", "--jinja", "--alias", name]
    args += ["-t", str(threads), "-tb", str(threads), "--no-webui", "--no-repack"]
    return Server(f"llama-server-{name}", args, dict(os.environ), "/health")


def ask(server: Server, model: str, case: Case, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    body = {
        "model": model,
        "messages": [{"role": "user", "content": case.question}],
        "tools": list(case.tools),
        "tool_choice": "auto",
        "parallel_tool_calls": case.category == "parallel",  # both servers allow one call unless asked
        "temperature": args.temperature,
        "seed": seed,
        "max_tokens": args.max_tokens,
    }
    t0 = time.perf_counter()
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=900)
    took = time.perf_counter() - t0
    answer = r.json()
    return {"status": r.status_code, "answer": answer, "seconds": took}


def score(case: Case, result: dict[str, Any]) -> dict[str, Any]:
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case.tools}
    if result["status"] != 200:
        broke = "invalid_model_output" in json.dumps(result["answer"])
        return {"started": int(broke), "valid": 0, "cut": 0, "names": [], "markers": 0, "error": result["status"]}
    message = result["answer"]["choices"][0]["message"]
    calls = message.get("tool_calls") or []
    valid = 0
    for call in calls:
        fn = call["function"]
        try:
            jsonschema.validate(json.loads(fn["arguments"]), schemas[fn["name"]])
            valid += 1
        except (KeyError, ValueError, jsonschema.ValidationError):
            pass
    content = message.get("content") or ""
    tagged = sum(content.count(m) for m in MARKERS if m != '{"name"')
    markers = tagged or content.count('{"name"')  # a bare JSON call only counts where no tag opened one
    cut = markers if result["answer"]["choices"][0].get("finish_reason") == "length" else 0
    names = [c["function"]["name"] for c in calls]
    return {"started": len(calls) + markers, "valid": valid, "cut": cut, "names": names, "markers": markers}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    started = sum(r["started"] for r in rows)
    cut = sum(r.get("cut", 0) for r in rows)
    valid = sum(r["valid"] for r in rows)
    relevant = [r for r in rows if r["expected"]]
    irrelevant = [r for r in rows if not r["expected"]]
    return {
        "cases": len(rows),
        "calls_started": started,
        "valid_calls": valid,
        "cut_by_max_tokens": cut,
        "valid_share": round(valid / (started - cut), 3) if started > cut else None,
        "right_function": round(sum(sorted(r["names"]) == sorted(r["expected"]) for r in relevant) / len(relevant), 3)
        if relevant
        else None,
        "irrelevance_handled": round(sum(r["started"] == 0 for r in irrelevant) / len(irrelevant), 3)
        if irrelevant
        else None,
        "s_per_case": round(sum(r["seconds"] for r in rows) / len(rows), 2),
    }


def compile_200_tools() -> dict[str, float]:
    """Seconds and peak RSS growth to build the lazy grammar of 200 tools (in this process)."""
    import resource

    from localrun.runtimes.llamacpp.lazy_grammar import chat_grammar
    from localrun.types import ChatRequest, Message

    tools = []
    for i in range(200):
        props = {f"p{j}": {"type": ["string", "integer", "number", "boolean"][j % 4]} for j in range(5)}
        params = {"type": "object", "properties": props, "required": ["p0", "p1"]}
        tools.append({"type": "function", "function": {"name": f"tool_{i}", "parameters": params}})
    req = ChatRequest(messages=(Message("user", "x"),), tools=tuple(tools), tool_choice="auto")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    gbnf = chat_grammar(req, None) or ""
    took = time.perf_counter() - t0
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    return {
        "tools": 200,
        "schema_kb": round(len(json.dumps(tools)) / 1024, 1),
        "grammar_kb": round(len(gbnf) / 1024, 1),
        "seconds": round(took, 3),
        "rss_growth_mb": round(grown / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=0, help="the first N cases (0: all 207)")
    parser.add_argument("--models", default="smol,gemma")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--llama-server", default=None)
    parser.add_argument("--json", type=Path, default=None, help="write every row here")
    parser.add_argument("--tool-fallback", choices=("call_or_reply", "tagged"), default=None)
    parser.add_argument("--no-llama-server", action="store_true", help="localrun's column only")
    args = parser.parse_args()
    chosen = cases()[: args.cases or None]
    paths = {"smol": smol_path, "gemma": gemma_path}
    models = {m: paths[m]() for m in args.models.split(",")}
    binary = None if args.no_llama_server else llama_server_binary(args.llama_server)
    print(json.dumps({"grammar_200_tools": compile_200_tools()}), flush=True)
    rows: list[dict[str, Any]] = []
    # A worker may still write its cache while the folder goes: that must not lose the results.
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as home:
        localrun = start_localrun(models, args.threads, Path(home), args.tool_fallback)
        try:
            for model, path in models.items():
                anchor = start_llama_server(binary, model, path, args.threads) if binary else None
                try:
                    for seed, case in enumerate(chosen):
                        for server in (localrun, anchor) if anchor else (localrun,):
                            result = ask(server, model, case, seed, args)
                            row = {
                                "server": server.name.split("-")[0] if server is localrun else "llama-server",
                                "model": model,
                                "category": case.category,
                                "expected": list(case.expected),
                                "seconds": result["seconds"],
                                **score(case, result),
                            }
                            rows.append(row)
                        print(f"{model} {seed + 1}/{len(chosen)}", file=sys.stderr, flush=True)
                finally:
                    if anchor:
                        anchor.close()
        finally:
            localrun.close()
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[(row["model"], row["server"])].append(row)
    head = ("model", "server", "cases", "calls started", "cut by max_tokens", "valid calls", "valid ÷ (started − cut)")
    head += ("right function",)
    print("| " + " | ".join((*head, "irrelevance handled", "s/case")) + " |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, server), group in sorted(groups.items()):
        s = summarise(group)
        print(
            f"| {model} | {server} | {s['cases']} | {s['calls_started']} | {s['cut_by_max_tokens']} | "
            f"{s['valid_calls']} | {s['valid_share']} | "
            f"{s['right_function']} | {s['irrelevance_handled']} | {s['s_per_case']} |"
        )


if __name__ == "__main__":
    main()
