"""What `pip install memprobe` (not editable) gets: the package and its built-in strategies."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_wheel_carries_the_builtin_strategies(tmp_path):
    # A wheel once held the code and no strategy file, so an installed memprobe knew no
    # strategy ("unknown strategy 'unrolled' (known: )"). Build one from a copy of the sources
    # (offline: the venv's setuptools) and run it away from any checkout.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("memprobe", "strategies"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    [wheel] = (tmp_path / "dist").glob("memprobe-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)

    # pyproject lists the packages by name (the strategies are mapped in): a new subpackage
    # left off that list would be missing from every install.
    def packages(top: Path) -> set[str]:
        return {str(p.parent.relative_to(top)) for p in top.glob("memprobe/**/__init__.py")}
    assert packages(site) == packages(ROOT)

    env = {**os.environ, "PYTHONPATH": str(site)}
    where = subprocess.run([sys.executable, "-c", "import memprobe.strategy as s; print(s.builtin_dir())"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout.strip()
    assert where == str(site / "memprobe" / "strategies")
    shipped = sorted(p.name for p in Path(where).glob("*.toml"))
    assert shipped == sorted(p.name for p in (ROOT / "strategies").glob("*.toml"))

    r = subprocess.run([sys.executable, "-m", "memprobe", "strategies"], cwd=tmp_path, env={**env, "COLUMNS": "250"},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for name in shipped:
        assert f"│ {Path(name).stem} " in r.stdout, name
