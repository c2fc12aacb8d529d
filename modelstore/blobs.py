"""Ollama's blobs: content-addressed files a client uploads before ``/api/create``.

Ollama's clients (``ollama create`` with a Modelfile ``FROM ./x.gguf``, ollama-python's
``create_blob`` + ``create(files=…)``) hash a local file, ask ``HEAD /api/blobs/sha256:…`` whether
the server has it, upload it with ``POST`` when it does not, and then name it by digest in
``/api/create``. This module is the store's side of that: a digest is found among the uploads
(``<data_dir>/blobs/sha256-<hex>``) or among the registered models' files, learning the sha256 of
files registered without one (an import records none until ``verify``) the first time it is
asked; an upload is written beside its final name, hashed as it arrives, and kept only when its
bytes are the digest it was sent under.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from localrun.errors import InvalidModelFile, InvalidName, ModelNotFound, VerificationFailed
from localrun.types import Format, ModelRecord

from .store import ModelStore
from .verify import file_path

log = logging.getLogger(__name__)

#: A blob's name: ``sha256:`` (or Ollama's file spelling ``sha256-``) and 64 lowercase hex digits.
DIGEST_PATTERN = r"^sha256[:-][0-9a-fA-F]{64}$"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")


def parse_digest(ref: str) -> str:
    """The hex digest of ``sha256:<hex>`` (or ``sha256-<hex>``, Ollama's file spelling).

    Raises InvalidName for anything else."""
    match = _DIGEST.match(ref.strip().lower())
    if match is None:
        raise InvalidName(
            f"{ref[:80]!r} is not a blob digest",
            hint="name a blob as 'sha256:' followed by the 64 hex digits of its SHA-256",
        )
    return match.group(1)


class BlobStore:
    """Uploaded blobs and the store's files, found by sha256."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.root = store.settings.data_dir / "blobs"

    def path_of_upload(self, digest: str) -> Path:
        return self.root / f"sha256-{digest}"

    def find(self, digest: str) -> Path | None:
        """The file whose bytes have this sha256: an upload, else a registered model's file (the
        sha256 of files registered without one is learned, once, by hashing them)."""
        upload = self.path_of_upload(digest)
        if upload.is_file():
            return upload
        found = self._registered(digest)
        if found is None and self.learn_unknown():
            found = self._registered(digest)
        return found

    def _registered(self, digest: str) -> Path | None:
        for record in self.store.list():
            for entry in record.files:
                if (entry.sha256 or "").lower() == digest:
                    path = file_path(record, entry.path)
                    if path.is_file():
                        return path
        return None

    def learn_unknown(self) -> bool:
        """Hash every registered file with no recorded sha256 (``verify``'s trust on first use);
        True when anything was learned. A model whose files are missing or changed is skipped."""
        pending = [r for r in self.store.list() if any(f.sha256 is None for f in r.files)]
        if not pending:
            return False
        size = sum(f.size for r in pending for f in r.files if f.sha256 is None)
        log.info("hashing %d model(s), %d bytes, to find a blob by its sha256 (once)", len(pending), size)
        learned = False
        for record in pending:
            try:
                self.store.verify(record.name)
                learned = True
            except Exception as exc:  # a missing or changed file: that model cannot hold the blob
                log.info("not hashing %s: %s", record.name, exc)
        return learned

    async def receive(self, digest: str, chunks: AsyncIterator[bytes]) -> Path:
        """Write an upload's bytes as they come; keep them under the digest only when they hash to it.

        Raises VerificationFailed (other bytes than the digest says); whatever ``chunks`` raises
        (a size limit, a deadline, the client leaving) leaves nothing behind."""
        final = self.path_of_upload(digest)
        if final.is_file():
            async for _ in chunks:  # the client sends it anyway: read and drop it
                pass
            return final
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".sha256-{digest}.{uuid.uuid4().hex}.partial"
        hasher, size = hashlib.sha256(), 0
        try:
            with open(partial, "xb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    hasher.update(chunk)
                    out.write(chunk)
            if hasher.hexdigest() != digest:
                raise VerificationFailed(
                    f"the uploaded bytes have sha256 {hasher.hexdigest()}, not {digest}",
                    hint="upload the file again; its digest names what it must contain",
                )
            os.replace(partial, final)
            log.info("received blob sha256:%s (%d bytes)", digest, size)
            return final
        finally:
            partial.unlink(missing_ok=True)

    def record_of(self, digests: list[str], name: str) -> ModelRecord:
        """A new record (not stored) for a model given as blobs: one GGUF model file and, at most,
        its projector. Uploaded blobs are localrun's (``rm`` deletes them when no model uses them);
        registered files found by digest stay their owner's.

        Raises ModelNotFound (a digest the server has not got), InvalidModelFile."""
        from .projector import pair, read_projector

        paths: list[tuple[str, Path]] = []
        for digest in dict.fromkeys(digests):
            path = self.find(digest)
            if path is None:
                raise ModelNotFound(
                    f"the server has no blob sha256:{digest}",
                    hint="upload it first (POST /api/blobs/sha256:<digest>, as `ollama create` and "
                    "ollama-python's create_blob do), or `localrun import PATH` the file on the server",
                )
            paths.append((digest, path))
        projectors, models = [], []
        for digest, path in paths:
            try:
                projectors.append((digest, path, read_projector(path)))
            except InvalidModelFile:
                models.append((digest, path))
        if len(models) != 1 or len(projectors) > 1:
            raise InvalidModelFile(
                f"the files are {len(models)} model file(s) and {len(projectors)} projector(s); "
                "a model is one GGUF file, with at most one mmproj",
                hint="name the model's .gguf (and its mmproj, for images) in 'files'",
            )
        digest, path = models[0]
        owned = path.parent == self.root
        record = self.store.inspect_path(path, name=name, fmt=Format.GGUF)
        entries = tuple(
            dataclasses.replace(e, sha256=digest, mtime_ns=os.stat(path).st_mtime_ns) if Path(e.path) == path else e
            for e in record.files
        )
        record = dataclasses.replace(record, files=entries, owned=owned)
        for p_digest, p_path, info in projectors:
            record = pair(record, p_path, owned=p_path.parent == self.root, sha256=p_digest, info=info)
        return record
