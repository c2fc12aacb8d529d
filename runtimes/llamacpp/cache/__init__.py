"""What a llama.cpp context keeps between requests: its slots and the prefix cache over them.

* :mod:`.prefix`, :mod:`.radix` — the prefix cache (which slot gets a request, what it reuses)
  and the radix index of what each slot and saved state holds.
* :mod:`.slots` — the layout of parallel sequences and the KV operations on them.
* :mod:`.checkpoints` — states saved along a prompt where the memory cannot be cut back.
* :mod:`.state_memory` — memory made ready for the states an idle slot would leave with.
* :mod:`.prefix_disk`, :mod:`.kv_disk`, :mod:`.kv_root`, :mod:`.kv_file` — the disk tier under
  host RAM: the cache's side, the store, its folder, and the file format.
"""
