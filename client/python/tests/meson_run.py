"""Entry point of the meson test `python` (tests/meson.build): runs the pytest suite of the
Python client against the build tree's ps-server and libpsclient (PSD_SERVER, PSD_LIBRARY).
Exits 77 (meson's "skipped") with a message when NumPy or pytest is missing; deploy/setup.sh
installs both (python3-numpy, python3-pytest)."""

import os
import shutil
import sys

missing = []
for mod in ("numpy", "pytest"):
    try:
        __import__(mod)
    except ImportError:
        missing.append(mod)
if missing:
    print(f"SKIP: {sys.executable} has no {' and no '.join(missing)} (Debian: apt-get install "
          f"python3-numpy python3-pytest, as deploy/setup.sh does)", file=sys.stderr)
    sys.exit(77)

if not os.environ.get("PSD_LIBRARY"):
    print("PSD_LIBRARY is not set", file=sys.stderr)
    sys.exit(2)
if not os.environ.get("PSD_SERVER") and shutil.which("ps-server") is None:
    print("PSD_SERVER is not set and no ps-server is on PATH", file=sys.stderr)
    sys.exit(2)

sys.dont_write_bytecode = True  # leave no __pycache__ in the source tree
os.environ["PYTHONDONTWRITEBYTECODE"] = "1"  # nor do the interpreters the tests start
import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-p", "no:cacheprovider", "-q", "-rs", here, *sys.argv[1:]]))
