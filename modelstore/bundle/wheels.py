"""The wheelhouse a bundle carries (``--with-wheels``): localrun and every dependency as wheels
for this platform, and a requirements file of exact versions with sha256 hashes, so that on
a box with no package index ``pip install --no-index --find-links wheels -r
wheels/requirements.txt`` installs localrun without a single network request or build.

llama-cpp-python is the hard part: PyPI ships only its sdist, so the wheel must be built
here. A default build compiles ggml with ``-march=native`` and may die with SIGILL on an
older CPU. The portable one is built as llama.cpp's own releases are: ``GGML_BACKEND_DL`` with
``GGML_CPU_ALL_VARIANTS`` compiles the CPU backend once per x86 level (x64, sse42, haswell,
skylakex, icelake, zen4, alderlake…) as ``libggml-cpu-<variant>.so`` modules, and ggml loads
the best one the running CPU scores (runtimes/llamacpp/build_info.py points ggml at the
package's lib/ folder, where :func:`make_portable` moves them). The Sapphire Rapids variant is
left out: its AMX kernels crash llama-cpp-python 0.3.36 on Q4_K models (scripts/llama_backend.py),
and such a CPU then loads the zen4 variant (AVX-512 with VBMI, VNNI and BF16). The wheel records
how it was built in ``lib/cmake/ggml/ggml-config.cmake``; that is read, never guessed. A native
wheel is used only when asked (``allow_native``) and a portable build (~1 CPU-hour) only when
asked (``build_portable``), because both are choices about other people's CPUs; the portable
wheel is kept in the wheelhouse (``<version>-cpu-portable-<machine>``) and built once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localrun.errors import LocalrunError

logger = logging.getLogger(__name__)

REQUIREMENTS = "requirements.txt"
EXTRAS = "llama"
_GGML_CONFIG = "lib/cmake/ggml/ggml-config.cmake"
_ON = ("ON", "TRUE", "1")
#: Instruction-set options past the portable build's baseline (x86-64 + AVX2/FMA).
_BEYOND_BASELINE_RE = re.compile(r'set\(GGML_(?:AVX512\w*|AVX_VNNI|AMX_\w+)\s+"?(\w+)"?\)', re.IGNORECASE)
_NATIVE_RE = re.compile(r'set\(GGML_NATIVE\s+"?(ON|OFF|TRUE|FALSE|1|0)"?\)', re.IGNORECASE)
PORTABLE_CMAKE_ARGS = (
    "-DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF "
    "-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)
#: A CPU backend module of a GGML_BACKEND_DL build, wherever the build installed it.
_VARIANT_RE = re.compile(r"(?:^|/)(lib)?ggml-cpu-([\w.]+?)\.(so|dll|dylib)$")
#: Variants left out of a portable wheel: their AMX kernels crash 0.3.36 on Q4_K (see above).
DROPPED_VARIANTS = ("sapphirerapids",)
PACKAGE_LIB = "llama_cpp/lib/"


class WheelhouseError(LocalrunError):
    code = "wheelhouse_error"


@dataclass(frozen=True)
class WheelhouseOptions:
    llama_wheel: Path | None = None  # use this llama-cpp-python wheel
    build_portable: bool = False  # build llama-cpp-python with GGML_NATIVE=off
    allow_native: bool = False  # accept a wheel built for this CPU only
    project: Path | None = None  # localrun's source tree (default: the one imported)


def wheel_is_native(wheel: Path) -> bool | None:
    """Whether the wheel was built for this CPU's instruction set, from its ggml-config.cmake:
    ``GGML_NATIVE`` on, or an extension past the portable baseline (AVX-512, AVX-VNNI, AMX) named
    explicitly, as ``scripts/dev setup`` does on an AMX machine. None if the file says nothing."""
    try:
        with zipfile.ZipFile(wheel) as z:
            names = [n for n in z.namelist() if n.endswith(_GGML_CONFIG)]
            text = z.read(names[0]).decode("utf-8", "replace") if names else ""
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelhouseError(f"{wheel}: not a readable wheel ({exc})", hint="give a .whl file pip built") from None
    m = _NATIVE_RE.search(text)
    if m is None:
        return None
    return m.group(1).upper() in _ON or any(v.upper() in _ON for v in _BEYOND_BASELINE_RE.findall(text))


def portable_variants(wheel: Path) -> list[str]:
    """The CPU variants a GGML_BACKEND_DL wheel carries in llama_cpp/lib/ (empty for any other build)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    return sorted(m.group(2) for n in names if n.startswith(PACKAGE_LIB) and (m := _VARIANT_RE.search(n)))


def make_portable(wheel: Path, out: Path) -> Path:
    """Rewrite a freshly built GGML_BACKEND_DL wheel into ``out``: every ``libggml-cpu-*`` module
    moved into llama_cpp/lib/ (ggml installs them to the prefix's bin/, where nothing looks), the
    AMX variant dropped, RECORD rewritten with the new hashes. Refuses a wheel with no variants."""
    import base64
    import csv
    import io

    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as src:
        entries = [(i, src.read(i)) for i in src.infolist() if not i.is_dir()]
    record_name = next(i.filename for i, _ in entries if i.filename.endswith(".dist-info/RECORD"))
    kept: dict[str, tuple[zipfile.ZipInfo, bytes]] = {}
    for info, data in entries:
        name = info.filename
        m = _VARIANT_RE.search(name)
        if m is not None:
            if m.group(2) in DROPPED_VARIANTS:
                continue
            name = PACKAGE_LIB + name.rsplit("/", 1)[-1]
        if name != record_name:
            kept.setdefault(name, (info, data))
    if not any(_VARIANT_RE.search(n) for n in kept):
        raise WheelhouseError(
            f"{wheel.name} has no libggml-cpu-* variants: it was not built with GGML_CPU_ALL_VARIANTS",
            hint="build it with CMAKE_ARGS from PORTABLE_CMAKE_ARGS (bundle export --build-portable-llama)",
        )
    rows = io.StringIO()
    writer = csv.writer(rows, lineterminator="\n")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for name, (info, data) in sorted(kept.items()):
            zi = zipfile.ZipInfo(name, date_time=info.date_time)
            zi.external_attr, zi.compress_type = info.external_attr, zipfile.ZIP_DEFLATED
            dst.writestr(zi, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            writer.writerow([name, f"sha256={digest}", len(data)])
        writer.writerow([record_name, "", ""])
        dst.writestr(record_name, rows.getvalue())
    return target


def portable_wheelhouse(version: str) -> Path:
    """Where the portable wheel of ``version`` is kept, beside scripts/dev's per-backend builds."""
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "localrun" / "wheels" / f"{version}-cpu-portable-{platform.machine()}"


def build_portable_wheel(version: str, work: Path) -> Path:
    """The portable wheel of ``version``: the kept one, else built (no pip cache, ~1 CPU-hour) and kept."""
    kept = portable_wheelhouse(version)
    found = sorted(kept.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        return found[0]
    env = {**os.environ, "CMAKE_ARGS": PORTABLE_CMAKE_ARGS}
    raw = work / "raw"
    _pip(
        [
            "wheel",
            "--no-deps",
            "--no-cache-dir",
            "--no-binary",
            "llama-cpp-python",
            f"llama-cpp-python=={version}",
            "-w",
            str(raw),
        ],
        "building a portable llama-cpp-python (GGML_BACKEND_DL, every CPU variant)",
        env,
        timeout=4 * 3600,  # a dozen CPU backends: over an hour on 2 shared cores
    )
    return make_portable(next(raw.glob("llama_cpp_python-*.whl")), kept)


def _installed_llama_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        raise WheelhouseError(
            "llama-cpp-python is not installed here, so there is no version to carry",
            hint="install localrun[llama] first (scripts/dev setup), or pass --llama-wheel PATH",
        ) from None


def cached_llama_wheels(version: str) -> list[Path]:
    """llama-cpp-python wheels of ``version`` built by earlier installs, newest first: those in
    localrun's own wheelhouse (``scripts/dev setup`` keeps there the builds pip's cache cannot
    tell apart by their flags) and those in pip's wheel cache."""
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True, timeout=60)
    cache = Path(out.stdout.strip() or Path.home() / ".cache" / "pip")
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    pattern = f"llama_cpp_python-{version}-*.whl"
    # Only the wheelhouse's CPU builds: a CUDA or Metal wheel kept there is no wheel for another box.
    ours = [p for p in (Path(xdg) / "localrun" / "wheels").glob(f"*/{pattern}") if "cpu-" in p.parent.name]
    found = [*ours, *(cache / "wheels").rglob(pattern)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _pip(args: list[str], what: str, env: dict[str, str] | None = None, timeout: int = 3600) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    logger.info("%s: %s", what, " ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-8:]
        raise WheelhouseError(
            f"{what} failed (pip exit {run.returncode}): " + " | ".join(tail),
            hint="this step needs the package index (PyPI); run it on a machine that has one",
        )


def choose_llama_wheel(opts: WheelhouseOptions, work: Path) -> tuple[Path, bool]:
    """(the wheel, whether it is native). Refuses a native one unless allowed."""
    if opts.llama_wheel is not None:
        wheel = Path(opts.llama_wheel)
    elif opts.build_portable:
        wheel = build_portable_wheel(_installed_llama_version(), work)
    else:
        version = _installed_llama_version()
        found = cached_llama_wheels(version)
        portable = [w for w in found if wheel_is_native(w) is False]
        portable.sort(key=lambda w: not portable_variants(w))  # the run-time-dispatch build first
        if portable:
            return portable[0], False
        if not found:
            raise WheelhouseError(
                f"no llama-cpp-python {version} wheel in pip's cache or localrun's wheelhouse",
                hint="pass --build-portable-llama (builds one, ~1 CPU-hour once) or --llama-wheel PATH",
            )
        wheel = found[0]
    native = wheel_is_native(wheel)
    if native and not opts.allow_native:
        raise WheelhouseError(
            f"{wheel.name} was built with GGML_NATIVE=ON: it runs only on CPUs with this one's instruction set",
            hint="pass --build-portable-llama (every CPU variant, ~1 CPU-hour once), or --allow-native-llama "
            "when the air-gapped box has the same CPU",
        )
    return wheel, bool(native)


def project_root(opts: WheelhouseOptions) -> Path:
    import localrun

    root = Path(opts.project) if opts.project else Path(localrun.__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or 'name = "localrun"' not in pyproject.read_text():
        raise WheelhouseError(
            f"localrun's source tree is not at {root} (this is not an editable install)",
            hint="make the wheelhouse from a checkout of localrun (scripts/dev setup)",
        )
    return root


def _requirement_name(wheel: Path) -> tuple[str, str]:
    from packaging.utils import parse_wheel_filename

    name, version, _, _ = parse_wheel_filename(wheel.name)
    return str(name), str(version)


def write_requirements(folder: Path) -> Path:
    """``name==version --hash=sha256:…`` for every wheel: pip then installs exactly these bytes."""
    lines = ["# localrun wheelhouse: pip install --no-index --find-links . --require-hashes -r requirements.txt"]
    for wheel in sorted(folder.glob("*.whl")):
        name, version = _requirement_name(wheel)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        spec = f"{name}[{EXTRAS}]" if name == "localrun" else name
        lines.append(f"{spec}=={version} --hash=sha256:{digest}")
    path = folder / REQUIREMENTS
    path.write_text("\n".join(lines) + "\n")
    return path


def platform_info(llama: Path, native: bool) -> dict[str, Any]:
    from packaging import tags

    variants = portable_variants(llama)
    if native:
        note = "built for this CPU only"
    elif variants:
        note = f"GGML_BACKEND_DL: picks the best of {len(variants)} CPU variants at run time ({', '.join(variants)})"
    else:
        note = "GGML_NATIVE=off: any CPU of this architecture with AVX2"

    impl = sys.implementation.name
    return {
        "implementation": impl,
        "python": platform.python_version(),
        "python_tag": f"{tags.interpreter_name()}{tags.interpreter_version()}",
        "platform": sysconfig.get_platform(),
        "machine": platform.machine(),
        "system": platform.system(),
        "libc": "-".join(platform.libc_ver()) or None,
        "tags": [str(t) for t in list(tags.sys_tags())[:5]],
        "llama_cpp_python": {
            "wheel": llama.name,
            "ggml_native": native,
            "note": note,
        },
        "requirements": f"wheels/{REQUIREMENTS}",
        "install": f"pip install --no-index --find-links wheels --require-hashes -r wheels/{REQUIREMENTS}",
    }


def build_wheelhouse(folder: Path, opts: WheelhouseOptions = WheelhouseOptions()) -> dict[str, Any]:
    """Fill ``folder`` with wheels of localrun[llama] and its dependencies; return the lock's ``python``."""
    folder.mkdir(parents=True, exist_ok=True)
    root = project_root(opts)
    with tempfile.TemporaryDirectory(prefix="localrun-wheelhouse-") as tmp:
        llama, native = choose_llama_wheel(opts, Path(tmp))
        shutil.copy2(llama, folder / llama.name)
        # From a clean copy of the tree: an in-tree build/ folder would leak stale modules into the wheel.
        src = Path(tmp) / "localrun-src"
        shutil.copytree(
            root,
            src,
            ignore=shutil.ignore_patterns(
                ".git",
                ".venv*",
                "build",
                "dist",
                "*.egg-info",
                "__pycache__",
                ".pytest_cache",
                "tests",
                "benchmarks",
                "*.gguf",
            ),
        )
        _pip(["wheel", "--no-deps", "-w", str(folder), str(src)], "building the localrun wheel")
        own = next(folder.glob("localrun-*.whl"))
        _, llama_version = _requirement_name(llama)
        # Every dependency as a published wheel (never a local build, which would be native too);
        # llama-cpp-python pinned to the wheel already in the folder.
        _pip(
            [
                "wheel",
                "--only-binary",
                ":all:",
                "--find-links",
                str(folder),
                "-w",
                str(folder),
                f"{own}[{EXTRAS}]",
                f"llama-cpp-python=={llama_version}",
            ],
            "collecting the dependency wheels",
        )
    write_requirements(folder)
    return platform_info(llama, native)
