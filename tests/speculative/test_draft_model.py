"""Draft models (runtimes/llamacpp/speculative/draft_model.py): real llama.cpp on tiny GGUF pairs that
share a vocabulary, checked against the draft's own greedy continuation computed one token
at a time in a plain context of its own; mismatched pairs and non-models refused; and the
sibling finder's rules on made-up repo listings."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from localrun.errors import ConfigError, InvalidModelFile, ModelNotFound
from localrun.modelstore.refs import HubRef, find_draft_file, find_draft_sibling, quant_bits, select_files
from localrun.runtimes.llamacpp.decode import fill_batch
from localrun.runtimes.llamacpp.speculative.draft_model import DraftModel, VocabFacts, vocab_difference
from tests.factories import write_tiny_llama_gguf

pytest.importorskip("llama_cpp")

SMALL = dict(n_layer=1, n_ff=96)  # one layer of 64: its next token still depends on the context
PROMPTS = [[1, 300, 301, 302, 280], [1, 400, 290, 17], [1, 5, 6, 7, 8, 9, 10, 11, 12], [1, 333]]


@pytest.fixture(scope="module")
def llama():
    from localrun.runtimes.llamacpp.context import llama_lib

    return llama_lib()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("drafts")
    target = write_tiny_llama_gguf(root / "target.gguf", seed=1)
    out = {"target": target, "draft": write_tiny_llama_gguf(root / "draft.gguf", seed=2, **SMALL)}
    out["copy"] = shutil.copy(target, root / "copy.gguf")
    out["plus128"] = write_tiny_llama_gguf(root / "plus128.gguf", seed=3, extra_tokens=_extras(128), **SMALL)
    out["plus129"] = write_tiny_llama_gguf(root / "plus129.gguf", seed=3, extra_tokens=_extras(129), **SMALL)
    # The same size as the target but one token's text differs: the target's extra is <|x|>.
    out["target_x"] = write_tiny_llama_gguf(root / "target_x.gguf", seed=1, extra_tokens=("<|x|>",))
    out["draft_y"] = write_tiny_llama_gguf(root / "draft_y.gguf", seed=2, extra_tokens=("<|y|>",), **SMALL)
    out["bos3"] = _edited(
        write_tiny_llama_gguf(root / "bos3.gguf", seed=2, **SMALL), {"tokenizer.ggml.bos_token_id": 3}
    )
    out["add_eos"] = _edited(
        write_tiny_llama_gguf(root / "add_eos.gguf", seed=2, **SMALL), {"tokenizer.ggml.add_eos_token": True}
    )
    (root / "notes.gguf").write_bytes(b"this is not a GGUF file\n" * 10)
    out["junk"] = root / "notes.gguf"
    return out


@pytest.fixture(scope="module")
def target(llama, files):
    model = _load(llama, files["target"])
    yield model
    llama.llama_model_free(model)


def _extras(n: int) -> tuple[str, ...]:
    return tuple(f"<|extra_{i}|>" for i in range(n))


def _edited(path, fields: dict, rows: dict | None = None):
    """Rewrite scalar metadata (same type) and rows of ``output.weight`` in place."""
    from gguf import GGUFReader

    reader = GGUFReader(path, "r+")
    for key, value in fields.items():
        reader.fields[key].parts[-1][0] = value
    if rows:
        out = next(t for t in reader.tensors if t.name == "output.weight").data
        for row, values in rows.items():
            out[row] = values
        out.flush()
    del reader
    return path


def _load(llama, path):
    model = llama.llama_model_load_from_file(str(path).encode(), llama.llama_model_default_params())
    assert model
    return model


def greedy(llama, path, tokens, k) -> list[int]:
    """The model's argmax continuation of ``tokens``, one token per decode, in a fresh
    one-sequence context of a separately loaded copy of the model (EOG not special)."""
    model = _load(llama, path)
    cp = llama.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(64, len(tokens) + k)
    cp.n_seq_max, cp.n_threads, cp.n_threads_batch = 1, 1, 1
    ctx = llama.llama_init_from_model(model, cp)
    batch = llama.llama_batch_init(len(tokens), 0, 1)
    n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
    try:
        fill_batch(batch, tokens, range(len(tokens)), 0, [i == len(tokens) - 1 for i in range(len(tokens))])
        assert llama.llama_decode(ctx, batch) == 0
        out = []
        for pos in range(len(tokens), len(tokens) + k):
            logits = np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
            out.append(int(logits.argmax()))
            fill_batch(batch, [out[-1]], [pos], 0, True)
            assert llama.llama_decode(ctx, batch) == 0
        return out
    finally:
        llama.llama_batch_free(batch)
        llama.llama_free(ctx)
        llama.llama_model_free(model)


def until_eog(llama, path, tokens: list[int]) -> list[int]:
    model = _load(llama, path)
    vocab = llama.llama_model_get_vocab(model)
    try:
        for i, token in enumerate(tokens):
            if llama.llama_vocab_is_eog(vocab, token):
                return tokens[:i]
        return tokens
    finally:
        llama.llama_model_free(model)


def draft_model(llama, files, target, name="draft", **kw) -> DraftModel:
    kw = {"n_seq": 4, "n_ctx_per_seq": 64, "n_threads": 1, **kw}
    return DraftModel(llama, str(files[name]), target_model=target, target_path=str(files["target"]), **kw)


# --- proposals -----------------------------------------------------------------------------


class CountingLlama:
    """The llama_cpp module, with the rows of every ``llama_decode`` call written down."""

    def __init__(self, llama) -> None:
        self._llama, self.rows = llama, []

    def __getattr__(self, name):
        return getattr(self._llama, name)

    def llama_decode(self, ctx, batch):
        self.rows.append(batch.n_tokens)
        return self._llama.llama_decode(ctx, batch)


def test_batched_proposals_equal_the_drafts_own_greedy_continuation(llama, files, target):
    counting = CountingLlama(llama)
    dm = draft_model(counting, files, target)
    try:
        ks = [6, 2, 5, 1]  # seq 1 and 3 drop out of the batched steps early
        got = dm.propose([(seq, tokens, k) for seq, (tokens, k) in enumerate(zip(PROMPTS, ks))])
        want = [until_eog(llama, files["draft"], greedy(llama, files["draft"], t, k)) for t, k in zip(PROMPTS, ks)]
        assert got == want
        assert [len(g) for g in got] == ks  # the random draft meets no EOG here: full drafts
        # One call for the prompts, then one per draft step with a row for each sequence still drafting.
        assert counting.rows == [sum(map(len, PROMPTS)), 3, 2, 2, 2, 1]
        assert dm.seconds > 0
        # Asked again with the same tokens: the same answer (the KV already holds them).
        assert dm.propose([(2, PROMPTS[2], 5)]) == [want[2]]
    finally:
        dm.close()


def test_an_identical_copy_drafts_the_targets_own_continuation(llama, files, target):
    dm = draft_model(llama, files, target, name="copy")
    try:
        got = dm.propose([(0, PROMPTS[0], 6), (3, PROMPTS[1], 6)])
        assert got == [greedy(llama, files["target"], PROMPTS[0], 6), greedy(llama, files["target"], PROMPTS[1], 6)]
    finally:
        dm.close()


def test_kv_follows_accepted_prefixes_and_rejected_tails(llama, files, target):
    dm = draft_model(llama, files, target)
    try:
        first = dm.propose([(0, PROMPTS[0], 5), (1, PROMPTS[1], 5)])
        # seq 0: the target kept 2 drafts and then chose another token; seq 1: all 5 and a bonus token.
        wrong = (first[0][2] + 1) % 300 + 5
        seq0 = PROMPTS[0] + first[0][:2] + [wrong]
        seq1 = PROMPTS[1] + first[1] + [77]
        second = dm.propose([(0, seq0, 4), (1, seq1, 4)])
        assert second == [greedy(llama, files["draft"], seq0, 4), greedy(llama, files["draft"], seq1, 4)]
        assert dm._held[0] == seq0 + second[0][:-1]  # noqa: SLF001 - the prefix was kept, the rest dropped
        # A new request in slot 0 that shares only the BOS, and one shorter than what the KV holds.
        for tokens in ([1, 250, 251], PROMPTS[0][:3]):
            assert dm.propose([(0, tokens, 3)]) == [greedy(llama, files["draft"], tokens, 3)]
    finally:
        dm.close()


def test_forget_drops_a_sequence(llama, files, target):
    dm = draft_model(llama, files, target)
    try:
        dm.propose([(0, PROMPTS[0], 3), (1, PROMPTS[1], 3)])
        dm.forget(0)
        dm.forget(2)  # never used: nothing to do
        assert 0 not in dm._held  # noqa: SLF001
        assert dm.propose([(0, PROMPTS[2], 3), (1, PROMPTS[1], 3)]) == [
            greedy(llama, files["draft"], PROMPTS[2], 3),
            greedy(llama, files["draft"], PROMPTS[1], 3),
        ]
    finally:
        dm.close()


@pytest.mark.parametrize("n_ctx", [32, 256])  # llama.cpp gives 256 a sequence either way: the limit asked for counts
def test_near_a_full_context_fewer_or_no_tokens(llama, files, target, n_ctx):
    dm = draft_model(llama, files, target, n_seq=2, n_ctx_per_seq=n_ctx)
    n = dm.n_ctx_per_seq
    assert n == n_ctx
    try:
        long = [1] + [(7 * i) % 300 + 5 for i in range(n + 5)]
        full = greedy(llama, files["draft"], long[: n - 2], 5)
        # The KV holds the tokens and all drafts but the last: n - 2 tokens leave room for 3.
        assert dm.propose([(0, long[: n - 2], 5), (1, long[:n], 5)]) == [
            full[:3],
            greedy(llama, files["draft"], long[:n], 1),
        ]
        assert dm.propose([(0, long[: n + 1], 5), (1, long[: n + 5], 5)]) == [[], []]
        assert dm.propose([(0, [], 3), (1, long[:4], 0)]) == [[], []]
    finally:
        dm.close()


def test_long_prompts_catch_up_in_chunks_of_the_batch(llama, files, target):
    dm = draft_model(llama, files, target, n_seq=4, n_batch=8, n_ctx_per_seq=64)
    try:
        prompts = [[1] + [(5 * i + s) % 300 + 5 for i in range(19 + 3 * s)] for s in range(3)]
        got = dm.propose([(s, p, 4) for s, p in enumerate(prompts)])
        assert got == [greedy(llama, files["draft"], p, 4) for p in prompts]
    finally:
        dm.close()


@pytest.mark.parametrize("stop", ["eog", "beyond_target_vocab"])
def test_a_draft_stops_at_eog_and_at_tokens_the_target_lacks(llama, files, target, tmp_path, stop):
    """The draft's output row for the stopping token becomes 1.05x the row of the token it
    would pick second, so it picks the stopping token there instead (and nowhere the
    second token's logit was not the largest, or negative)."""
    base = write_tiny_llama_gguf(tmp_path / "d.gguf", seed=2, extra_tokens=("<|x|>",), **SMALL)
    plain = greedy(llama, base, PROMPTS[0], 4)
    from gguf import GGUFReader

    rows = next(t for t in GGUFReader(base).tensors if t.name == "output.weight").data
    stop_id = 2 if stop == "eog" else rows.shape[0] - 1  # </s>, or <|x|> (id 414: the target has 414 tokens)
    _edited(base, {}, {stop_id: np.array(rows[plain[1]]) * 1.05})
    edited = greedy(llama, base, PROMPTS[0], 4)
    assert edited[:2] == [plain[0], stop_id]  # the edit did what it should
    dm = DraftModel(llama, str(base), target_model=target, n_seq=1, n_ctx_per_seq=64, n_threads=1)
    try:
        assert dm.propose([(0, PROMPTS[0], 4)]) == [edited[:1]]
    finally:
        dm.close()


def test_bad_calls_and_close(llama, files, target):
    dm = draft_model(llama, files, target, n_seq=2)
    with pytest.raises(ValueError, match="sequence 2"):
        dm.propose([(2, PROMPTS[0], 3)])
    with pytest.raises(ValueError, match="twice"):
        dm.propose([(0, PROMPTS[0], 3), (0, PROMPTS[1], 3)])
    dm.close()
    dm.close()
    dm.forget(0)
    with pytest.raises(RuntimeError, match="closed"):
        dm.propose([(0, PROMPTS[0], 3)])
    with pytest.raises(ConfigError, match="sequences"):
        draft_model(llama, files, target, n_seq=0)


# --- refusals -------------------------------------------------------------------------------


def test_a_few_extra_tokens_are_compatible(llama, files, target):
    dm = draft_model(llama, files, target, name="plus128", n_seq=1)
    try:
        assert len(dm.propose([(0, PROMPTS[0], 3)])[0]) <= 3
    finally:
        dm.close()


@pytest.mark.parametrize(
    "name, against, words",
    [
        ("plus129", "target", ["543 tokens", "414", "more than 128 apart"]),
        ("draft_y", "target_x", ["token 414", "<|y|>", "<|x|>"]),
        ("bos3", "target", ["BOS token id 3", "target's 1"]),
        ("add_eos", "target", ["add-EOS is True", "target's False"]),
    ],
)
def test_mismatched_vocabularies_are_refused_saying_what_differs(llama, files, name, against, words):
    other = _load(llama, files[against])
    try:
        with pytest.raises(ConfigError) as err:
            DraftModel(
                llama,
                str(files[name]),
                target_model=other,
                target_path=str(files[against]),
                n_seq=1,
                n_ctx_per_seq=64,
                n_threads=1,
            )
    finally:
        llama.llama_model_free(other)
    msg = err.value.message
    assert err.value.param == "draft" and err.value.hint
    assert str(files[name]) in msg and str(files[against]) in msg
    for word in words:
        assert word in msg


def test_vocab_rules_on_made_up_facts():
    texts = {i: f"t{i}".encode() for i in range(300)}
    base = VocabFacts(kind=1, add_bos=True, bos=1, add_eos=False, eos=2, n_tokens=300, text=texts.__getitem__)

    def draft(**kw):
        return VocabFacts(**{**base.__dict__, **kw})

    assert vocab_difference(base, draft()) is None
    assert vocab_difference(base, draft(eos=7)) is None  # EOS ids only count when EOS is added
    assert vocab_difference(base, draft(text=lambda t: b"x" if t < 5 else texts[t])) is None  # ids 0-4 unchecked
    assert "vocabulary type 2" in vocab_difference(base, draft(kind=2))
    both = dict(add_eos=True)
    assert "EOS token id 7" in vocab_difference(VocabFacts(**{**base.__dict__, **both}), draft(eos=7, **both))
    assert "add-BOS is False" in vocab_difference(base, draft(add_bos=False))
    assert vocab_difference(base, draft(n_tokens=172)) is None  # 128 apart: still close enough
    assert "more than 128" in vocab_difference(base, draft(n_tokens=171))
    assert "token 5 is 'x'" in vocab_difference(base, draft(text=lambda t: b"x" if t == 5 else texts[t]))


@pytest.mark.parametrize("name", ["junk", "missing"])
def test_a_file_that_is_no_model_is_refused(llama, files, target, name):
    path = str(files.get(name, files["target"].parent / "missing.gguf"))
    with pytest.raises(InvalidModelFile) as err:
        DraftModel(llama, path, target_model=target, n_seq=1, n_ctx_per_seq=64, n_threads=1)
    assert path in err.value.message and err.value.param == "draft"


# --- finding the draft beside a model ---------------------------------------------------------


def test_quant_bits():
    assert [
        quant_bits(p)
        for p in (
            "a/M-Q4_K_M.gguf",
            "M-F16.gguf",
            "M.gguf",
            "M.Q8_0-00001-of-00002.gguf",
            "M-DRAFT-0.5B-Q5_1.gguf",
            "M-IQ3_XS.gguf",
        )
    ] == [4, 16, 0, 8, 5, 3]


@pytest.mark.parametrize(
    "listing, primary, tag, expected",
    [
        (["M-Q4_K_M.gguf", "M-Q8_0.gguf", "README.md"], "M-Q4_K_M.gguf", None, None),  # no draft at all
        (["M-Q4_K_M.gguf", "M-DRAFT-0.5B-Q4_0.gguf"], "M-Q4_K_M.gguf", None, "M-DRAFT-0.5B-Q4_0.gguf"),
        (["M-Q4_K_M.gguf", "m-draft-q4_0.GGUF", "Draft.txt"], "M-Q4_K_M.gguf", None, "m-draft-q4_0.GGUF"),  # any case
        # Only the model's folder or one above it; the deepest wins, even over a better quant.
        (["q4/M-Q4_K_M.gguf", "q4/sub/M-draft-Q4_0.gguf", "q8/M-draft-Q4_0.gguf"], "q4/M-Q4_K_M.gguf", None, None),
        (
            ["a/b/M-Q4_K_M.gguf", "M-draft-Q4_0.gguf", "a/M-draft-F16.gguf"],
            "a/b/M-Q4_K_M.gguf",
            None,
            "a/M-draft-F16.gguf",
        ),
        (
            ["a/b/M-Q4_K_M.gguf", "M-draft-Q4_0.gguf", "a/x/M-draft-Q4_0.gguf"],
            "a/b/M-Q4_K_M.gguf",
            None,
            "M-draft-Q4_0.gguf",
        ),
        # Closest bit count to the primary's quant (5 here), ties to the first name.
        (
            ["M-Q5_K_M.gguf", "D-draft-Q8_0.gguf", "D-draft-F16.gguf", "D-draft-Q4_0.gguf", "D-draft-Q6_K.gguf"],
            "M-Q5_K_M.gguf",
            None,
            "D-draft-Q4_0.gguf",
        ),
        # A tag: an exact -TAG. first, then the closest bits to the tag's.
        (
            ["M-Q4_K_M.gguf", "D-draft-Q4_0.gguf", "D-draft-Q4_K_M.gguf"],
            "M-Q4_K_M.gguf",
            "q4_k_m",
            "D-draft-Q4_K_M.gguf",
        ),
        (["M-Q4_K_M.gguf", "D-draft-Q4_0.gguf", "D-draft-Q6_K.gguf"], "M-Q4_K_M.gguf", "Q8_0", "D-draft-Q6_K.gguf"),
        # Split drafts: the first part (its -TAG counts); the primary's own parts are never its draft.
        (
            [
                "M-Q4_K_M.gguf",
                "D-draft-Q4_K_M-00002-of-00002.gguf",
                "D-draft-Q4_K_M-00001-of-00002.gguf",
                "D-draft-Q2_K.gguf",
            ],
            "M-Q4_K_M.gguf",
            "Q4_K_M",
            "D-draft-Q4_K_M-00001-of-00002.gguf",
        ),
        (["M-draft-00001-of-00002.gguf", "M-draft-00002-of-00002.gguf"], "M-draft-00001-of-00002.gguf", None, None),
        # Sidecars stay sidecars.
        (["M-Q4_K_M.gguf", "mmproj-draft-F16.gguf", "draft.imatrix.gguf"], "M-Q4_K_M.gguf", None, None),
    ],
)
def test_find_draft_sibling(listing, primary, tag, expected):
    assert find_draft_sibling(listing, primary, tag) == expected


def test_a_repo_means_its_model_not_its_draft():
    listing = ["Model-DRAFT-0.5B-Q4_0.gguf", "Model-Q4_0.gguf", "Model-Q4_K_M.gguf"]
    assert select_files(HubRef("o/r"), listing).primary == "Model-Q4_K_M.gguf"
    assert select_files(HubRef("o/r", quant="Q4_0"), listing).primary == "Model-Q4_0.gguf"
    with pytest.raises(ModelNotFound, match="draft models: Model-DRAFT-0.5B-Q4_0.gguf"):
        select_files(HubRef("o/r", quant="Q4_0"), listing[::2])
    drafts_only = ["R1-DRAFT-0.5B-Q4_0.gguf", "R1-DRAFT-0.5B-Q8_0.gguf"]
    assert select_files(HubRef("o/r"), drafts_only).primary == "R1-DRAFT-0.5B-Q8_0.gguf"
    assert select_files(HubRef("o/r", file="Model-DRAFT-0.5B-Q4_0.gguf"), listing).primary == listing[0]


def test_find_draft_file_on_disk(tmp_path):
    snap = tmp_path / "snapshot"
    for rel in ("q4/M-Q4_K_M.gguf", "M-draft-Q8_0.gguf", "q4/sub/M-draft-Q4_0.gguf", "q4/notes-draft.txt"):
        (snap / rel).parent.mkdir(parents=True, exist_ok=True)
        (snap / rel).write_bytes(b"GGUF")
    (tmp_path / "M-draft-Q4_0.gguf").write_bytes(b"GGUF")  # above the root: never looked at
    model = snap / "q4" / "M-Q4_K_M.gguf"
    assert find_draft_file(model) is None  # the model's folder alone has none
    assert find_draft_file(model, root=snap) == snap / "M-draft-Q8_0.gguf"
    (snap / "q4" / "M-draft-Q6_K.gguf").write_bytes(b"GGUF")
    assert find_draft_file(model) == snap / "q4" / "M-draft-Q6_K.gguf"
    with pytest.raises(ConfigError, match="not inside"):
        find_draft_file(model, root=tmp_path / "elsewhere")


def test_shared_prefix_agrees_with_the_plain_loop():
    import random

    from localrun.runtimes.llamacpp.decode import common_prefix
    from localrun.runtimes.llamacpp.speculative.draft_model import shared_prefix

    rng = random.Random(5)
    for _ in range(300):
        a = [rng.randrange(3) for _ in range(rng.randrange(0, 200))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(3) for _ in range(rng.randrange(0, 50))]
        assert shared_prefix(a, b) == common_prefix(a, b) == shared_prefix(b, a)
