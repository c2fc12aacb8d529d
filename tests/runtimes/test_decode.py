"""The decoder's prefix-reuse rule, against a stand-in for llama.cpp's memory calls."""

from __future__ import annotations

from localrun.runtimes.llamacpp_decode import SequenceDecoder, common_prefix


class _Memory:
    """Records what the decoder asks of llama.cpp's memory API."""

    def __init__(self, pos_min: int = 0, rm_ok: bool = True) -> None:
        self.pos_min, self.rm_ok = pos_min, rm_ok
        self.calls: list[tuple] = []

    def llama_get_memory(self, ctx):
        return "mem"

    def llama_batch_init(self, n, embd, n_seq):
        return object()

    def llama_batch_free(self, batch):
        self.calls.append(("batch_free",))

    def llama_memory_seq_pos_min(self, mem, seq):
        return self.pos_min

    def llama_memory_seq_rm(self, mem, seq, p0, p1):
        self.calls.append(("seq_rm", seq, p0, p1))
        return self.rm_ok

    def llama_memory_clear(self, mem, data):
        self.calls.append(("clear",))


def _decoder(lib, cached: int, n_swa: int = 0) -> SequenceDecoder:
    d = SequenceDecoder(lib, "ctx", n_batch=64, n_swa=n_swa)
    d.tokens = list(range(cached))
    return d


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_keeps_the_shared_prefix_and_drops_the_tail():
    lib = _Memory()
    d = _decoder(lib, 100)
    assert d.reuse_prefix(list(range(60)) + [999, 998]) == 60
    assert lib.calls == [("seq_rm", 0, 60, -1)]
    assert d.tokens == list(range(60))


def test_an_identical_prompt_leaves_its_last_token_to_evaluate():
    lib = _Memory()
    d = _decoder(lib, 10)
    assert d.reuse_prefix(list(range(10))) == 9


def test_a_sliding_window_already_overwritten_forces_a_full_prefill():
    lib = _Memory(pos_min=600)  # the window cache lost positions before 600
    d = _decoder(lib, 1000, n_swa=512)
    assert d.reuse_prefix(list(range(900)) + [-1]) == 0  # 900 - 512 = 388 < 600: the window is gone
    assert ("clear",) in lib.calls and d.tokens == []
    lib = _Memory(pos_min=300)
    d = _decoder(lib, 1000, n_swa=512)
    assert d.reuse_prefix(list(range(900)) + [-1]) == 900  # 388 >= 300: the window is all there


def test_memory_that_cannot_cut_a_sequence_is_cleared():
    lib = _Memory(rm_ok=False)
    d = _decoder(lib, 50)
    assert d.reuse_prefix(list(range(40)) + [-1]) == 0
    assert lib.calls[-1] == ("clear",) and d.tokens == []
