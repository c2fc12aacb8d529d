"""What host B runs against the mirror, as a child process with B's own environment.

``python -m tests.mirror.client_b hf REPO [REPO…]`` uses the real huggingface_hub with
only ``HF_ENDPOINT`` (and ``HF_TOKEN``) set: snapshot_download, hf_hub_download,
model_info, list_repo_files, list_repo_tree, list_repo_refs, list_models(search) and
scan_cache_dir, and prints one JSON object: what each call saw, and the sha256 of every
downloaded file, so the test can compare bytes with host A's.
"""

from __future__ import annotations

import hashlib
import json
import sys


def _sha(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def hf(repos: list[str]) -> dict:
    from pathlib import Path

    from huggingface_hub import HfApi, hf_hub_download, scan_cache_dir, snapshot_download

    api = HfApi()
    out: dict = {"repos": {}}
    for repo in repos:
        info = api.model_info(repo, files_metadata=True)
        snap = Path(snapshot_download(repo))
        files = {p.relative_to(snap).as_posix(): _sha(p) for p in sorted(snap.rglob("*")) if p.is_file()}
        first = sorted(files)[0]
        single = hf_hub_download(repo, first, revision=info.sha)
        tree = [
            {
                "path": e.path,
                "oid": e.blob_id,
                "size": getattr(e, "size", None),
                "lfs": e.lfs.sha256 if getattr(e, "lfs", None) else None,
            }
            for e in api.list_repo_tree(repo, recursive=True)
        ]
        refs = api.list_repo_refs(repo)
        out["repos"][repo] = {
            "sha": info.sha,
            "siblings": sorted(s.rfilename for s in info.siblings),
            "files": files,
            "single": [first, _sha(single)],
            "list_repo_files": sorted(api.list_repo_files(repo)),
            "tree": tree,
            "branches": {b.name: b.target_commit for b in refs.branches},
        }
    out["search"] = {q: sorted(m.id for m in api.list_models(search=q)) for q in ("tiny", "nothing-like-this")}
    cache = scan_cache_dir()
    out["cache"] = {r.repo_id: sorted(f.file_name for rev in r.revisions for f in rev.files) for r in cache.repos}
    return out


if __name__ == "__main__":
    if sys.argv[1] == "hf":
        print(json.dumps(hf(sys.argv[2:])))
    else:
        raise SystemExit(f"unknown action {sys.argv[1]!r}")
