"""``python -m trainer.eval``: see ``trainer.entry.eval_main``."""

from trainer.entry import eval_main

if __name__ == "__main__":
    raise SystemExit(eval_main())
