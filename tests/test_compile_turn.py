"""Turns on one kernel's compile among processes (runtime/cache.py): workers that need one new
kernel at once compile it one after the other, so that the second reads the first's result;
workers compiling different kernels do not wait for each other."""
import multiprocessing
import zlib

from kiln.runtime.cache import TURN_FILES, compile_turn


def _first(name: str, first_in, second_trying, second_in, wait_s: float, result) -> None:
    """Holds `name`'s turn until the second process gets its own (or wait_s after it tries)."""
    with compile_turn(name):
        first_in.set()
        second_trying.wait(60)
        result.put(second_in.wait(wait_s))


def _second(name: str, first_in, second_trying, second_in) -> None:
    first_in.wait(60)
    second_trying.set()
    with compile_turn(name):
        second_in.set()


def _second_got_in_while_first_held(first_name: str, second_name: str, wait_s: float) -> bool:
    # fork: a spawned child would import this test module by a name that depends on the checkout's
    # directory (CI's is not "kiln")
    context = multiprocessing.get_context("fork")
    first_in, second_trying, second_in = context.Event(), context.Event(), context.Event()
    result = context.Queue()
    processes = [context.Process(target=_first, args=(first_name, first_in, second_trying, second_in, wait_s, result)),
                 context.Process(target=_second, args=(second_name, first_in, second_trying, second_in))]
    for p in processes:
        p.start()
    held = result.get(timeout=120)
    for p in processes:
        p.join(60)
    return held


def test_a_second_process_waits_for_the_first_ones_compile_of_the_same_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    assert not _second_got_in_while_first_held("k_0123abcd", "k_0123abcd", wait_s=1.0)


def test_processes_compiling_different_kernels_do_not_wait(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", str(tmp_path))
    other = next(n for n in (f"k_{i:08x}" for i in range(100))
                 if zlib.crc32(n.encode()) % TURN_FILES != zlib.crc32(b"k_0123abcd") % TURN_FILES)
    assert _second_got_in_while_first_held("k_0123abcd", other, wait_s=60)
