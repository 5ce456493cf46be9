"""The pytest plugin, from a project's point of view: a limit too low fails, a generous one passes."""

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


def test_fixture(memprobe_measure):
    m = memprobe_measure(**CONFIG)
    assert m.ok and 1 * 2**20 < m.peak_bytes < 2**30
'''


def test_limit_marker_fails_too_low_and_passes_generous(pytester):
    pytester.makepyfile(test_project=PROJECT_TESTS)
    # The plugin is found through its pytest11 entry point, as in any project that installs memprobe.
    r = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=")
    r.assert_outcomes(passed=2, failed=1)
    r.stdout.fnmatch_lines(["*_ test_too_low _*",
                            "memprobe: tiny-e2b checkpoint on cpu: per-device peak * GiB (* bytes) exceeds "
                            "the limit 0.001 GiB (compiler estimate)"])
