"""``python -m trainer.export``: see ``trainer.entry.export_main``."""

from trainer.entry import export_main

if __name__ == "__main__":
    raise SystemExit(export_main())
