"""Models other tools already downloaded, found in place and never copied or touched.

One module per store source, each with its ``SOURCE`` entry; :data:`SOURCES` is the
registry the discovery loops over (facts about each store in shared/reference/ecosystem.md
§1.2, §3.1–3.2, §4):

* ``hf-cache`` (:mod:`.hf_cache`) — the Hugging Face cache (llama.cpp ``-hf`` downloads too);
* ``ollama`` (:mod:`.ollama`) — Ollama's manifests and blobs;
* ``lmstudio`` (:mod:`.lmstudio`) — LM Studio's models folder.

Each source returns :class:`ModelRecord` candidates with ``owned=False`` (localrun must never
delete them) and skips, with a log line, anything malformed. To add a store: a module here
that defines its ``discover`` and ``SOURCE``, an entry in :data:`SOURCES`, a
:class:`~localrun.types.Source` value for its records.
"""

from __future__ import annotations

from localrun.types import ModelRecord

from . import hf_cache, lmstudio, ollama
from .common import StoreSource

#: Every store source by name, in the order `localrun ls --all` lists them.
SOURCES: dict[str, StoreSource] = {
    "hf-cache": hf_cache.SOURCE,
    "ollama": ollama.SOURCE,
    "lmstudio": lmstudio.SOURCE,
}


def discover_all(settings: object = None, *, read_metadata: bool = True) -> list[ModelRecord]:
    """Every candidate from every source in :data:`SOURCES`, in its order.

    ``settings`` is accepted like every store entry point takes it; each location comes
    from the environment the tool itself reads (HF_HUB_CACHE/HF_HOME, OLLAMA_MODELS, LM
    Studio's home pointer), so localrun finds exactly what those tools use.
    """
    return [record for source in SOURCES.values() for record in source.discover(read_metadata=read_metadata)]


__all__ = ["SOURCES", "StoreSource", "discover_all"]
