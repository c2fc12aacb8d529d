"""The llama.cpp calls behind prefix reuse and sampling, against a stand-in for llama.cpp:
the sliding-window rule, whole-sequence copies, cutting a sequence, the sampler chain.
(The cache's decisions built on them are in tests/batching/test_prefix.py.)"""

from __future__ import annotations

from localrun.runtimes.llamacpp.cache.prefix import PrefixCache
from localrun.runtimes.llamacpp.cache.slots import LlamaKvOps, chunk_size
from localrun.runtimes.llamacpp.decode import ChainSampler, build_sampler, common_prefix
from localrun.types import Sampling


class _Lib:
    """Records what the code asks of llama.cpp's memory and sampler API."""

    LLAMA_DEFAULT_SEED = 0xFFFFFFFF

    def __init__(self, pos_min: int = 0, rm_ok: bool = True) -> None:
        self.pos_min, self.rm_ok = pos_min, rm_ok
        self.calls: list[tuple] = []

    def llama_get_memory(self, ctx):
        return "mem"

    def llama_memory_seq_pos_min(self, mem, seq):
        return self.pos_min

    def llama_memory_seq_rm(self, mem, seq, p0, p1):
        self.calls.append(("seq_rm", seq, p0, p1))
        return self.rm_ok or p0 < 0  # removing a whole sequence never fails

    def llama_memory_seq_cp(self, mem, src, dst, p0, p1):
        self.calls.append(("seq_cp", src, dst, p0, p1))

    def __getattr__(self, name):  # sampler constructors: record the stage
        if name.startswith("llama_sampler_init_"):
            return lambda *args: (name[len("llama_sampler_init_") :], args)
        raise AttributeError(name)

    def llama_sampler_chain_default_params(self):
        return type("P", (), {"no_perf": False})()

    def llama_sampler_chain_init(self, params):
        return []

    def llama_sampler_chain_add(self, chain, stage):
        chain.append(stage)

    def llama_sampler_sample(self, chain, ctx, index):
        self.calls.append(("sample", index))
        return 42

    def llama_sampler_free(self, chain):
        self.calls.append(("free",))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([1, 2], [1, 2]) == 2


def test_a_sliding_window_already_overwritten_refuses_the_prefix():
    ops = LlamaKvOps(_Lib(pos_min=600), "ctx", n_swa=512)  # the window cache lost positions before 600
    assert not ops.window_ok(0, 900)  # 900 - 512 = 388 < 600: the window is gone
    ops = LlamaKvOps(_Lib(pos_min=300), "ctx", n_swa=512)
    assert ops.window_ok(0, 900)  # 388 >= 300: the window is all there
    assert LlamaKvOps(_Lib(pos_min=5000), "ctx", n_swa=0).window_ok(0, 10)  # no sliding window: always
    assert not LlamaKvOps(_Lib(pos_min=-1), "ctx", n_swa=512).window_ok(0, 10)  # an empty sequence


def test_cutting_copying_and_clearing_are_the_right_memory_calls():
    lib = _Lib()
    ops = LlamaKvOps(lib, "ctx", n_swa=0)
    assert ops.truncate(2, 60)
    ops.copy(0, 3)
    ops.clear(1)
    # across KV streams llama.cpp copies whole sequences only: clear the target, copy all
    assert lib.calls == [("seq_rm", 2, 60, -1), ("seq_rm", 3, -1, -1), ("seq_cp", 0, 3, -1, -1), ("seq_rm", 1, -1, -1)]


def test_memory_that_cannot_cut_a_sequence_is_cleared():
    lib = _Lib(rm_ok=False)
    cache = PrefixCache(1, LlamaKvOps(lib, "ctx", n_swa=0))
    slot, _ = cache.acquire(list(range(50)))
    slot.tokens.extend(range(50))
    cache.release(slot)
    slot, keep = cache.acquire(list(range(40)) + [999])  # a real token: negative ids are media (media_prompt.py)
    assert keep == 0 and slot.tokens == []
    assert lib.calls[-2:] == [("seq_rm", 0, 40, -1), ("seq_rm", 0, -1, -1)]


def test_prefill_chunks_never_leave_a_short_tail():
    assert chunk_size(100, 256, 8) == 100
    assert chunk_size(300, 256, 8) == 256  # 44 left
    assert chunk_size(260, 256, 8) == 252  # not 256 + 4: the tail keeps 8
    assert chunk_size(5, 256, 8) == 5  # a whole short prompt is one chunk
    assert chunk_size(260, 256, 1) == 256
    left, sizes = 1000, []
    while left:
        sizes.append(chunk_size(left, 64, 8))
        left -= sizes[-1]
    assert sum(sizes) == 1000 and min(sizes) >= 8 and max(sizes) <= 64


def test_greedy_is_one_stage_and_sampling_the_usual_chain():
    lib = _Lib()
    assert [s[0] for s in build_sampler(lib, Sampling(temperature=0.0), 100)] == ["greedy"]
    chain = build_sampler(
        lib, Sampling(temperature=0.7, top_k=5, top_p=0.9, min_p=0.1, seed=7, repeat_penalty=1.1), 100
    )
    assert [s[0] for s in chain] == ["penalties", "top_k", "top_p", "min_p", "temp", "dist"]
    assert chain[-1][1] == (7,)
    unseeded = build_sampler(lib, Sampling(temperature=0.7, seed=None), 100)
    assert unseeded[-1] == ("dist", (lib.LLAMA_DEFAULT_SEED,))


def test_chain_sampler_samples_and_frees_once():
    lib = _Lib()
    s = ChainSampler(lib, ["greedy"])
    assert s.sample("ctx", 3) == 42
    s.free()
    s.free()
    assert lib.calls == [("sample", 3), ("free",)]
