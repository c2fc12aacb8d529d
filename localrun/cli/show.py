"""``localrun show``: what a model is, as ``ollama show`` tells it — architecture, parameters,
context, quantisation, capabilities, its files, and its template and licence where the file says."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from localrun.cli.common import open_store
from localrun.cli.output import console, human_bytes

if TYPE_CHECKING:
    from localrun.settings import Settings
    from localrun.types import ModelRecord


def parameter_count(n: object) -> str:
    """``268098176`` -> ``268.1M``, as Ollama shows a parameter count."""
    if not isinstance(n, int) or n <= 0:
        return "—"
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def describe(record: ModelRecord, settings: Settings) -> dict[str, Any]:
    """Everything `show` prints, as one JSON-ready object."""
    from localrun.modelstore.capabilities import capabilities, chat_template, scalars
    from localrun.modelstore.projector import projector_path

    meta = record.metadata or {}
    found = scalars(record)
    return {
        "name": record.name,
        "format": record.format.value,
        "architecture": meta.get("architecture"),
        "parameters": meta.get("n_params") or None,
        "context_length": meta.get("context_length"),
        "embedding_length": meta.get("embedding_length"),
        "quantization": meta.get("quant"),
        "capabilities": capabilities(record, settings),
        "source": record.source.value,
        "repo": record.repo,
        "owned": record.owned,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in record.files],
        "projector": projector_path(record),
        "template": chat_template(record) or None,
        "license": found.get("general.license") or meta.get("license"),
    }


@click.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--template", "only_template", is_flag=True, help="Print the chat template only.")
@click.option("--license", "only_license", is_flag=True, help="Print the licence only.")
@click.pass_context
def show_cmd(ctx: click.Context, name: str, as_json: bool, only_template: bool, only_license: bool) -> None:
    """Show what model NAME is: architecture, parameters, context, quantisation, capabilities, files.
    NAME may be a hub repo not pulled yet (ORG/REPO[:QUANT]): its header is read from the hub."""
    from localrun.cli.plan import resolve_or_hub

    store = open_store(ctx)
    facts = describe(resolve_or_hub(store, name), store.settings)  # a repo not pulled: read from the hub
    if as_json:
        click.echo(json.dumps(facts, indent=2))
        return
    if only_template or only_license:
        click.echo(facts["template" if only_template else "license"] or "")
        return
    out = console()
    rows = [
        ("architecture", facts["architecture"]),
        ("parameters", parameter_count(facts["parameters"])),
        ("context length", f"{facts['context_length']:,}" if facts["context_length"] else None),
        ("embedding length", facts["embedding_length"]),
        ("quantization", facts["quantization"]),
        ("format", facts["format"]),
        ("source", facts["source"] + (f" ({facts['repo']})" if facts["repo"] else "")),
    ]
    out.print(f"  [bold]{facts['name']}[/]", highlight=False)
    section(out, "Model", [(k, str(v)) for k, v in rows if v not in (None, "", "—")])
    section(out, "Capabilities", [(c, "") for c in facts["capabilities"]])
    files = [(human_bytes(f["size"]), f["path"]) for f in facts["files"]]
    if facts["projector"] and all(f["path"] != facts["projector"] for f in facts["files"]):
        files.append(("projector", facts["projector"]))
    section(out, "Files", files)
    if facts["template"]:
        first = facts["template"].strip().splitlines()[0][:70]
        section(out, "Template", [(first + (" …" if len(facts["template"]) > len(first) else ""), "")])
    if facts["license"]:
        section(out, "License", [(str(facts["license"]).strip().splitlines()[0][:70], "")])


def section(out: Any, title: str, rows: list[tuple[str, str]]) -> None:
    if not rows:
        return
    out.print(f"\n  {title}", highlight=False, markup=False)
    for key, value in rows:
        out.print(f"    {key:<20} {value}".rstrip(), highlight=False, markup=False, soft_wrap=True)


COMMAND = show_cmd
