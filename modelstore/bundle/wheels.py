"""The wheelhouse a bundle carries (``--with-wheels``): localrun and every dependency as wheels
for this platform, and a requirements file of exact versions with sha256 hashes, so that on
a box with no package index ``pip install --no-index --find-links wheels -r
wheels/requirements.txt`` installs localrun without a single network request or build.

llama-cpp-python is the hard part: PyPI ships only its sdist, so the wheel must be built
here. A default build compiles ggml with ``-march=native`` and may die with SIGILL on an
older CPU; a portable one is built with ``GGML_NATIVE=off`` (baseline x86-64 plus AVX2/FMA,
as the project's own release wheels). The wheel records how it was built in
``lib/cmake/ggml/ggml-config.cmake``; that is read, never guessed. pip's cache holds the
wheel ``scripts/dev setup`` built, which is native: it is used only when asked
(``allow_native``), and a portable build (~15 CPU-minutes) only when asked
(``build_portable``), because both are choices about other people's CPUs.
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
    "-DGGML_NATIVE=off -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF "
    "-DLLAMA_BUILD_SERVER=OFF"
)


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
    found = [*(Path(xdg) / "localrun" / "wheels").glob(f"*/{pattern}"), *(cache / "wheels").rglob(pattern)]
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)


def _pip(args: list[str], what: str, env: dict | None = None) -> None:
    cmd = [sys.executable, "-m", "pip", *args]
    logger.info("%s: %s", what, " ".join(cmd))
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if run.returncode != 0:
        tail = (run.stderr or run.stdout).strip().splitlines()[-8:]
        raise WheelhouseError(
            f"{what} failed (pip exit {run.returncode}): " + " | ".join(tail),
            hint="this step needs the package index (PyPI); run it on a machine that has one",
        )


def choose_llama_wheel(opts: WheelhouseOptions, work: Path) -> tuple[Path, bool]:
    """(the wheel, whether it is native). Refuses a native one unless allowed."""
    version = _installed_llama_version() if opts.llama_wheel is None else None
    if opts.llama_wheel is not None:
        wheel = Path(opts.llama_wheel)
    elif opts.build_portable:
        env = {**os.environ, "CMAKE_ARGS": PORTABLE_CMAKE_ARGS}
        _pip(
            [
                "wheel",
                "--no-deps",
                "--no-cache-dir",
                "--no-binary",
                "llama-cpp-python",
                f"llama-cpp-python=={version}",
                "-w",
                str(work),
            ],
            "building a portable llama-cpp-python (GGML_NATIVE=off)",
            env,
        )
        wheel = next(work.glob("llama_cpp_python-*.whl"))
    else:
        found = cached_llama_wheels(version)
        portable = [w for w in found if wheel_is_native(w) is False]
        if portable:
            return portable[0], False
        if not found:
            raise WheelhouseError(
                f"no llama-cpp-python {version} wheel in pip's cache or localrun's wheelhouse",
                hint="pass --build-portable-llama (builds one, ~15 CPU-minutes) or --llama-wheel PATH",
            )
        wheel = found[0]
    native = wheel_is_native(wheel)
    if native and not opts.allow_native:
        raise WheelhouseError(
            f"{wheel.name} was built with GGML_NATIVE=ON: it runs only on CPUs with this one's instruction set",
            hint="pass --build-portable-llama (GGML_NATIVE=off, ~15 CPU-minutes), or --allow-native-llama "
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


def platform_info(llama: Path, native: bool) -> dict:
    from packaging import tags

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
            "note": "built for this CPU only" if native else "GGML_NATIVE=off: any CPU of this architecture with AVX2",
        },
        "requirements": f"wheels/{REQUIREMENTS}",
        "install": f"pip install --no-index --find-links wheels --require-hashes -r wheels/{REQUIREMENTS}",
    }


def build_wheelhouse(folder: Path, opts: WheelhouseOptions = WheelhouseOptions()) -> dict:
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
