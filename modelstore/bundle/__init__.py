"""Model bundles: models carried to an air-gapped machine as files plus a lock of their hashes.

The parts, each imported from its own module (this package re-exports nothing):

* :mod:`.lock` — ``localrun.lock.json``, the contract a bundle carries, parsed strictly into
  types that cannot hold a bad name or path.
* :mod:`.source` — reading a bundle, a folder or one tar, item by item, hashed as it streams.
* :mod:`.export` — ``localrun bundle export``: registered models into a bundle and its lock.
* :mod:`.importer` — ``localrun bundle import`` / ``verify``: a bundle into the HF cache,
  every byte checked against the lock, then registered through ``ModelStore.register``.
* :mod:`.wheels` — the wheelhouse a bundle may carry so localrun itself installs offline.

The ids in a lock (git oids, LFS pointers, synthetic repos) come from
:mod:`localrun.modelstore.gitids`, which the mirror's catalog shares.
"""
