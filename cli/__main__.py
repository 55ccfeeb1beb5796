"""``python -m cli``: the ``recpipe`` command."""

from cli.main import main

raise SystemExit(main())
