"""The ids the Hugging Face hub speaks in: git blob oids, LFS pointers, synthetic repos and commits.

Bundles (:mod:`.bundle`) write these ids into their lock and the mirror's catalog
(:mod:`.hub_catalog`) serves them, and both must agree byte for byte with the hub and with each
other: a model exported into a bundle and one served by a mirror get the same repo and commit.
So they are computed here once.

Git oids follow the hub: a small file's oid is the sha1 of its git blob; a large (LFS) file's
oid is the sha1 of its LFS pointer text, and its blob in the HF cache is named by its sha256.
Models that never had a repo (imported from a path, Ollama, LM Studio, the built-in ones) get
a synthetic repo ``local/<name>`` and a commit derived from their files, so exporting or serving
the same model twice gives the same ids.
"""

from __future__ import annotations

import hashlib
import logging
import re

from localrun.modelstore.refs import validate_repo_id

logger = logging.getLogger(__name__)

#: The namespace of repos localrun makes up for models that have none.
SYNTHETIC_ORG = "local"
#: Files the hub keeps in LFS whatever their size (its default .gitattributes), and the size
#: above which it always does; used only for synthetic repos, which have no hub to ask.
LFS_SUFFIXES = (
    ".gguf",
    ".safetensors",
    ".bin",
    ".pt",
    ".pth",
    ".npz",
    ".npy",
    ".onnx",
    ".msgpack",
    ".h5",
    ".model",
    ".params",
)
LFS_THRESHOLD = 10 * 1024 * 1024

_SHA1_RE = re.compile(r"^[0-9a-f]{40}$")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def is_sha1(text: str) -> bool:
    """40 lower-case hex digits: a git oid or a commit (the hub never sends upper case)."""
    return bool(_SHA1_RE.match(text))


def is_sha256(text: str) -> bool:
    """64 lower-case hex digits: an LFS oid, which names a large file's blob in the HF cache."""
    return bool(_SHA256_RE.match(text))


def git_blob_hasher(size: int) -> hashlib._Hash:
    """A sha1 already fed git's blob header, so a file of ``size`` bytes can be streamed into it."""
    return hashlib.sha1(b"blob %d\0" % size)


def git_blob_oid(data: bytes) -> str:
    """The oid git gives ``data`` as a blob (what the hub's tree lists for a small file)."""
    h = git_blob_hasher(len(data))
    h.update(data)
    return h.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer text git-lfs commits in place of a large file (what the hub's tree oid hashes)."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def lfs_git_oid(sha256: str, size: int) -> str:
    """The tree oid of an LFS file: its pointer's blob oid, not the file's."""
    return git_blob_oid(lfs_pointer(sha256, size))


def is_lfs_path(path: str, size: int) -> bool:
    """Whether the hub would keep this file in LFS; asked only for repos no hub ever saw."""
    return size >= LFS_THRESHOLD or path.lower().endswith(LFS_SUFFIXES)


def synthetic_repo(name: str) -> str:
    """``local/<name>`` with the name made a valid repo segment; stable for a given name."""
    seg = re.sub(r"[^a-z0-9._-]+", "_", name.lower())
    seg = re.sub(r"-{2,}", "-", re.sub(r"\.{2,}", ".", seg)).strip("._-")[:96] or "model"
    return validate_repo_id(f"{SYNTHETIC_ORG}/{seg}")


def synthetic_commit(repo: str, files: list[tuple[str, str]]) -> str:
    """A 40-hex commit for a repo that has none: a digest of its (path, sha256) pairs."""
    h = hashlib.sha1(f"localrun-bundle\0{repo}\0".encode())
    for path, sha in sorted(files):
        h.update(f"{path}\0{sha}\0".encode())
    return h.hexdigest()
