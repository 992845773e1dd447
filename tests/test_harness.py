"""The leak checks in conftest.py catch a test that leaves a child process or a thread
running.

Each case runs an inner pytest session (``pytester``, in a subprocess) whose conftest is
this suite's own conftest.py, so the check under test is the real one.
"""

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    return pytester


@pytest.mark.timeout(60)
def test_leaked_child_fails_the_test(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import subprocess

        LEAKED = []

        def test_leaks():
            LEAKED.append(subprocess.Popen(["sleep", "30"]))
        """
    )
    result = inner.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*test leaked 1 child process(es)*", "*pid *: sleep 30*"])


@pytest.mark.timeout(60)
def test_waited_child_passes(inner: pytest.Pytester) -> None:
    inner.makepyfile(
        """
        import subprocess

        def test_waits():
            with subprocess.Popen(["sleep", "0"]) as proc:
                assert proc.wait(timeout=10) == 0
        """
    )
    result = inner.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1)


@pytest.mark.timeout(60)
def test_leaked_thread_fails_the_test_and_the_session_still_exits(
    inner: pytest.Pytester,
) -> None:
    inner.makepyfile(
        """
        import threading

        STOP = threading.Event()

        def test_leaks_a_thread():
            threading.Thread(target=STOP.wait, name="stuck-forever").start()
        """
    )
    result = inner.runpytest_subprocess(timeout=50)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*left 1 non-daemon thread(s) running*stuck-forever*"])
    result.stderr.fnmatch_lines(["*non-daemon thread(s) still running*stuck-forever*"])
