"""A model on the hub described without downloading it: sizes from the listing, the GGUF header
by HTTP range requests (a few MB of a multi-GB file), so ``localrun plan ORG/REPO`` can say
whether it fits before ``pull``.

The hub is whatever :func:`~localrun.modelstore.hub.hub_endpoint` names (``hub.endpoint``,
``HF_ENDPOINT``, a ``localrun mirror``); every request runs under the hub's deadlines. The
record it returns is transient (never registered): its files are the hub's URLs, its
metadata the header's, and ``metadata["remote"]`` says where it was read.
"""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from localrun.errors import DownloadFailed, InvalidModelFile
from localrun.types import FileEntry, Format, ModelRecord, Source

from .gguf_meta import read_gguf_header
from .hub import HubClient
from .hub_http import after_headers, timeout_error
from .names import split_shard_name

if TYPE_CHECKING:
    import httpx

    from localrun.settings import Settings

    from .hub_http import Deadlines
    from .pull import PullPlan

logger = logging.getLogger(__name__)

#: Bytes one range request asks for; the header walker reads 1 MiB at a time.
RANGE_CHUNK = 1 << 20
#: The most of one file the header may take: a header bigger than this is not read from afar.
MAX_HEADER_BYTES = 64 << 20


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of one hub file, each read one ``Range`` request."""

    def __init__(self, http: httpx.Client, url: str, size: int, *, endpoint: str, deadlines: Deadlines) -> None:
        super().__init__()
        self.http, self.url, self.size = http, url, size
        self.endpoint, self.deadlines = endpoint, deadlines
        self.pos = 0
        self.fetched = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        import httpx

        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        if self.fetched + (end - self.pos) > MAX_HEADER_BYTES:
            raise InvalidModelFile(
                f"{self.url}: the header is over {MAX_HEADER_BYTES >> 20} MiB; not read from the hub",
                hint="pull the model, then plan it",
            )
        got_headers = False
        try:
            with self.http.stream("GET", self.url, headers={"Range": f"bytes={self.pos}-{end - 1}"}) as resp:
                got_headers = True
                after_headers(resp, self.deadlines)
                if resp.status_code != 206:
                    raise DownloadFailed(
                        f"the hub at {self.endpoint} answered {resp.status_code} to a range request for {self.url}",
                        hint="a hub or mirror that does not serve byte ranges cannot be planned from; pull the model",
                    )
                data = b"".join(resp.iter_bytes())[: end - self.pos]
        except httpx.TimeoutException as exc:
            raise timeout_error(exc, self.endpoint, self.deadlines, body=got_headers) from exc
        except httpx.TransportError as exc:
            raise DownloadFailed(
                f"cannot reach the hub at {self.endpoint}: {exc or type(exc).__name__}",
                hint="connect to the network or point HF_ENDPOINT at a mirror",
            ) from exc
        self.pos += len(data)
        self.fetched += len(data)
        return data


def hub_record(ref: str, settings: Settings | None = None) -> ModelRecord:
    """What ``ref`` (``org/repo``, ``:QUANT``, ``/file.gguf``) would be once pulled, read from the hub.

    Raises:
        InvalidName: ``ref`` is no hub reference.
        ModelNotFound: no such repo, or nothing in it that runs.
        DownloadFailed: the hub could not be reached (the message says "offline" when so).
        InvalidModelFile: the header the hub sent is not a GGUF model's.
    """
    from .pull import plan_pull

    started = time.monotonic()
    client = HubClient(settings=settings)
    plan = plan_pull(ref, settings=settings, hub=client)
    files = tuple(FileEntry(client.file_url(plan.repo, plan.commit, f.path), f.size, f.sha256) for f in plan.files)
    meta: dict[str, Any] = {"quant": plan.quant}
    fetched = 0
    if plan.format is Format.GGUF:
        header, fetched = _gguf_meta(plan, client)
        meta = {**header, "quant": plan.quant or header.get("quant")}
    primary = next((f for f in files if f.path.endswith("/" + plan.primary)), files[0]) if plan.primary else None
    meta["remote"] = {
        "endpoint": client.endpoint,
        "repo": plan.repo,
        "commit": plan.commit,
        "header_bytes": fetched,
        "seconds": round(time.monotonic() - started, 2),
    }
    logger.info("read %s@%s from %s: %d header bytes", plan.repo, plan.commit[:10], client.endpoint, fetched)
    return ModelRecord(
        name=plan.name,
        format=plan.format,
        path=primary.path if primary else client.file_url(plan.repo, plan.commit, ""),
        files=files,  # the projector's too: its weights are memory the plan counts
        source=Source.HUB,
        owned=False,
        repo=plan.repo,
        revision=plan.commit,
        metadata=meta,
    )


def _gguf_meta(plan: PullPlan, client: HubClient) -> tuple[dict[str, Any], int]:
    """The model's header as the store records it (every shard's tensors counted), and the bytes it took."""
    shards = [plan.primary]
    split = split_shard_name(PurePosixPath(plan.primary).name)
    if split:
        shards = [f.path for f in plan.files if f.path != plan.projector and f.path.endswith(".gguf")]
    infos, fetched = [], 0
    with client.deadlines.client(headers=client.auth_headers()) as http:
        for path in shards:
            size = next(f.size for f in plan.files if f.path == path)
            url = client.file_url(plan.repo, plan.commit, path)
            reader = RangeFile(http, url, size, endpoint=client.endpoint, deadlines=client.deadlines)
            infos.append(read_gguf_header(cast("BinaryIO", reader), size, Path(plan.repo, path)))
            fetched += reader.fetched
    meta = infos[0].as_dict()
    meta.update(
        n_params=sum(i.n_params for i in infos),
        size_bytes=sum(i.size_bytes for i in infos),
        tensor_count=sum(i.tensor_count for i in infos),
        shards=len(infos),
    )
    return meta, fetched
