"""Reading a bundle, folder or tar, as a stream of entries the lock expects.

The lock is read first and validated whole (:mod:`.lock`); then every entry of the
bundle is checked against it before anyone reads a byte of content: its name (relative,
inside, no ``..``), its kind (regular file, or a snapshot symlink whose text is exactly
the link the lock implies), that it is expected and seen once, and that its size matches.
A tar is read in one forward pass, so a bundle streamed from a pipe or a slow disk is
read once; a truncated one is named as such.

``.localrun-seal.json`` (folders only) lets this machine skip re-hashing bytes it hashed
at export: it records each blob's (device, inode, size, mtime, ctime) right after the
exporter wrote and hashed it. The same inode, unchanged, is the same bytes; a bundle copied
from anywhere else has other inodes and is hashed in full. The ctime is what makes the
shortcut safe: mtime can be put back with ``utime`` (``cp -p``, ``rsync -t`` or a tamper
do it), but the kernel sets ctime to "now" on every write, ``utime``, ``chmod`` or link,
and no unprivileged call sets it back. A file rewritten in place with its mtime restored
therefore no longer matches its seal and is hashed (and refused). Anything that touches
the inode, a hard link included, costs a re-hash, never a wrong byte. Hashing always was
measured and rejected: about 0.46 s for the 253 MB Gemma file on a 2-core machine
(~550 MB/s, warm page cache), so minutes for a 70 GB model that the seal imports at once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, Protocol, cast

from localrun.errors import InvalidName
from localrun.jsonfile import NotAJsonObject, NotARegularFile, read_json_object, read_regular
from localrun.modelstore.bundle.lock import (
    HUB_DIR,
    LOCK_NAME,
    MAX_LOCK_BYTES,
    WHEELS_DIR,
    BundleError,
    Lock,
    LockFile,
    parse_lock,
)
from localrun.modelstore.download import FileDigest
from localrun.modelstore.hub import RemoteFile
from localrun.modelstore.names import safe_relpath

logger = logging.getLogger(__name__)

SEAL_NAME = ".localrun-seal.json"
BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Item:
    """One content file of a bundle: a model blob or a wheelhouse file."""

    relpath: str
    size: int
    sha256: str
    git_oid: str | None  # set for non-LFS model files: their blob is named by it
    file: LockFile | None = None  # None for wheelhouse files

    def digest(self) -> FileDigest:
        """A running hash that checks the git oid (small files) or sha256 (LFS, wheels)."""
        return FileDigest(RemoteFile(self.relpath, self.size, None if self.git_oid else self.sha256, self.git_oid))

    def problem(self, digest: FileDigest, size: int) -> str | None:
        if size != self.size:
            return f"{size} bytes, the lock says {self.size}"
        if digest.sha256.hexdigest() != self.sha256:
            return f"sha256 {digest.sha256.hexdigest()}, the lock says {self.sha256}"
        return digest.mismatch()


#: A commit reference (``refs/main``) is 40 hex digits and a newline; anything past this is not one.
_MAX_REF_BYTES = 200


def stat_key(st: os.stat_result) -> list[int]:
    """What identifies a file's bytes without reading them: the inode, unchanged since (ctime
    included, which no unprivileged call can put back). A seal or journal entry written with
    an older, shorter key never matches, so such a file is hashed."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def expected_items(lock: Lock) -> dict[str, Item]:
    items = {rel: Item(rel, f.size, f.sha256, None if f.lfs else f.git_oid, f) for rel, (_, f) in lock.blobs().items()}
    items.update({w.path: Item(w.path, w.size, w.sha256, None) for w in lock.wheels})
    return items


class Readable(Protocol):
    """What a bundle entry's bytes are read through: a file, a tar member, a pread window."""

    def read(self, n: int = -1, /) -> bytes: ...


def hash_stream(stream: Readable, item: Item, sink: BinaryIO | None = None) -> str | None:
    """Read ``stream`` to its end (writing it to ``sink``); the mismatch with the lock, if any."""
    digest, done = item.digest(), 0
    while block := stream.read(BLOCK):
        digest.update(block)
        done += len(block)
        if sink is not None:
            sink.write(block)
    return item.problem(digest, done)


class _Bundle:
    """What a folder and a tar bundle share: the lock, the items it expects, the checks."""

    kind = ""

    def __init__(self, location: Path) -> None:
        self.location = location
        self.lock: Lock
        self.lock_bytes = b""

    def _load_lock(self, data: bytes) -> None:
        self.lock_bytes = data
        self.lock = parse_lock(data, where=f"{self.location}/{LOCK_NAME}")
        self.expected = expected_items(self.lock)
        self.links = self.lock.links()
        self.refs = self.lock.refs()

    def error(
        self, rel: str, problem: str, hint: str = "the bundle is damaged or was altered; export it again"
    ) -> BundleError:
        return BundleError(f"bundle {self.location}: {rel}: {problem}", hint=hint)

    def _check_link(self, rel: str, text: str) -> None:
        expected = self.links.get(rel)
        if expected is None or text != expected:
            if text.startswith("/") or os.path.normpath(os.path.join(os.path.dirname(rel), text)).startswith(".."):
                raise self.error(
                    rel, f"a symlink pointing out of the bundle ({text[:120]!r})", hint="do not import this bundle"
                )
            raise self.error(
                rel,
                f"a symlink to {text[:120]!r}, the lock expects " + (repr(expected) if expected else "no link here"),
            )

    def _check_ref(self, rel: str, data: bytes) -> None:
        if data.strip().decode("ascii", "replace") != self.refs[rel]:
            raise self.error(rel, f"names commit {data.strip()[:60]!r}, the lock says {self.refs[rel]}")

    def _name(self, raw: str) -> str:
        try:
            return str(safe_relpath(raw.rstrip("/") if raw.endswith("/") else raw))
        except InvalidName as exc:
            raise self.error(
                raw[:120], f"an unsafe entry name ({exc.message})", hint="do not import this bundle"
            ) from None

    def _missing(self, seen: set[str], also: tuple[str, ...] = ()) -> None:
        missing = [rel for rel in (*self.expected, *also) if rel not in seen]
        if missing:
            raise self.error(
                missing[0],
                f"the lock names it but the bundle lacks it ({len(missing)} file(s) missing)",
                hint="copy the whole bundle again",
            )


class DirBundle(_Bundle):
    """A bundle folder. :meth:`check` walks it once without following links."""

    kind = "dir"

    def __init__(self, location: Path) -> None:
        super().__init__(location)
        lock_path = location / LOCK_NAME
        if lock_path.is_symlink() or not lock_path.is_file():
            raise BundleError(f"{location}: no {LOCK_NAME} here", hint="give the folder `localrun bundle export` wrote")
        try:  # bounded before it is read: a lock claiming gigabytes is refused, not loaded
            data = read_regular(lock_path, max_bytes=MAX_LOCK_BYTES, follow_symlinks=False)
        except OSError as exc:
            raise BundleError(
                f"{location}: its {LOCK_NAME} cannot be read ({exc})",
                hint="give the folder `localrun bundle export` wrote",
            ) from None
        self._load_lock(data)
        self.seal = self._read_seal()

    def _read_seal(self) -> dict[str, list[int]]:
        try:
            doc = read_json_object(self.location / SEAL_NAME)
        except NotAJsonObject:
            return {}
        if doc.get("lock_sha256") != hashlib.sha256(self.lock_bytes).hexdigest():
            return {}
        files = doc.get("files")
        return files if isinstance(files, dict) else {}

    def path_of(self, item: Item) -> Path:
        return self.location.joinpath(*item.relpath.split("/"))

    def sealed(self, item: Item, path: Path) -> bool:
        """True when this file is the very inode the exporter hashed, untouched since."""
        want = self.seal.get(item.relpath)
        return bool(want) and stat_key(os.stat(path)) == want

    def check(self) -> None:
        """Every entry under hub/ and wheels/ expected, every expected file present with its size."""
        seen: set[str] = set()
        for top in (HUB_DIR, WHEELS_DIR):
            root = self.location / top
            if root.is_symlink():
                raise self.error(top, "a symlink where a folder belongs", hint="do not import this bundle")
            for dirpath, dirnames, filenames in os.walk(root):
                for name in dirnames + filenames:
                    full = Path(dirpath, name)
                    rel = self._name(full.relative_to(self.location).as_posix())
                    if full.is_symlink():
                        self._check_link(rel, os.readlink(full))
                        if name in dirnames:
                            dirnames.remove(name)
                    elif name in filenames:
                        self._check_file(rel, full)
                        seen.add(rel)
        self._missing(seen)

    def _check_file(self, rel: str, full: Path) -> None:
        st = full.lstat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block whoever reads it; a device never ends
            raise self.error(rel, "not a regular file (a FIFO, device or socket)", hint="do not import this bundle")
        if rel in self.refs:
            try:
                data = read_regular(full, max_bytes=_MAX_REF_BYTES, follow_symlinks=False)
            except NotARegularFile as exc:
                raise self.error(rel, f"not a commit reference ({exc.why})", hint="copy the bundle again") from None
            self._check_ref(rel, data)
            return
        item = self.expected.get(rel)
        if item is None:
            raise self.error(rel, "a file the lock does not name", hint="remove it, or export the bundle again")
        size = st.st_size
        if size != item.size:
            raise self.error(rel, f"{size} bytes, the lock says {item.size} (truncated or altered)")

    def close(self) -> None:
        pass


class _TarStream:
    """A member's bytes; a tar that ends early becomes a BundleError naming the member."""

    def __init__(self, raw: IO[bytes], bundle: TarBundle, rel: str) -> None:
        self.raw, self.bundle, self.rel = raw, bundle, rel

    def read(self, n: int = -1) -> bytes:
        try:
            return self.raw.read(n)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise self.bundle.error(
                self.rel, f"the tar is truncated or damaged here ({exc})", hint="copy the tar again"
            ) from None


class _RawMember:
    """A plain member's bytes read straight from the tar file with pread: no copy through
    tarfile's buffers (which cost more than the sha256). Short reads mean a cut tar."""

    def __init__(self, fd: int, start: int, size: int, bundle: TarBundle, rel: str) -> None:
        self.fd, self.pos, self.left, self.bundle, self.rel = fd, start, size, bundle, rel

    def read(self, n: int = -1) -> bytes:
        want = self.left if n is None or n < 0 else min(n, self.left)
        if want <= 0:
            return b""
        data = os.pread(self.fd, want, self.pos)
        if not data:
            raise self.bundle.error(
                self.rel, f"the tar is truncated here ({self.left} bytes missing)", hint="copy the tar again"
            )
        self.pos += len(data)
        self.left -= len(data)
        return data


class TarBundle(_Bundle):
    """A bundle tar, read forward once: the lock must be its first entry."""

    kind = "tar"

    def __init__(self, location: Path) -> None:
        super().__init__(location)
        try:
            # Random-access mode, read forward once: members are read straight from the file
            # (stream mode would copy them through a 10 KiB buffer).
            self.tar = tarfile.open(location, "r:")
            self.fd = cast(BinaryIO, self.tar.fileobj).fileno()
            first = self.tar.next()
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise BundleError(
                f"{location}: not a readable tar ({exc})", hint="give a tar `localrun bundle export -o X.tar` wrote"
            ) from None
        if first is None or first.name != LOCK_NAME or not first.isreg():
            raise BundleError(
                f"{location}: its first entry is {first.name[:120]!r} , not {LOCK_NAME}"
                if first
                else f"{location}: an empty tar",
                hint="give a tar `localrun bundle export -o X.tar` wrote",
            )
        if first.size > MAX_LOCK_BYTES:  # checked before a byte is read: a sparse tar may claim anything
            raise self.error(
                LOCK_NAME, f"{first.size:,} bytes, more than a lock may be ({MAX_LOCK_BYTES:,})", hint="not a bundle"
            )
        raw = self.tar.extractfile(first)
        data = _TarStream(raw, self, LOCK_NAME).read(first.size + 1) if raw else b""
        if len(data) != first.size:
            raise self.error(LOCK_NAME, "the tar is truncated inside the lock", hint="copy the tar again")
        self._load_lock(data)

    def items(self) -> Iterator[tuple[Item, Readable]]:
        """Each expected content file once, with a stream of its bytes; everything else checked and skipped."""
        seen: set[str] = set()
        names: set[str] = set()
        while True:
            try:
                member = self.tar.next()
            except (tarfile.TarError, EOFError, OSError) as exc:
                raise self.error(
                    f"after {len(names)} entries", f"the tar is truncated or damaged ({exc})", hint="copy the tar again"
                ) from None
            if member is None:
                break
            rel = self._name(member.name)
            if rel in names or rel == LOCK_NAME:
                raise self.error(rel, "duplicate entry in the tar", hint="do not import this bundle")
            names.add(rel)
            if member.isdir():
                continue
            if member.issym():
                self._check_link(rel, member.linkname)
                seen.add(rel)
                continue
            if not member.isreg():
                raise self.error(
                    rel,
                    "an entry that is not a file, folder or snapshot symlink (hard link, device, fifo)",
                    hint="do not import this bundle",
                )
            yield from self._member(rel, member, seen)
        # The exporter writes every link and ref too: one missing means the tar was cut short
        # (tarfile treats a tar that ends between entries as complete).
        self._missing(seen, (*self.links, *self.refs))

    def _member(self, rel: str, member: tarfile.TarInfo, seen: set[str]) -> Iterator[tuple[Item, Readable]]:
        stream: Readable
        if member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.sparse:
            stream = _RawMember(self.fd, member.offset_data, member.size, self, rel)
        else:
            raw = self.tar.extractfile(member)
            if raw is None:
                raise self.error(rel, "a file entry tarfile cannot read", hint="do not import this bundle")
            stream = _TarStream(raw, self, rel)
        if rel in self.refs:
            self._check_ref(rel, stream.read(200))
            seen.add(rel)
            return
        item = self.expected.get(rel)
        if item is None:
            raise self.error(rel, "a file the lock does not name", hint="do not import this bundle")
        if member.size != item.size:
            raise self.error(rel, f"{member.size} bytes, the lock says {item.size}")
        seen.add(rel)
        yield item, stream

    def close(self) -> None:
        self.tar.close()


def open_bundle(path: str | Path) -> DirBundle | TarBundle:
    """A folder bundle or a tar bundle; BundleError when it is neither."""
    p = Path(path).expanduser()
    if p.is_dir():
        return DirBundle(p)
    if p.is_file():
        return TarBundle(p)
    raise BundleError(
        f"{p}: no such bundle (neither a folder nor a tar)", hint="give the path `localrun bundle export -o` wrote"
    )
