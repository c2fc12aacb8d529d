"""The model store: names, GGUF validation, the SQLite index and the store that ties them.

Import the pieces from their modules (``localrun.modelstore.store.ModelStore``,
``localrun.modelstore.gguf_meta.read_gguf_metadata`` …); this package does no I/O and
imports nothing heavy at import time.
"""
