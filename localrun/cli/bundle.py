"""`localrun bundle export|verify|import`: carry models (and localrun's wheels) to a box with no network."""

from __future__ import annotations

from pathlib import Path

import click

from localrun.cli.common import open_store
from localrun.cli.output import console, err_console, human_bytes, settings_from


@click.group("bundle")
def bundle_cmd() -> None:
    """Verified model bundles: export here, carry, verify and import there."""


@bundle_cmd.command("export")
@click.argument("names", nargs=-1, required=True)
@click.option(
    "-o",
    "--output",
    "output",
    required=True,
    type=click.Path(path_type=Path),
    help="A new folder, or a path ending in .tar for one tar (streamed, no staging copy).",
)
@click.option(
    "--with-wheels", is_flag=True, help="Add a wheelhouse of localrun and its dependencies for this platform."
)
@click.option(
    "--llama-wheel",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="With --with-wheels: this llama-cpp-python wheel (default: the wheelhouse's or pip's, if portable).",
)
@click.option(
    "--build-portable-llama",
    is_flag=True,
    help="With --with-wheels: build llama-cpp-python with every CPU variant, picked at run time "
    "(GGML_BACKEND_DL, ~1 CPU-hour once, then kept in the wheelhouse).",
)
@click.option(
    "--allow-native-llama", is_flag=True, help="With --with-wheels: accept a llama-cpp-python built for this CPU only."
)
@click.pass_context
def export_cmd(
    ctx: click.Context,
    names: tuple[str, ...],
    output: Path,
    with_wheels: bool,
    llama_wheel: Path | None,
    build_portable_llama: bool,
    allow_native_llama: bool,
) -> None:
    """Write NAMES (registered models) to a bundle at -o PATH, with a lock of every sha256."""
    from localrun.modelstore.bundle.export import export_bundle

    store = open_store(ctx)
    wheelhouse = None
    if with_wheels:
        from localrun.modelstore.bundle.wheels import WheelhouseOptions, build_wheelhouse

        opts = WheelhouseOptions(
            llama_wheel=llama_wheel, build_portable=build_portable_llama, allow_native=allow_native_llama
        )
        wheelhouse = lambda folder: build_wheelhouse(folder, opts)  # noqa: E731
    result = export_bundle(
        store,
        list(names),
        output,
        wheelhouse=wheelhouse,
        progress=lambda rel, n: err_console().print(f"  {rel}  {human_bytes(n)}", highlight=False),
    )
    for m in result.lock.models:
        kind = "synthetic repo" if m.synthetic else "repo"
        console().print(
            f"exported [bold]{m.name}[/] · {kind} {m.repo}@{m.commit[:10]} · {len(m.files)} file(s)", highlight=False
        )
    extra = f", {len(result.lock.wheels)} wheelhouse file(s)" if result.lock.wheels else ""
    console().print(f"bundle {result.path} · {human_bytes(result.bytes_written)}{extra}", highlight=False)


@bundle_cmd.command("verify")
@click.argument("path", type=click.Path(path_type=Path))
def verify_cmd(path: Path) -> None:
    """Check every entry, size and sha256 of a bundle without importing it."""
    from localrun.modelstore.bundle.importer import verify_bundle

    lock = verify_bundle(path)
    n = sum(len(m.files) for m in lock.models) + len(lock.wheels)
    console().print(f"bundle {path}: {len(lock.models)} model(s), {n} file(s), every sha256 matches", highlight=False)


@bundle_cmd.command("import")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--rehash", is_flag=True, help="Hash every byte, even those this machine verified at export.")
@click.option("--replace", is_flag=True, help="Replace models registered under the same names.")
@click.pass_context
def import_cmd(ctx: click.Context, path: Path, rehash: bool, replace: bool) -> None:
    """Verify and register a bundle's models (into the HF cache); safe to run again after an interruption."""
    from localrun.modelstore.bundle.importer import import_bundle

    settings_from(ctx)
    result = import_bundle(open_store(ctx), path, rehash=rehash, replace=replace)
    for rec in result.records:
        console().print(
            f"imported [bold]{rec.name}[/] · {rec.format.value} · {rec.repo} · {human_bytes(rec.size)} · verified",
            highlight=False,
        )
    err_console().print(
        f"  {result.linked} linked, {result.reflinked} reflinked, {result.copied} copied, {result.reused} already "
        "there; "
        f"{human_bytes(result.bytes_hashed)} hashed",
        highlight=False,
    )


COMMAND = bundle_cmd
