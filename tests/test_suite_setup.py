"""The suite's own set-up: pytest-xdist keeps a group on one worker (pyproject's addopts run the
suite on two workers with --dist loadgroup; the whole-machine files and each test file's module
fixtures rely on it), and conftest puts every test into the group it should run in."""
from __future__ import annotations

import re
import subprocess
import sys


def test_a_group_runs_on_one_worker_with_the_installed_pytest_and_xdist(tmp_path):
    """pytest 9.2 silently broke --dist loadgroup (pytest-xdist issue 1386): tests of one group
    were spread over the workers, and the browser tests, which share one page, failed."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text('import pytest\npytestmark = pytest.mark.xdist_group("g")\n'
                                     + "".join(f"def test_{i}():\n    pass\n" for i in range(4)))
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120).stdout
    ran = re.findall(r"\[(gw\d)\] .*PASSED (test_\w\.py::test_\d)@g", out)
    assert len(ran) == 8 and len({worker for worker, _ in ran}) == 1, out[-3000:]


def test_every_test_has_its_group(request):
    """Each file is a group of its own except conftest's SPREAD files; whole-machine files share one."""
    from conftest import SPREAD

    groups = {}
    for item in request.session.items:
        module = item.module.__name__
        marks = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert len(marks) <= 1, item.nodeid
        groups.setdefault(module, set()).update(marks)
    for module, names in groups.items():
        if module in SPREAD:
            assert not names, module
        elif module in ("test_faults_memory", "test_loadtest", "test_explorer_browser", "test_docker_smoke", "test_quickstart"):
            assert names == {"whole_machine"}, module
        else:
            assert names == {module}, module
    if getattr(request.config.option, "loadgroup", False):  # on a pytest-xdist worker under --dist loadgroup
        assert request.node.nodeid.endswith("@test_suite_setup")
