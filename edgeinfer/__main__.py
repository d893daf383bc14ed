from __future__ import annotations

from edgeinfer.cli import main

raise SystemExit(main())
