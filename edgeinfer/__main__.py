from __future__ import annotations

from edgeinfer.cli.main import main

raise SystemExit(main())
