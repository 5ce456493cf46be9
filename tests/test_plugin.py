"""The pytest plugin, from a project's point of view: a limit too low fails, a generous one
passes, a misspelt strategy fails with one line."""

pytest_plugins = ["pytester"]

PROJECT_TESTS = '''
import pytest

CONFIG = dict(model="tiny-e2b", target="cpu", seq=256, batch=1, strategy="checkpoint")


@pytest.mark.memprobe_limit("1MiB", **CONFIG)
def test_too_low():
    pass


@pytest.mark.memprobe_limit("1GiB", **CONFIG)
def test_generous():
    pass


@pytest.mark.memprobe_limit("1GiB", **{**CONFIG, "strategy": "scan-chekpoint"})
def test_misspelt():
    pass


@pytest.mark.memprobe_limit("0GiB", **CONFIG)
def test_zero_limit():
    pass


@pytest.mark.memprobe_limit(2**30, **CONFIG)
def test_bytes_as_an_int():
    pass


@pytest.mark.memprobe_limit("90", **CONFIG)
def test_no_unit():
    pass


def test_fixture(memprobe_measure):
    m = memprobe_measure(**CONFIG)
    assert m.ok and 1 * 2**20 < m.peak_bytes < 2**30
'''


def test_limit_marker_fails_too_low_and_passes_generous(pytester):
    pytester.makepyfile(test_project=PROJECT_TESTS)
    # The plugin is found through its pytest11 entry point, as in any project that installs memprobe.
    r = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=")
    r.assert_outcomes(passed=3, failed=4)
    # The limit as written and in bytes (it read "the limit 0.001 GiB" for 1MiB).
    r.stdout.fnmatch_lines(["*_ test_too_low _*",
                            "memprobe: tiny-e2b checkpoint on cpu: per-device peak * GiB (* bytes) exceeds "
                            "the limit 1MiB (1,048,576 bytes) by * bytes (compiler estimate)"])
    # Bad configuration: the one line, no chained traceback around it.
    r.stdout.fnmatch_lines(["*_ test_misspelt _*",
                            "memprobe_limit: unknown strategy 'scan-chekpoint' (did you mean 'scan-checkpoint'?*"])
    # A limit of nothing is refused, not compiled and failed (it failed every peak).
    r.stdout.fnmatch_lines(["*_ test_zero_limit _*",
                            "memprobe_limit: the limit must be a positive size, got '0GiB'"])
    # An int counts bytes, as it does in Python; a string with no unit was 90 bytes and failed after compiling.
    r.stdout.fnmatch_lines(["*_ test_no_unit _*",
                            "memprobe_limit: the limit: '90' has no unit: a size like 90GiB or 90GB (90B for bytes)"])
    assert "During handling of the above exception" not in r.stdout.str()


def test_a_program_the_tpu_compiler_refuses_fails_the_limit_saying_what_it_needed(pytester):
    # A 3-million-token vocabulary on one v5e device: libtpu refuses the program over HBM
    # (as in test_fit). The limit fails with the compiler's own total, not "failed to compile".
    pytester.makefile(".toml", vocab3m='description = "tiny-e2b, 3M vocabulary"\nbase = "tiny-e2b"\n'
                                       'vocab_size = 3000000\n')
    pytester.makepyfile(test_refused='''
import pytest

@pytest.mark.memprobe_limit("15GiB", model="vocab3m.toml", target="v5e", devices=1, seq=512, batch=1,
                            strategy="unrolled")
def test_fits():
    pass
''')
    r = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=")
    r.assert_outcomes(failed=1)
    r.stdout.fnmatch_lines(["memprobe: vocab3m unrolled on v5e:1x1: over HBM: the TPU compiler needed * GiB "
                            "(* bytes) of 15.75 GiB and refused the program (*Invalid TPU program.)*(the limit is 15GiB)"])
    assert "failed to compile" not in r.stdout.str()
