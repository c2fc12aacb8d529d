"""``localrun launch claude|codex|opencode``: run a coding agent against localrun's server.

Each agent reads a custom endpoint from its own place: Claude Code from environment
variables (``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN`` and its tiered model names),
Codex from ``-c`` config overrides on its command line (a ``model_providers`` entry with
``wire_api = "responses"``), opencode from ``OPENCODE_CONFIG_CONTENT`` (a provider entry
for the OpenAI-compatible API). So ``launch`` writes nothing into the user's config files:
the settings live in the child's environment and arguments only. Telemetry, update
checks and other traffic beyond the endpoint are switched off by each agent's own knobs.

A localrun server already answering at the configured address is reused; otherwise one
is started in this process, for as long as the agent runs, with a context sized for the
agent (Claude Code's first request is ~20k tokens, past the planner's default 8,192). When
the model cannot hold that much (its trained length or the memory), ``launch`` says so
before the agent starts. ``--print`` shows the settings for people who start the agent
themselves.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.launch_kit import Background, activity_log, running_server
from localrun.cli.output import ctx_option, err_console, settings_from
from localrun.errors import LocalrunError

if TYPE_CHECKING:
    from localrun.modelstore.store import ModelStore
    from localrun.planning.planner import PlanOverrides
    from localrun.settings import Settings
    from localrun.types import ModelRecord, Plan

TELEMETRY_OFF = {"DO_NOT_TRACK": "1"}
#: The longest answer a server that ``launch`` starts writes (``--max-tokens``): agents ask for 32k.
LAUNCH_MAX_TOKENS = 2048
#: Variables of the user's environment that would point an agent elsewhere (a cloud key wins over the token).
UNSET = {"claude": ("ANTHROPIC_API_KEY",), "codex": ("OPENAI_BASE_URL",), "opencode": ("OPENCODE_CONFIG",)}


class ToolNotInstalled(LocalrunError):
    exit_code = 127
    code = "tool_not_installed"


@dataclass(frozen=True)
class Endpoint:
    """What an agent needs to reach localrun: the server's URL, a key and the model's name and context."""

    url: str
    key: str
    model: str
    n_ctx: int
    #: What the model reads (Codex's catalog words): text, and image for a model that sees.
    inputs: tuple[str, ...] = ("text",)


@dataclass(frozen=True)
class Agent:
    name: str
    binary: str
    package: str
    #: About how many tokens the agent's first request takes, and the context asked for it.
    first_request: int
    context: int
    #: (environment, arguments) for the agent; may write files into the scratch folder it gets.
    settings: Callable[[Endpoint, Path], tuple[dict[str, str], list[str]]]

    def install_hint(self) -> str:
        return f"install it with `npm install -g {self.package}` (Node.js 18+), or put `{self.binary}` on PATH"


def _claude(e: Endpoint, scratch: Path) -> tuple[dict[str, str], list[str]]:
    env = {
        "ANTHROPIC_BASE_URL": e.url,
        "ANTHROPIC_AUTH_TOKEN": e.key,
        "ANTHROPIC_MODEL": e.model,
        "ANTHROPIC_SMALL_FAST_MODEL": e.model,
        "CLAUDE_CODE_SUBAGENT_MODEL": e.model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_BUG_COMMAND": "1",
        # a per-request billing line in the system prompt would defeat the prefix cache every turn
        "CLAUDE_CODE_ATTRIBUTION_HEADER": "0",
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW": str(e.n_ctx),
    }
    for tier in ("OPUS", "SONNET", "HAIKU"):
        env[f"ANTHROPIC_DEFAULT_{tier}_MODEL"] = e.model
    return env, []


CODEX_PROVIDER = "localrun"
CODEX_KEY_ENV = "LOCALRUN_CODEX_API_KEY"


def codex_catalog(e: Endpoint) -> dict[str, Any]:
    """A Codex model catalog entry: the loaded context, what it reads (an image model's "image" keeps
    ``codex exec -i`` pictures from being dropped), no reasoning levels, and no base
    instructions — Codex's ~20 KB default prompt is written for OpenAI's models and would take most of a
    small local model's context (its developer messages, AGENTS.md and tools still go)."""
    return {
        "models": [
            {
                "slug": e.model,
                "display_name": e.model,
                "context_window": e.n_ctx,
                "shell_type": "default",
                "visibility": "list",
                "supported_in_api": True,
                "priority": 0,
                "truncation_policy": {"mode": "bytes", "limit": 10000},
                "input_modalities": list(e.inputs),
                "base_instructions": "",
                "support_verbosity": False,
                "default_verbosity": None,
                "supports_parallel_tool_calls": False,
                "supports_reasoning_summaries": False,
                "supported_reasoning_levels": [],
                "experimental_supported_tools": [],
            }
        ]
    }


def _codex(e: Endpoint, scratch: Path) -> tuple[dict[str, str], list[str]]:
    catalog = scratch / "codex-models.json"
    catalog.write_text(json.dumps(codex_catalog(e)))
    p = f"model_providers.{CODEX_PROVIDER}"
    overrides = {
        "model_provider": CODEX_PROVIDER,
        f"{p}.name": "localrun",
        f"{p}.base_url": f"{e.url}/v1",
        f"{p}.wire_api": "responses",
        f"{p}.env_key": CODEX_KEY_ENV,
        "model_catalog_json": str(catalog),
        "model_context_window": e.n_ctx,
        "check_for_update_on_startup": False,
        "analytics.enabled": False,
        "feedback.enabled": False,
    }
    args = []
    for key, value in overrides.items():
        args += ["-c", f"{key}={json.dumps(value)}"]
    return {CODEX_KEY_ENV: e.key}, args + ["-m", e.model]


def opencode_config(e: Endpoint) -> dict[str, Any]:
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {
            "localrun": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "localrun",
                "options": {"baseURL": f"{e.url}/v1", "apiKey": e.key},
                "models": {
                    e.model: {
                        "name": e.model,
                        "tool_call": True,
                        "limit": {"context": e.n_ctx, "output": min(8192, e.n_ctx // 4)},
                    }
                },
            }
        },
        "model": f"localrun/{e.model}",
        "small_model": f"localrun/{e.model}",
        "share": "disabled",
        "autoupdate": False,
    }


def _opencode(e: Endpoint, scratch: Path) -> tuple[dict[str, str], list[str]]:
    env = {
        "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(e)),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_SHARE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    return env, []


AGENTS: dict[str, Agent] = {
    # First requests measured with `localrun launch AGENT -- <one headless turn>` at the versions
    # scripts/dev pins (SmolLM2's tokenizer; the launch log's "chat with N tools of M prompt tokens"):
    # Claude Code 2.1.197 20,031 tokens (24 tools), opencode 1.18.33 7,659 (10), Codex 0.171.0 4,550 (12).
    "claude": Agent("claude", "claude", "@anthropic-ai/claude-code", 20_100, 32_768, _claude),
    "codex": Agent("codex", "codex", "@openai/codex", 4_600, 32_768, _codex),
    "opencode": Agent("opencode", "opencode", "opencode-ai", 7_660, 32_768, _opencode),
}


def agent_named(name: str) -> Agent:
    try:
        return AGENTS[name]
    except KeyError:
        raise LocalrunError(f"no agent named {name!r}", hint="launch one of: " + ", ".join(sorted(AGENTS))) from None


def find_executable(agent: Agent) -> str:
    """The agent's program on PATH; a clear message (exit 127) when it is not installed."""
    found = shutil.which(agent.binary)
    if found is None:
        raise ToolNotInstalled(f"{agent.binary} is not installed (the {agent.name} agent)", hint=agent.install_hint())
    return found


# --- the server ---------------------------------------------------------------------------


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


def context_notes(agent: Agent, record: ModelRecord, plan: Plan) -> list[str]:
    """Plain words when the model's context cannot hold what the agent sends."""
    from localrun.cli.launch_kit import holds

    if holds(plan.n_ctx, agent.first_request):
        return []
    trained = int(record.metadata.get("context_length") or 0)
    why = (
        f"it was trained on {trained:,} tokens"
        if trained and trained < agent.first_request
        else "; ".join(plan.reasons) or "the planner chose it"
    )
    return [
        f"{record.name} gets a {plan.n_ctx:,}-token context ({why}), but {agent.name}'s first request is about "
        f"{agent.first_request:,} tokens: expect 'prompt is too long' errors. Pick a model with a longer context "
        f"(--model) or give the agent a shorter system prompt."
    ]


def agent_overrides(settings: Settings, record: ModelRecord, agent: Agent, ctx_len: int | None) -> PlanOverrides | None:
    """The planner overrides of ``launch``: --ctx, else the user's own ctx setting for the model
    (``[models."NAME"] ctx``, ``runtime.ctx``), else the context the agent needs."""
    from localrun.planning.context import user_context
    from localrun.planning.planner import PlanOverrides

    if ctx_len is not None:
        return PlanOverrides(n_ctx=ctx_len, ctx_source="--ctx")
    if user_context(record.name, settings, None, None)[0] is not None:
        return None
    why = f"launch {agent.name} (its first request is about {agent.first_request:,} tokens)"
    return PlanOverrides(n_ctx=agent.context, ctx_source=why)


def _model_and_plan(
    settings: Settings, store: ModelStore, name: str | None, agent: Agent, ctx_len: int | None = None
) -> tuple[ModelRecord, Plan, PlanOverrides | None]:
    from localrun.cli.common import resolve_or_builtin
    from localrun.cli.launch_kit import candidates, choose
    from localrun.modelstore.builtins import DEFAULT_MODEL_NAME
    from localrun.planning.facts import default_plan

    if name is None:
        choice = choose(
            settings, candidates(store), agent.first_request, lambda r: agent_overrides(settings, r, agent, ctx_len)
        )
        if choice is not None:
            err_console().print(
                f"[dim]{agent.name} gets {choice.record.name}: {choice.why(agent.first_request, agent.name)}[/]",
                highlight=False,
            )
            return choice.record, choice.plan, agent_overrides(settings, choice.record, agent, ctx_len)
    record = resolve_or_builtin(store, name or DEFAULT_MODEL_NAME)
    overrides = agent_overrides(settings, record, agent, ctx_len)
    return record, default_plan(record, settings, overrides), overrides


# --- the command --------------------------------------------------------------------------


def _print_settings(agent: Agent, e: Endpoint, args: tuple[str, ...], folder: Path) -> None:
    """The settings as shell lines; files the agent needs (Codex's catalog) go to ``folder``, which stays."""
    env, arguments = agent.settings(e, folder)
    for key in UNSET.get(agent.name, ()):
        click.echo(f"unset {key}")
    for key, value in env.items():
        click.echo(f"export {key}={shlex.quote(value)}")
    click.echo(shlex.join([agent.binary, *arguments, *args]))


@click.command("launch", context_settings={"ignore_unknown_options": True})
@click.argument("agent_name", metavar="AGENT")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option(
    "--model",
    "-m",
    "model_name",
    default=None,
    help="Model to serve to the agent (default: the registered model best for it: one whose context holds "
    "the agent's first request, said on stderr).",
)
@ctx_option(
    'Context to serve the model with (default: [models."NAME"] ctx or runtime.ctx if set, else 32,768 '
    "within the model's trained context)."
)
@click.option(
    "--max-tokens",
    "max_tokens",
    type=click.IntRange(1, None),
    default=None,
    help="Longest answer the server launch starts will write, whatever the agent asks "
    f"(default {LAUNCH_MAX_TOKENS:,} or runtime.max_tokens_cap if lower): a small model that rambles "
    "to the agent's own limit would take many minutes per turn.",
)
@click.option(
    "--print", "print_only", is_flag=True, help="Print the environment and command instead of running the agent."
)
@click.pass_context
def launch_cmd(
    ctx: click.Context,
    agent_name: str,
    args: tuple[str, ...],
    model_name: str | None,
    ctx_len: int | None,
    max_tokens: int | None,
    print_only: bool,
) -> None:
    """Run a coding agent (claude, codex, opencode) against localrun. ARGS after -- go to the agent."""
    agent = agent_named(agent_name)
    settings = settings_from(ctx)
    from localrun.cli.common import open_store
    from localrun.server.serve import server_url

    store = open_store(ctx)
    record, plan, overrides = _model_and_plan(settings, store, model_name, agent, ctx_len)
    key = settings.server.api_key.get_secret_value() if settings.server.api_key else "localrun"
    url = server_url(_client_host(settings.server.host), settings.server.port)
    from rich.markup import escape

    for note in context_notes(agent, record, plan):
        err_console().print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    from localrun.cli.launch_kit import input_modalities, print_dir

    inputs = input_modalities(record, settings)
    if print_only:
        _print_settings(
            agent, Endpoint(url, key, record.name, plan.n_ctx, inputs), args, print_dir(settings, agent.name)
        )
        return
    exe = find_executable(agent)
    background: Background | None = None
    log_path = settings.data_dir / "logs" / f"launch-{agent.name}.log"
    if running_server(url, key) is None:
        from localrun.cli.common import make_manager

        cap = min(max_tokens or LAUNCH_MAX_TOKENS, settings.runtime.max_tokens_cap)
        settings = settings.model_copy(update={"runtime": settings.runtime.model_copy(update={"max_tokens_cap": cap})})
        handler = activity_log(log_path)
        manager = make_manager(settings, store, overrides)
        manager.worker_log = log_path
        background = Background(settings, manager)
        url = background.url
        err_console().print(
            f"[dim]localrun serving {record.name} ({plan.n_ctx:,}-token context, answers up to {cap:,} tokens) "
            f"on {url} for {agent.name}\n"
            f"what the server is doing (prefill progress, tokens/s, refusals): tail -f {log_path}[/]",
            highlight=False,
            soft_wrap=True,  # the path stays on one line, for copying
        )
    else:
        err_console().print(
            f"[dim]using the localrun server at {url}; its context for {record.name} is its own plan's[/]",
            highlight=False,
        )
    try:
        code = _run_agent(agent, exe, Endpoint(url, key, record.name, plan.n_ctx, inputs), args)
    finally:
        if background is not None:
            background.stop()
            handler.close()
            err_console().print(f"[dim]server activity of this run: {log_path}[/]", highlight=False, soft_wrap=True)
    sys.exit(code)


def _run_agent(agent: Agent, exe: str, endpoint: Endpoint, args: tuple[str, ...]) -> int:
    """Run the agent to its end with its settings in its environment and arguments only; its exit code."""
    with tempfile.TemporaryDirectory(prefix=f"localrun-{agent.name}-") as scratch:
        extra_env, arguments = agent.settings(endpoint, Path(scratch))
        env = {k: v for k, v in os.environ.items() if k not in UNSET.get(agent.name, ())}
        env.update(TELEMETRY_OFF)
        env.update(extra_env)
        try:
            return subprocess.call([exe, *arguments, *args], env=env)
        except KeyboardInterrupt:
            return 130


COMMAND = launch_cmd
