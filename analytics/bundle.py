"""`python -m analytics.bundle OUT.zip`: the package as the zip spark-submit ships (`--py-files`).

One way to build it, used by `make audit-zip` and by the audit's container image: every `.py` and
`.properties` file of the package, in a stable order.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def build(out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(PACKAGE.iterdir()):
            if path.suffix in (".py", ".properties"):
                bundle.write(path, f"analytics/{path.name}")


if __name__ == "__main__":
    build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist/analytics.zip"))
